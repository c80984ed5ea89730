#!/usr/bin/env bash
# Tests the Helm chart deploy/helm/intake with the
# pinned helm run through `go run` (built once, then cached):
#   - helm lint (strict; values checked against values.schema.json);
#   - helm package: the package (symlinks resolved) renders what the tree does;
#   - helm template with the ServiceMonitor, PrometheusRule and dashboard enabled,
#     every object decoded strictly by deploy/helm/chartcheck (its own Go
#     module: k8s.io/api stays out of the daemon's go.mod);
#   - the decoder can fail: a misspelt field in a copy of the render fails it;
#   - rendered with testdata/extras.yaml (extraEnv, envFrom, extraVolumes,
#     extraVolumeMounts, startupProbe), the container gets each, and every
#     variable and file the config names; without the extraEnv it fails;
#   - the chart's default image is one `make image` tags (make -n image);
#   - the chart refuses configs that cannot work in a StatefulSet, and
#     values its schema does not allow (a misspelt key among them);
#   - NOTES.txt names the pods, how to reach /metrics and /readyz, and the runbook.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HELM:=helm.sh/helm/v3/cmd/helm@v3.22.0}"
helm() { go run "$HELM" "$@" 2> >(grep -v 'found symbolic link in path' >&2); }
fail() { echo "chart-test: FAIL: $*" >&2; exit 1; }
chart=deploy/helm/intake
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }

all=(--set serviceMonitor.enabled=true --set prometheusRule.enabled=true --set grafanaDashboard.enabled=true)
helm lint --strict "$chart" "${all[@]}" >"$tmp/lint" ||
  { cat "$tmp/lint"; fail "helm lint"; }
ok "helm lint --strict"
helm template intake "$chart" >/dev/null || fail "helm template with the defaults"
helm template intake "$chart" "${all[@]}" >"$tmp/all.yaml"
ok "helm template (defaults; with ServiceMonitor, PrometheusRule and dashboard)"
helm package "$chart" -d "$tmp/pkg" >/dev/null || fail "helm package"
helm template intake "$tmp"/pkg/intake-*.tgz "${all[@]}" >"$tmp/packaged.yaml"
cmp -s "$tmp/all.yaml" "$tmp/packaged.yaml" || { diff "$tmp/all.yaml" "$tmp/packaged.yaml" | head -20; fail "the packaged chart renders otherwise"; }
ok "helm package carries the alerts and dashboard (symlinks resolved): the package renders the same"
extras=deploy/helm/chartcheck/testdata/extras.yaml
helm template intake "$chart" --set serviceMonitor.enabled=true --set prometheusRule.enabled=true -f "$extras" >"$tmp/extras.yaml"
export CHART_RENDERED_EXTRAS="$tmp/extras.yaml"
helm lint --strict "$chart" "${all[@]}" -f "$extras" >"$tmp/lint-extras" || { cat "$tmp/lint-extras"; fail "helm lint with $extras"; }
ok "helm lint --strict and helm template with the extras (testdata/extras.yaml)"

# What `make image` runs (printed, not run): the chart's default image must be among its tags.
make --no-print-directory -n image >"$tmp/make-image.txt"
export MAKE_IMAGE_N="$tmp/make-image.txt"
go build -o "$tmp/intake" ./cmd/intake
export INTAKE_BIN="$tmp/intake"
(cd deploy/helm/chartcheck && CHART_RENDERED="$tmp/all.yaml" go test -count=1 .) || fail "strict decode of the rendered chart"
ok "every rendered object decodes strictly; the daemon validates the rendered config"
sed 's/terminationGracePeriodSeconds:/terminationGracePeriodSecond:/' "$tmp/all.yaml" >"$tmp/typo.yaml"
if (cd deploy/helm/chartcheck && CHART_RENDERED="$tmp/typo.yaml" go test -count=1 . >"$tmp/typo.out" 2>&1); then
  fail "a misspelt field passed the strict decode"
fi
grep -q 'unknown field "terminationGracePeriodSecond"' "$tmp/typo.out" || { cat "$tmp/typo.out"; fail "the typo was not named"; }
ok "a misspelt field fails the strict decode"
helm template intake "$chart" --set serviceMonitor.enabled=true --set prometheusRule.enabled=true -f "$extras" \
  --set-json 'extraEnv=[]' >"$tmp/noenv.yaml"
if (cd deploy/helm/chartcheck && CHART_RENDERED_EXTRAS="$tmp/noenv.yaml" go test -count=1 -run '^TestExtras$' . >"$tmp/noenv.out" 2>&1); then
  fail "a config naming variables no container sets passed"
fi
grep -q 'names INTAKE_PGP_PASSPHRASE, which the container does not set' "$tmp/noenv.out" || { cat "$tmp/noenv.out"; fail "the missing variable was not named"; }
ok "a config naming a variable the container lacks (extraEnv left out) fails"

make --no-print-directory -n image CHART_IMAGE=localhost/intake:elsewhere >"$tmp/make-other.txt"
if (cd deploy/helm/chartcheck && CHART_RENDERED="$tmp/all.yaml" MAKE_IMAGE_N="$tmp/make-other.txt" go test -count=1 -run '^TestDefaultImageIsOneMakeImageBuilds$' . >"$tmp/other.out" 2>&1); then
  fail "a chart default image make image does not tag passed"
fi
grep -q 'make image does not build and tag' "$tmp/other.out" || { cat "$tmp/other.out"; fail "the untagged image was not named"; }
ok "the chart's default image is one make image tags; another tag fails"

refuse() {
  local want=$1
  shift
  if helm template intake "$chart" "$@" >/dev/null 2>"$tmp/err"; then fail "rendered with $*"; fi
  grep -q "$want" "$tmp/err" || { cat "$tmp/err"; fail "with $*: no '$want'"; }
}
refuse 'worker_id must be unset' --set config.worker_id=intake-1
refuse 'http.listen must be 0.0.0.0' --set config.http.listen=127.0.0.1:9464
refuse 'must exceed config.drain' --set config.drain=2m --set terminationGracePeriodSeconds=90
refuse 'spool.dir must be' --set config.spool.dir=/tmp/spool
refuse 'use one whole number' --set config.drain=1h30m
helm template intake "$chart" --set config.drain=2m --set terminationGracePeriodSeconds=150 >/dev/null || fail "drain 2m with 150s grace refused"
ok "refuses worker_id, a loopback listener, a grace period not above drain, a drain it cannot compare, a spool elsewhere"
refuse "additional properties 'extraEnvs' not allowed" --set-json 'extraEnvs=[]'
refuse 'pullPolicy' --set image.pullPolicy=Sometimes
refuse 'unhealthyPodEvictionPolicy' --set podDisruptionBudget.unhealthyPodEvictionPolicy=Never
refuse 'extraEnv' --set-json 'extraEnv=[{"value":"no name"}]'
refuse 'failureThreshold' --set startupProbe.failureThreshold=0
refuse "missing property 'failureThreshold'" --set startupProbe.failureThreshold=null
refuse "additional properties 'terminationGracePeriodSeconds' not allowed" --set readinessProbe.terminationGracePeriodSeconds=5
refuse 'runbookBaseURL' --set prometheusRule.runbookBaseURL=docs/runbook.md
helm lint --strict "$chart" --set-json 'extraEnvs=[]' >"$tmp/lint-typo" 2>&1 && fail "helm lint passed a misspelt value key"
ok "values.schema.json refuses a misspelt key (in helm lint too), a bad pullPolicy, eviction policy, an env var without a name, a zero threshold, a relative runbook base"

# docs/install.md's Kubernetes steps, run as written with stand-ins for
# what needs a cluster or a container runtime: make only records that it
# was asked for the image, kubectl records the Secrets it would create,
# helm install renders (helm template, same arguments) with an empty
# my-values.yaml. What the doc creates must be what the chart's defaults
# mount: the database URL's Secret and key, and each key and known_hosts
# file where the default config names it.
mkdir -p "$tmp/doc"
ln -s "$PWD/deploy" "$tmp/doc/deploy"
echo '{}' >"$tmp/doc/my-values.yaml"
block=$(bash .ci/docblock.sh docs/install.md chart-install)
(
  cd "$tmp/doc"
  make() { echo "make $*" >>made; }
  kubectl() {
    [ "$1 $2 $3" = "create secret generic" ] || { echo "kubectl $*: not a create secret generic" >&2; return 1; }
    local name=$4 a
    shift 4
    for a in "$@"; do
      case $a in
      --from-literal=*) a=${a#--from-literal=}; echo "$name ${a%%=*}" >>secrets ;;
      --from-file=*) a=${a#--from-file=}; echo "$name ${a%%=*}" >>secrets ;;
      esac
    done
  }
  helm_() { go run "$HELM" "$@" 2> >(grep -v 'found symbolic link in path' >&2); }
  helm() {
    [ "$1" = install ] || { echo "helm $1: the doc should install" >&2; return 1; }
    shift
    helm_ template "$@" >rendered.yaml
  }
  export -f make kubectl helm helm_
  export HELM
  bash -euo pipefail -c "$block"
) || fail "docs/install.md's chart block failed:
$block"
grep -qx 'make image' "$tmp/doc/made" || fail "the doc's chart block does not build the image (make image)"
dbsecret= dbkey=
read -r dbsecret dbkey < <(grep -m1 ' url$' "$tmp/doc/secrets") || true
[ -n "$dbsecret" ] || fail "the doc creates no Secret with a key url: $(cat "$tmp/doc/secrets")"
grep -A1 'name: INTAKE_DATABASE_URL' "$tmp/doc/rendered.yaml" >/dev/null || fail "rendered: no INTAKE_DATABASE_URL"
grep -A4 'name: INTAKE_DATABASE_URL' "$tmp/doc/rendered.yaml" | grep -q "name: $dbsecret\$" &&
  grep -A4 'name: INTAKE_DATABASE_URL' "$tmp/doc/rendered.yaml" | grep -q "key: $dbkey\$" ||
  fail "the doc's Secret $dbsecret/$dbkey is not what the chart's INTAKE_DATABASE_URL reads: $(grep -A4 'name: INTAKE_DATABASE_URL' "$tmp/doc/rendered.yaml")"
while read -r secret key; do
  [ "$key" = url ] && continue
  grep -q "secretName: $secret\$" "$tmp/doc/rendered.yaml" || fail "the doc creates Secret $secret, which the chart does not mount"
  case $secret in
  *known-hosts*) want=/etc/intake/known_hosts/$key ;;
  *) want=/etc/intake/keys/$key ;;
  esac
  grep -q "$want" "$tmp/doc/rendered.yaml" || fail "the doc's Secret $secret key $key: the rendered config names no $want"
done <"$tmp/doc/secrets"
ok "docs/install.md's chart block, as written (make, kubectl stand-ins; helm install rendered): the Secrets it creates are the ones the chart mounts, at the config's paths"

# NOTES.txt as helm install prints it: helm template renders no NOTES.txt,
# so a copy of the chart renders it under another name (--debug prints a
# render that is not YAML before it fails).
cp -rL "$chart" "$tmp/notes-chart"
mv "$tmp/notes-chart/templates/NOTES.txt" "$tmp/notes-chart/templates/notes.txt"
helm template rel "$tmp/notes-chart" "${all[@]}" --show-only templates/notes.txt --debug >"$tmp/notes.raw" 2>&1 || true
sed -n '/^# Source: intake\/templates\/notes.txt/,/^Error:/p' "$tmp/notes.raw" >"$tmp/notes"
for want in 'kubectl -n default port-forward pod/rel-intake-0 9464' 'curl -s localhost:9464/metrics' 'curl -s localhost:9464/readyz' \
  'https://github.com/partner-intake/partner-intake/blob/main/docs/runbook.md' 'intake-database, key url' 'IntakeDown on job rel-intake' \
  'ConfigMap rel-intake-dashboard'; do
  grep -qF -- "$want" "$tmp/notes" || { cat "$tmp/notes.raw"; fail "NOTES.txt lacks: $want"; }
done
ok "NOTES.txt names the pods, /metrics, /readyz through a port-forward, the Secrets and the runbook"
echo "chart-test: $pass passed, 0 failed"
