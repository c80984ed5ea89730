#!/usr/bin/env bash
# Writes the package's Debian changelog, in nfpm's changelog format
# (chglog YAML), to $1: `make package` runs it, and nfpm installs it as
# /usr/share/doc/intake/changelog.Debian.gz. One entry, for the version
# built, dated by its commit; what changed is docs/CHANGELOG.md, which the
# package installs as /usr/share/doc/intake/changelog.gz (Debian policy
# 12.7: the upstream changelog).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VERSION:?run through make package}" "${COMMIT:?run through make package}"
out=${1:?usage: changelog.sh OUT.yml}
newest=$(sed -n 's/^## \([0-9][0-9-]*\)$/\1/p' docs/CHANGELOG.md | head -1)
[ -n "$newest" ] || { echo "changelog.sh: docs/CHANGELOG.md has no '## YYYY-MM-DD' section" >&2; exit 1; }
date=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo "${newest}T00:00:00Z")
maintainer=$(sed -n 's/^maintainer: *//p' packaging/nfpm.yaml)
cat >"$out" <<YAML
- semver: "$VERSION"
  date: $date
  packager: "$maintainer"
  deb:
    urgency: low
    distributions: [stable]
  changes:
    - commit: "$COMMIT"
      note: "commit $COMMIT; what changed, by date: changelog.gz (newest $newest)"
YAML
