#!/usr/bin/env python3
"""braid-bench collectives as a user runs it, small: every collective on 3 ranks (uneven
variable counts, a non-power-of-two world) from 8 B to 8 KiB, without peers, in two
rounds. Each row is the bench's own element-by-element check of every round's call, so
this proves the table covers every collective at every size, once per size however many
rounds, and that every result was exact.

Path from the environment (meson sets it): BRAID_BENCH.
"""
import json
import os
import subprocess
import sys

RANKS = 3
ROUNDS = 2
MIN_BYTES, MAX_BYTES = 8, 8192
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
       "all_to_all", "all_gather_v", "all_to_all_v", "barrier"]
SPLIT_OPS = set(OPS) - {"all_reduce", "broadcast", "reduce", "barrier"}


def expected_sizes(op):
    """What braid-bench documents: doubling sizes, rounded down to whole f32 elements per
    rank for the ops that split the buffer, skipping a size that rounds to nothing."""
    if op == "barrier":
        return [0]
    granule = 4 * (RANKS if op in SPLIT_OPS else 1)
    sizes, size = [], MIN_BYTES
    while size <= MAX_BYTES:
        if size // granule:
            sizes.append(size // granule * granule)
        size *= 2
    return sizes


def main():
    result = subprocess.run(
        [os.environ["BRAID_BENCH"], "collectives", "--ranks", str(RANKS), "--ops", ",".join(OPS),
         "--min-bytes", str(MIN_BYTES), "--max-bytes", str(MAX_BYTES), "--iters", "3",
         "--rounds", str(ROUNDS), "--no-peers", "--json"],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"braid-bench exited {result.returncode}:\n{result.stderr}"
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for op in OPS:
        mine = [row for row in rows if row["op"] == op]
        sizes = [row["bytes"] for row in mine]
        assert sizes == expected_sizes(op), f"{op}: sizes {sizes}, expected {expected_sizes(op)}"
        for row in mine:
            assert row["ranks"] == RANKS, row
            assert row["rounds"] == ROUNDS, row
            assert row["braid"]["wrong"] == 0, f"{op} at {row['bytes']} B: {row['braid']}"
            assert row["braid"]["time_us"] > 0, row
            assert row["openmpi"] is None and row["gloo"] is None, row
    print(f"{len(rows)} rows, every collective, every size exact")
    refuses_sizes_that_are_not_sizes()
    return 0


def refuses_sizes_that_are_not_sizes():
    """A negative size (which stoull reads as 2^64 - 1) or one past what a node could hold
    is a usage error naming the value, not a crash in the ranks."""
    for bad, says in (("-1", "is not a size"), ("9223372036854775807", "is larger than"),
                      ("99999999999999999999999", "is larger than"), ("4X", "is not a size")):
        result = subprocess.run(
            [os.environ["BRAID_BENCH"], "collectives", "--min-bytes", bad, "--max-bytes", bad,
             "--no-peers"], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2, f"--min-bytes {bad}: exit {result.returncode}\n{result.stderr}"
        assert says in result.stderr and bad in result.stderr, f"--min-bytes {bad}: {result.stderr}"
    # Counts likewise: a message naming the option, not a bare std::stoi.
    for args, says in ((["collectives", "--ranks", "x"], "--ranks needs a whole number"),
                       (["collectives", "--rounds", "-3"], "--rounds needs a whole number"),
                       (["ddp", "--straggle-ms", "abc"], "--straggle-ms needs a number from 0")):
        result = subprocess.run([os.environ["BRAID_BENCH"]] + args,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 2, f"{args}: exit {result.returncode}\n{result.stderr}"
        assert says in result.stderr and "stoi" not in result.stderr, f"{args}: {result.stderr}"


if __name__ == "__main__":
    sys.exit(main())
