#!/usr/bin/env bash
# Builds the container image $IMAGE from packaging/Containerfile with
# podman (Debian's package, installed as root when missing). The context is
# staged here: bin/intake (static, from `make static`), an /etc/passwd and
# /etc/group naming the non-root user intake (10001), the host's CA bundle,
# the example config with http.listen on 0.0.0.0 (a probe comes from
# outside the container) and an empty spool directory.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${IMAGE:?run through make image}"
bash .ci/podman.sh
[ -x bin/intake ] || { echo "image-build: no bin/intake: run make static" >&2; exit 1; }
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/rootfs/etc/intake" "$ctx/rootfs/etc/ssl/certs" "$ctx/spool"
cp bin/intake "$ctx/intake"
printf 'root:x:0:0:root:/:/sbin/nologin\nintake:x:10001:10001:partner-intake:/var/lib/intake:/sbin/nologin\n' >"$ctx/rootfs/etc/passwd"
printf 'root:x:0:\nintake:x:10001:\n' >"$ctx/rootfs/etc/group"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/rootfs/etc/ssl/certs/"
fi
sed -e 's|^\(  listen: \)127\.0\.0\.1:9464|\10.0.0.0:9464|' configs/intake.example.yaml >"$ctx/rootfs/etc/intake/intake.yaml"
grep -q '^  listen: 0.0.0.0:9464' "$ctx/rootfs/etc/intake/intake.yaml" || { echo "image-build: could not set http.listen" >&2; exit 1; }
# --format docker: the OCI image format has no HEALTHCHECK (podman drops
# it with a warning). created is the commit's time, so a rebuild of one
# commit labels the same instant (UTC, RFC 3339).
created=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)
podman build --quiet --format docker -f packaging/Containerfile --build-arg "VERSION=${VERSION:-dev}" --build-arg "COMMIT=${COMMIT:-unknown}" \
  --build-arg "CREATED=$created" -t "$IMAGE" "$ctx" >/dev/null
echo "built image $IMAGE"
