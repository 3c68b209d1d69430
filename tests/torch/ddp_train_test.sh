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
# DDP's forward and backward spans say how long their threads were off their cores.
grep -qE "overlap% +off-core" <<<"$output" || { echo "FAIL: no off-core column"; exit 1; }
# Every rank's trace is gathered to rank 0, so the summary splits exposed time into waiting
# for a later rank and the transfer itself.
grep -qE "exposed +waiting +transfer" <<<"$output" || { echo "FAIL: no waiting/transfer columns"; exit 1; }

# Its options are listed, and a wrong one is a usage error that points there.
"$2" --help | grep -q -- "--copy-gradients" || { echo "FAIL: --help does not list the options"; exit 1; }
status=0
usage=$("$2" --no-such-option 2>&1) || status=$?
grep -q "ddp_train --help" <<<"$usage" || { echo "FAIL: no pointer to --help"; exit 1; }
[ "$status" -eq 2 ] || { echo "FAIL: an unknown option exited with $status, not 2"; exit 1; }

# Uneven inputs: rank 1 runs out 4 steps early, joins, shadows the 4 steps rank 0 still
# trains, and both end with rank 0's weights (ddp_train fails if the ranks disagree). In
# copy mode, so that the main job runs both ways (the defaults above keep gradients in the
# buckets).
output=$("$1" -n 2 "$2" --steps 12 --uneven 4 --copy-gradients 2>&1) || { echo "$output"; exit 1; }
grep -q "rank 1 trained 8 steps and shadowed 4 in join()" <<<"$output" ||
  { echo "$output"; echo "FAIL: rank 1 did not shadow rank 0's last 4 steps"; exit 1; }
grep -q "every rank now holds rank 0's weights" <<<"$output" ||
  { echo "$output"; echo "FAIL: join() did not end on rank 0's weights"; exit 1; }
# A share that leaves a rank fewer than 2 steps is refused on every rank, before training.
status=0
refused=$("$1" -n 2 "$2" --steps 4 --uneven 3 2>&1) || status=$?
[ "$status" -ne 0 ] && grep -q "leaves rank 1 1 of 4 steps" <<<"$refused" ||
  { echo "$refused"; echo "FAIL: --uneven 3 of 4 steps was not refused"; exit 1; }
echo "uneven inputs: PASS"

# Balancing: with the last rank 20 ms slower a step, the batch shares move toward the
# faster rank (logged on rank 0), the shares add up to the global batch, and training ends
# on every rank alike (ddp_train fails if the ranks disagree).
output=$(OPENBLAS_NUM_THREADS=1 "$1" -n 2 "$2" --steps 30 --straggle-ms 20 --balance 2>&1) ||
  { echo "$output"; exit 1; }
sizes=$(grep -oE "balance: batch sizes now \[[0-9]+, [0-9]+\]" <<<"$output" | tail -1 | grep -oE "[0-9]+, [0-9]+")
[ -n "$sizes" ] || { echo "$output"; echo "FAIL: the balancer never moved the shares"; exit 1; }
first=${sizes%%,*}; second=${sizes##* }
[ $((first + second)) -eq 64 ] && [ "$first" -gt "$second" ] ||
  { echo "$output"; echo "FAIL: shares $sizes should add up to 64, the faster rank 0 holding more"; exit 1; }
echo "balancing: PASS ($sizes)"

# The cadence mode: with the last rank 20 ms slower per micro-batch, rank 0 computes more
# micro-batches per window than rank 1, and training ends on every rank alike.
output=$(OPENBLAS_NUM_THREADS=1 "$1" -n 2 "$2" --steps 20 --straggle-ms 20 --cadence 2>&1) ||
  { echo "$output"; exit 1; }
counts=$(grep -oE "cadence: micro-batches per window now \[[0-9]+, [0-9]+\]" <<<"$output" | tail -1 | grep -oE "[0-9]+, [0-9]+")
[ -n "$counts" ] || { echo "$output"; echo "FAIL: the cadence balancer never moved the counts"; exit 1; }
first=${counts%%,*}; second=${counts##* }
[ "$first" -gt "$second" ] ||
  { echo "$output"; echo "FAIL: micro-batches $counts: the faster rank 0 should compute more"; exit 1; }
grep -qE "loss .* -> .*, [0-9.]+ ms/step, [0-9]+ samples/s" <<<"$output" ||
  { echo "$output"; echo "FAIL: no final line with samples per second"; exit 1; }
echo "cadence: PASS ($counts)"
