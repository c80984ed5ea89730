#!/usr/bin/env bash
# Installs what the tests start: PostgreSQL's server binaries, OpenSSH's
# sshd (with its sftp server) and client, the other partner servers the
# interop tests run (ProFTPD's mod_sftp, rclone serve sftp), zsh and fish
# (completion tests), groff (the man page's test), Chromium (the review console's browser test) and
# gnupg (the benchmark smoke's pgp floor). With
# the argument "demo", only what `intake demo` starts: PostgreSQL's server
# binaries (its SFTP site is in-process), so a workstation gets no sshd.
# As root it uses apt-get; as another user it prints the exact command and
# fails. Nothing is skipped.
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
if [ "${1:-test}" != demo ]; then
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  [ -x /usr/lib/openssh/sftp-server ] || missing+=(openssh-sftp-server)
  command -v sftp >/dev/null || missing+=(openssh-client)
  [ -x /usr/sbin/proftpd ] || missing+=(proftpd-core)
  [ -e /usr/lib/proftpd/mod_sftp.so ] || missing+=(proftpd-mod-crypto)
  command -v rclone >/dev/null || missing+=(rclone)
  command -v zsh >/dev/null || missing+=(zsh) # `intake completion zsh` is loaded by a real zsh in the tests
  command -v fish >/dev/null || missing+=(fish) # and `intake completion fish` by a real fish
  command -v groff >/dev/null || missing+=(groff-base) # `intake man` is rendered with every warning on
  [ -x /usr/bin/chromium ] || missing+=(chromium) # the review console's browser test (console/browser_test.go)
  command -v gpg >/dev/null || missing+=(gnupg) # the benchmark's pgp floor (bench-smoke): gpg --decrypt | psql
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "installing ${missing[*]} ..." >&2
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
  apt-get update >/dev/null
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
}
# The Debian packages start a cluster, sshd on port 22 and proftpd on port
# 21 where systemd runs; the tests start their own, so nothing else is
# needed here.
