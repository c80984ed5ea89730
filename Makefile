# partner-intake. The two commands a newcomer needs: `make demo`, `make test`.
GO ?= go
export GOTOOLCHAIN ?= local

.PHONY: demo test deps build vet fmt-check alerts-test fuzz-smoke bench bench-smoke

## demo: run `intake demo` (throwaway PostgreSQL, in-process SFTP site, example partners and files);
## the demo is linked only under the demo build tag, never into the daemon a host runs
demo: deps
	$(GO) run -tags demo ./cmd/intake demo

## test: gofmt, go vet, the alert rules (promtool) and every test with the race detector, on real PostgreSQL and OpenSSH
test: deps fmt-check vet alerts-test
	$(GO) test -race -count=1 -timeout 15m ./...
	$(GO) vet -tags demo ./cmd/intake
	@bash .ci/nodemo.sh
	$(MAKE) fuzz-smoke
	$(MAKE) bench-smoke

## bench: intake beside the naive scripted pipeline (1M and 5M rows, 1000 small files); writes bench-results.json
bench: deps
	$(GO) run ./cmd/intake-bench

## bench-smoke: the benchmark harness at a tiny size, for correctness only (no timing is judged)
bench-smoke: deps
	$(GO) run ./cmd/intake-bench -large-rows 20000 -huge-rows 30000 -small-files 40 -small-rows 10 -partners 4 -out /tmp/bench-smoke.json

## fuzz-smoke: a short run of each fuzz target beyond its committed seed corpus (FUZZTIME=10s)
FUZZTIME ?= 10s
fuzz-smoke:
	$(GO) test -run='^$$' -fuzz='^FuzzReader$$' -fuzztime=$(FUZZTIME) ./intake/rows
	$(GO) test -run='^$$' -fuzz='^FuzzParseManifest$$' -fuzztime=$(FUZZTIME) ./intake
	$(GO) test -run='^$$' -fuzz='^FuzzSafeName$$' -fuzztime=$(FUZZTIME) ./intake

## alerts-test: promtool check and unit-test the Prometheus alert rules
alerts-test:
	@promtool=$$(bash .ci/promtool.sh) && cd configs/prometheus && \
	$$promtool check rules alerts.yml && $$promtool test rules alerts_test.yml

## deps: install postgresql and openssh-server when missing (apt-get, as root)
deps:
	@bash .ci/deps.sh

build:
	$(GO) build -o bin/intake ./cmd/intake

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
