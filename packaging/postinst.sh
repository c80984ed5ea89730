#!/bin/sh
# Creates the service's system user and gives it read access to its config.
set -e
if [ "$1" = "configure" ] || [ -z "$1" ]; then
  if ! getent group intake >/dev/null; then
    addgroup --system --quiet intake
  fi
  if ! getent passwd intake >/dev/null; then
    adduser --system --quiet --ingroup intake --no-create-home \
      --home /var/lib/intake --shell /usr/sbin/nologin \
      --gecos "partner-intake daemon" intake
  fi
  # Config and secrets: root writes, the service reads, nobody else.
  chown root:intake /etc/intake /etc/intake/keys /etc/intake/known_hosts
  chmod 0750 /etc/intake /etc/intake/keys /etc/intake/known_hosts
  chown root:intake /etc/intake/intake.yaml /etc/intake/intake.env
  chmod 0640 /etc/intake/intake.yaml /etc/intake/intake.env
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
    # Not enabled or started: the example config names partners that do
    # not exist. Edit /etc/intake/intake.yaml, then
    # `systemctl enable --now intake`.
    if systemctl is-active --quiet intake; then
      systemctl try-restart intake >/dev/null || true
    fi
  fi
fi
exit 0
