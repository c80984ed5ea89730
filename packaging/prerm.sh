#!/bin/sh
# Stops the service before its binary goes (on removal, not on upgrade).
set -e
if [ "$1" = "remove" ] && [ -d /run/systemd/system ]; then
  systemctl stop intake >/dev/null 2>&1 || true
  systemctl disable intake >/dev/null 2>&1 || true
fi
exit 0
