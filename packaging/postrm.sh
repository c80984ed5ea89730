#!/bin/sh
# remove: the config (conffiles), the spool and the user stay.
# purge: dpkg deletes the conffiles; this deletes the rest of /etc/intake
# (keys and known_hosts an operator added) and the spool under
# /var/lib/intake. The system user stays (Debian practice: its id may own
# files elsewhere, e.g. in backups).
set -e
if [ "$1" = "purge" ]; then
  rm -rf /etc/intake /var/lib/intake
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
