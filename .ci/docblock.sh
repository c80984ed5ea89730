#!/usr/bin/env bash
# Prints the fenced code block of a Markdown file that a marker line
# `<!-- run: NAME -->` right above names (docs/install.md's runnable
# blocks; cmd/intake/installdoc_test.go reads the same markers). Fails
# when there is none, so a test cannot run nothing.
#   .ci/docblock.sh docs/install.md package-install
set -euo pipefail
file=$1 name=$2
out=$(awk -v m="<!-- run: $name -->" '
  $0 == m { want = 1; next }
  want == 1 { if ($0 ~ /^```/) { want = 2; next } else { exit 3 } }
  want == 2 { if ($0 == "```") { found = 1; exit } print }
  END { if (!found) exit 3 }' "$file") || { echo "docblock: no block marked '$name' in $file" >&2; exit 1; }
printf '%s\n' "$out"
