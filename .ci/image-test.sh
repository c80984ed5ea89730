#!/usr/bin/env bash
# Tests the image `make image` built without `podman run` (which does not
# work on these machines): its config through `podman image inspect`, and
# its own filesystem through `podman image mount`, where the image's
# default command, its HEALTHCHECK and `intake version` run in a chroot of
# that filesystem as the image's uid with an empty environment. Nothing of
# the host's is used (no zoneinfo, no CA bundle, no binary), so a file the
# image lacks fails here. Needs root (podman and chroot). Podman is
# installed when missing, never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${IMAGE:?run through make image-test}"
: "${VERSION:?run through make image-test}"
: "${COMMIT:?run through make image-test}"
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
label() { field "{{index .Config.Labels \"org.opencontainers.image.$1\"}}"; }
[ "$(label version)" = "$VERSION" ] || fail "version label $(label version), want $VERSION"
[ "$(label revision)" = "$COMMIT" ] || fail "revision label $(label revision), want $COMMIT"
[[ "$(label source)" == https://* ]] || fail "source label '$(label source)'"
[ -n "$(label licenses)" ] || fail "no licenses label"
[[ "$(label created)" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$ ]] || fail "created label '$(label created)', want RFC 3339 UTC"
ok "labels version=$VERSION revision=$COMMIT source=$(label source) licenses=$(label licenses) created=$(label created)"
hc=$(field '{{json .Config.Healthcheck.Test}}')
[ "$hc" = '["CMD","/usr/bin/intake","healthcheck","--url","http://127.0.0.1:9464/healthz"]' ] || fail "healthcheck $hc"
ok "HEALTHCHECK $hc"

# The files: the user exists in /etc/passwd, owns the spool, and the
# config's spool and listener fit the image.
root=$(podman image mount "$IMAGE")
srv=
trap 'podman image unmount "$IMAGE" >/dev/null 2>&1 || true; [ -z "$srv" ] || kill "$srv" 2>/dev/null || true' EXIT
uid=${user%%:*}
gid=${user#*:}; [ "$gid" != "$user" ] || gid=$uid
grep -q "^intake:x:${uid}:" "$root/etc/passwd" || fail "/etc/passwd has no intake:x:${uid}"
[ "$(stat -c %u "$root/var/lib/intake/spool")" = "$uid" ] || fail "spool owned by $(stat -c %u "$root/var/lib/intake/spool"), want $uid"
grep -q '^  dir: /var/lib/intake/spool$' "$root/etc/intake/intake.yaml" || fail "config spool.dir is not the volume"
grep -q '^  listen: 0.0.0.0:9464$' "$root/etc/intake/intake.yaml" || fail "config http.listen is not 0.0.0.0:9464 (probes come from outside)"
[ -s "$root/etc/ssl/certs/ca-certificates.crt" ] || fail "no CA bundle (sslmode=verify-full needs one)"
ok "passwd entry, spool owned by $uid, config spool.dir and http.listen 0.0.0.0:9464, CA bundle"
# What the chroot proves depends on what the image lacks: no zone files.
[ ! -e "$root/usr/share/zoneinfo" ] || fail "the image has /usr/share/zoneinfo: the chroot would not prove the embedded zone data"
grep -q 'Europe/Berlin' "$root/etc/intake/intake.yaml" || fail "the image's config names no time zone to load"

# in_image runs argv in a chroot of the image's filesystem as its uid:gid,
# with an empty environment.
chroot_bin=$(command -v chroot)
in_image() { env -i "$chroot_bin" --userspec="$uid:$gid" "$root" "$@"; }

out=$(in_image /usr/bin/intake version) || fail "intake version in the image: $out"
[[ "$out" == "intake ${VERSION} (commit "* ]] || fail "binary in the image says: $out (want $VERSION)"
ok "in the image: $out"

# The default command (entrypoint + cmd from the image config): it loads
# the baked-in config (zones included) and stops where it needs the
# database URL, unset here; exit 2.
mapfile -t cmd < <(podman image inspect "$IMAGE" --format '{{range .Config.Entrypoint}}{{println .}}{{end}}{{range .Config.Cmd}}{{println .}}{{end}}' | sed '/^$/d')
set +e
vout=$(in_image "${cmd[@]}" 2>&1); vrc=$?
set -e
[ "$vrc" = 2 ] && [[ "$vout" == *"database.url_env: environment variable INTAKE_DATABASE_URL is not set"* ]] ||
  fail "the image's default command (${cmd[*]}) exit $vrc: $vout"
ok "default command (${cmd[*]}) loads the image's config and stops at the unset database URL (exit 2)"
set +e
vout=$(in_image /usr/bin/intake check --config /etc/intake/intake.yaml 2>&1); vrc=$?
set -e
[ "$vrc" = 2 ] && [[ "$vout" == *"INTAKE_DATABASE_URL is not set"* ]] ||
  fail "intake check of the image's config, exit $vrc: $vout"
ok "intake check --config /etc/intake/intake.yaml reaches the database URL (exit 2)"

# The HEALTHCHECK command, pointed (a later --url wins) at a listener on
# this host, which the chroot shares: 0 while it answers 200, 1 once gone.
mapfile -t hcargs < <(podman image inspect "$IMAGE" --format '{{range .Config.Healthcheck.Test}}{{println .}}{{end}}' | sed '/^$/d')
[ "${hcargs[0]}" = CMD ] || fail "healthcheck is not an exec form: ${hcargs[*]}"
www=$(mktemp -d)
echo ok >"$www/healthz"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
python3 -m http.server --bind 127.0.0.1 --directory "$www" "$port" >/dev/null 2>&1 &
srv=$!
for _ in $(seq 100); do
  in_image /usr/bin/intake healthcheck --url "http://127.0.0.1:$port/healthz" --timeout 1s >/dev/null 2>&1 && break
  python3 -c 'import time; time.sleep(0.1)'
done
hout=$(in_image "${hcargs[@]:1}" --url "http://127.0.0.1:$port/healthz" 2>&1) || fail "HEALTHCHECK against a 200: $hout"
kill "$srv"; wait "$srv" 2>/dev/null || true; srv=
rm -rf "$www"
set +e
hout=$(in_image "${hcargs[@]:1}" --url "http://127.0.0.1:$port/healthz" --timeout 2s 2>&1); hrc=$?
set -e
[ "$hrc" = 1 ] || fail "HEALTHCHECK with nothing listening: exit $hrc ($hout), want 1"
ok "HEALTHCHECK command in the image: 0 against a 200, 1 with nothing listening"
podman image unmount "$IMAGE" >/dev/null
trap - EXIT
echo "image-test: $pass passed, 0 failed"
