#!/usr/bin/env bash
# Prints the path of a promtool, installing one when there is none:
# Debian's prometheus package as root (fast, promtool 2.42), else the
# pinned upstream build with `go install` (slow: it compiles Prometheus).
set -euo pipefail
gobin="$(go env GOPATH)/bin/promtool"
for p in "$gobin" "$(command -v promtool || true)"; do
  if [ -n "$p" ] && [ -x "$p" ]; then echo "$p"; exit 0; fi
done
if [ "$(id -u)" -eq 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 || {
    apt-get update >/dev/null && apt-get install -y --no-install-recommends prometheus >/dev/null
  }
  command -v promtool && exit 0
fi
echo "installing promtool with go install (this compiles Prometheus, several minutes)..." >&2
GOFLAGS= go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0 >&2
echo "$gobin"
