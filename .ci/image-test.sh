#!/usr/bin/env bash
# Tests the image `make image` built (issue 16, item 4) without running it
# (`podman run` does not work on these machines): its config through
# `podman image inspect`, its files through `podman image mount`, and the
# binary inside, copied out with `podman create` + `podman cp`, must report
# the build's version. Podman is installed when missing, never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${IMAGE:?run through make image-test}"
: "${VERSION:?run through make image-test}"
bash .ci/podman.sh
fail() { echo "image-test: FAIL: $*" >&2; exit 1; }
pass=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
field() { podman image inspect "$IMAGE" --format "$1"; }

user=$(field '{{.Config.User}}')
[ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] || fail "runs as '${user}', want a non-root user"
ok "user $user (non-root)"
[ "$(field '{{json .Config.Entrypoint}}')" = '["/usr/bin/intake"]' ] || fail "entrypoint $(field '{{json .Config.Entrypoint}}')"
[ "$(field '{{json .Config.Cmd}}')" = '["run","--config","/etc/intake/intake.yaml"]' ] || fail "cmd $(field '{{json .Config.Cmd}}')"
ok "entrypoint /usr/bin/intake, cmd run --config /etc/intake/intake.yaml"
[ "$(field '{{json .Config.ExposedPorts}}')" = '{"9464/tcp":{}}' ] || fail "exposed $(field '{{json .Config.ExposedPorts}}')"
ok "exposes 9464/tcp"
[ "$(field '{{json .Config.Volumes}}')" = '{"/var/lib/intake/spool":{}}' ] || fail "volumes $(field '{{json .Config.Volumes}}')"
ok "volume /var/lib/intake/spool"
[ "$(field '{{index .Config.Labels "org.opencontainers.image.version"}}')" = "$VERSION" ] || fail "version label"
ok "label org.opencontainers.image.version=$VERSION"

# The files: the user exists in /etc/passwd, owns the spool, and the
# config's spool and listener fit the image.
root=$(podman image mount "$IMAGE")
trap 'podman image unmount "$IMAGE" >/dev/null 2>&1 || true' EXIT
uid=${user%%:*}
grep -q "^intake:x:${uid}:" "$root/etc/passwd" || fail "/etc/passwd has no intake:x:${uid}"
[ "$(stat -c %u "$root/var/lib/intake/spool")" = "$uid" ] || fail "spool owned by $(stat -c %u "$root/var/lib/intake/spool"), want $uid"
grep -q '^  dir: /var/lib/intake/spool$' "$root/etc/intake/intake.yaml" || fail "config spool.dir is not the volume"
grep -q '^  listen: 0.0.0.0:9464$' "$root/etc/intake/intake.yaml" || fail "config http.listen is not 0.0.0.0:9464 (probes come from outside)"
[ -s "$root/etc/ssl/certs/ca-certificates.crt" ] || fail "no CA bundle (sslmode=verify-full needs one)"
ok "passwd entry, spool owned by $uid, config spool.dir and http.listen 0.0.0.0:9464, CA bundle"
cfg=$(mktemp)
cp "$root/etc/intake/intake.yaml" "$cfg"
podman image unmount "$IMAGE" >/dev/null
trap - EXIT

# The binary: copied out of a created (never started) container.
tmp=$(mktemp -d)
cid=$(podman create "$IMAGE")
trap 'podman rm -f "$cid" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
podman cp "$cid:/usr/bin/intake" "$tmp/intake"
out=$("$tmp/intake" version)
[[ "$out" == "intake ${VERSION} (commit "* ]] || fail "binary in the image says: $out (want $VERSION)"
ok "binary in the image: $out"
# The image's config passes the daemon's whole validation: `intake migrate`
# checks the file before it looks for the database URL, which is unset here.
vout=$(env -i PATH="$PATH" "$tmp/intake" migrate --config "$cfg" 2>&1 || true)
rm -f "$cfg"
[ "$vout" = "intake migrate: database.url_env: environment variable INTAKE_DATABASE_URL is not set" ] ||
  fail "the image's config does not validate: $vout"
ok "the binary in the image validates the image's config"
echo "image-test: $pass passed, 0 failed"
