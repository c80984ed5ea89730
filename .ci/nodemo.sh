#!/usr/bin/env bash
# The daemon binary links no demo or test rig (issue 13): no throwaway
# PostgreSQL, in-process SFTP server, key generator or package installer.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(go list -deps ./cmd/intake | grep -E 'partner-intake/(cmd/intake/internal/demo|internal/(sftpd|keygen|pgtemp|syspkg|sshdtest|testenv))$' || true)
if [ -n "$bad" ]; then
	echo "cmd/intake links demo or test rigs:"
	echo "$bad"
	exit 1
fi
echo "cmd/intake links no demo or test rig"
