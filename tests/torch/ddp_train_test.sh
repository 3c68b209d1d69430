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
