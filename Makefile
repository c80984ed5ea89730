# partner-intake. The two commands a newcomer needs: `make demo`, `make test`.
GO ?= go
export GOTOOLCHAIN ?= local

.PHONY: demo test deps build vet fmt-check alerts-test fuzz-smoke bench bench-smoke static package image chart package-test image-test chart-test

# What a package, image or chart carries: the version (a v-tag, else
# 0.1.0~git<YYYYMMDDHHMMSS>.<commit>, the commit's time in UTC first so
# that dpkg orders snapshots by time, each below 0.1.0 itself), the commit,
# and the pinned tools run with `go run` (built once, then kept in the Go
# build cache).
VERSION ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null); if [ -n "$$v" ]; then echo "$${v\#v}"; else echo "0.1.0~git$$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S 2>/dev/null || echo 0).$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"; fi)
COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
ARCH ?= $(shell $(GO) env GOARCH)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
NFPM ?= github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
HELM ?= helm.sh/helm/v3/cmd/helm@v3.22.0
IMAGE ?= localhost/intake:$(subst ~,-,$(subst +,-,$(VERSION)))
export VERSION COMMIT ARCH NFPM HELM IMAGE
# The Helm chart's default image (deploy/helm/intake: image.repository,
# tag = the chart's appVersion): `make image` tags what it builds so too,
# so the chart installed with its defaults runs the image last built here.
CHART_IMAGE ?= localhost/intake:$(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' deploy/helm/intake/Chart.yaml)

## demo: run `intake demo` (throwaway PostgreSQL, in-process SFTP site, example partners and files);
## the demo is linked only under the demo build tag, never into the daemon a host runs
demo:
	@bash .ci/deps.sh demo
	$(GO) run -tags demo ./cmd/intake demo

## test: gofmt, go vet, the alert rules (promtool) and every test with the race detector, on real PostgreSQL and OpenSSH;
## the tests build with the faults tag (the fault hook the crash tests arm: internal/fault), which no release build has
test: deps fmt-check vet alerts-test
	$(GO) test -race -count=1 -timeout 15m -tags faults ./...
	$(GO) test -count=1 ./internal/fault
	$(GO) vet -tags demo ./cmd/intake
	@bash .ci/nodemo.sh
	$(MAKE) fuzz-smoke
	$(MAKE) bench-smoke
	$(MAKE) package-test
	$(MAKE) image-test
	$(MAKE) chart-test

## static: the static daemon binary a package or image carries (bin/intake: CGO_ENABLED=0, -trimpath, version via ldflags)
static:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/intake ./cmd/intake

## package: dist/intake_<version>_<arch>.deb (nfpm): the binary, /etc/intake/, a hardened systemd unit, its own system user,
## bash and zsh completion, the copyright file
package: static
	@mkdir -p dist/completion
	bin/intake completion bash >dist/completion/intake.bash
	bin/intake completion zsh >dist/completion/_intake
	$(GO) run $(NFPM) package --config packaging/nfpm.yaml --packager deb --target dist/

## image: the container image $(IMAGE) (podman, FROM scratch, non-root, spool volume), also tagged $(CHART_IMAGE), the chart's default
image: static
	@bash .ci/image-build.sh
	podman tag $(IMAGE) $(CHART_IMAGE)

## package-test: systemd-analyze verify on the unit, dpkg -i, intake version, dpkg -r and -P (as root)
package-test: package
	@bash .ci/package-test.sh

## image-test: builds the image, checks its config and labels (podman image inspect), then runs its default command, HEALTHCHECK and version in a chroot of its own filesystem as its uid, empty environment (as root)
image-test: image
	@bash .ci/image-test.sh

## chart-test: helm lint and template of deploy/helm/intake, every rendered object decoded strictly
chart-test:
	@bash .ci/chart-test.sh

## bench: intake beside the naive scripted pipeline (1M and 5M rows, 1000 small files, a fleet of 1000 partners); writes bench-results.json
bench: deps
	$(GO) run ./cmd/intake-bench

## bench-smoke: the benchmark harness at a tiny size, for correctness only (no timing is judged)
bench-smoke: deps
	$(GO) run ./cmd/intake-bench -large-rows 20000 -huge-rows 30000 -small-files 40 -small-rows 10 -partners 4 -fleet-partners 20 -fleet-files 10 -fleet-poll 2s -fleet-window 3s -out /tmp/bench-smoke.json

## fuzz-smoke: a short run of each fuzz target beyond its committed seed corpus (FUZZTIME=100000x)
# A count, not a duration: Go 1.26's fuzz coordinator can fail a
# duration-bound run with a bare "context deadline exceeded" when a worker
# is slow to stop on a loaded machine (go.dev/issue/75804, fixed in Go
# 1.27); a count has no deadline to race. It failed CI from a fresh clone
# once (FuzzParseManifest: 0 execs/s for 8 s, no crasher written).
FUZZTIME ?= 100000x
fuzz-smoke:
	$(GO) test -run='^$$' -fuzz='^FuzzReader$$' -fuzztime=$(FUZZTIME) ./intake/rows
	$(GO) test -run='^$$' -fuzz='^FuzzParseManifest$$' -fuzztime=$(FUZZTIME) ./partners
	$(GO) test -run='^$$' -fuzz='^FuzzSafeName$$' -fuzztime=$(FUZZTIME) ./partners
	$(GO) test -run='^$$' -fuzz='^FuzzEveryCheckKeepsToItsRule$$' -fuzztime=$(FUZZTIME) ./internal/names

## alerts-test: promtool check and unit-test the Prometheus alert rules
alerts-test:
	@promtool=$$(bash .ci/promtool.sh) && cd configs/prometheus && \
	$$promtool check rules alerts.yml && $$promtool test rules alerts_test.yml

## deps: install what the tests start when missing: postgresql, openssh-server, openssh-sftp-server, openssh-client, the interop servers
## (proftpd-core, proftpd-mod-crypto, rclone), zsh, chromium (apt-get, as root); `make demo` installs only postgresql (.ci/deps.sh demo)
deps:
	@bash .ci/deps.sh

build:
	$(GO) build -o bin/intake ./cmd/intake

# vet both builds: the release build and the one with the switches the
# tests and the benchmark's profiling use (faults: INTAKE_FAULTS;
# cpuprofile: INTAKE_CPUPROFILE)
vet:
	$(GO) vet ./...
	$(GO) vet -tags faults,cpuprofile ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
