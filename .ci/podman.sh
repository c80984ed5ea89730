#!/usr/bin/env bash
# Installs podman (Debian's package) when missing; as another user than
# root it prints the command and fails. Never skipped.
set -euo pipefail
command -v podman >/dev/null && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "podman is missing: sudo apt-get update && sudo apt-get install -y podman" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "installing podman ..." >&2
apt-get install -y --no-install-recommends podman >/dev/null 2>&1 ||
  { apt-get update >/dev/null && apt-get install -y --no-install-recommends podman >/dev/null; }
