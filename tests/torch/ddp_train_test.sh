#!/usr/bin/env bash
# The main job end to end: two ranks under braid-run train the MLP until the loss falls, and
# rank 0 prints the overlap summary. Paths from meson: $1 braid-run, $2 ddp_train.
set -euo pipefail
# The defaults, as the README runs it.
output=$("$1" -n 2 "$2" 2>&1) || { echo "$output"; exit 1; }
echo "$output"
grep -q "(converged)" <<<"$output" || { echo "FAIL: the loss did not fall 3x"; exit 1; }
grep -q "overlap%" <<<"$output" || { echo "FAIL: no overlap summary"; exit 1; }
grep -qE "^\[0\] all +" <<<"$output" || { echo "FAIL: no job row in the summary"; exit 1; }

# Its options are listed, and a wrong one is a usage error that points there.
"$2" --help | grep -q -- "--bucket-view" || { echo "FAIL: --help does not list the options"; exit 1; }
status=0
usage=$("$2" --no-such-option 2>&1) || status=$?
grep -q "ddp_train --help" <<<"$usage" || { echo "FAIL: no pointer to --help"; exit 1; }
[ "$status" -eq 2 ] || { echo "FAIL: an unknown option exited with $status, not 2"; exit 1; }
