#!/usr/bin/env python3
"""The sharded-data-parallel benchmark, small: `braid-bench sharded --json` runs DDP, ZeRO-1
and FSDP's SHARD_GRAD_OP, FULL_SHARD and NO_SHARD on 2 ranks, and each row's figures are
consistent: a step time, exposed communication no larger than the traced communication,
the formula's model state and what was held, every strategy ending on DDP's loss, DDP
holding exactly its formula, ZeRO-3 holding less than DDP, and a peak resident size.

Paths from the environment (meson sets them): BRAID_BENCH.
"""
import json
import os
import subprocess
import sys

SHAPE = ["--ranks", "2", "--hidden", "32", "--layers", "2", "--batch", "4", "--steps", "6",
         "--rounds", "1"]


def fail(message, output=""):
    print(output)
    print("FAIL:", message)
    sys.exit(1)


result = subprocess.run([os.environ["BRAID_BENCH"], "sharded", "--json"] + SHAPE,
                        capture_output=True, text=True, timeout=240)
output = result.stdout + result.stderr
if result.returncode != 0:
    fail(f"braid-bench sharded exited {result.returncode}", output)
rows = {}
for line in result.stdout.splitlines():
    if line.startswith("{"):
        row = json.loads(line)
        rows[row["sharding"]] = row
for name in ["none", "optimizer", "grad", "full", "no_shard"]:
    if name not in rows:
        fail(f"no row for {name}", output)
ddp = rows["none"]
for name, row in rows.items():
    if not row["step_ms"] > 0:
        fail(f"{name}: step_ms should be positive", output)
    if not row["communication_ms"] > 0:
        fail(f"{name}: two ranks communicate", output)
    if not row["exposed_ms"] <= row["communication_ms"] + 1e-3:
        fail(f"{name}: exposed communication is a part of the traced communication", output)
    if not (row["estimate_bytes"] > 0 and row["held_bytes"] > 0 and row["peak_rss_bytes"] > 0):
        fail(f"{name}: no memory figures", output)
    if row["held_bytes"] != (row["held_parameter_bytes"] + row["held_gradient_bytes"] +
                             row["held_optimizer_bytes"]):
        fail(f"{name}: held is not the sum of its parts", output)
    if abs(row["loss"] - ddp["loss"]) > 1e-4:
        fail(f"{name}: ends on loss {row['loss']}, DDP on {ddp['loss']}", output)
    if abs(row["held_of_ddp"] - row["held_bytes"] / ddp["held_bytes"]) > 1e-3:
        fail(f"{name}: held_of_ddp should be its held bytes over DDP's", output)
if ddp["held_bytes"] != ddp["estimate_bytes"]:
    fail("DDP holds what the formula says, exactly", output)
if not rows["full"]["held_bytes"] < ddp["held_bytes"]:
    fail("FULL_SHARD should hold less model state than DDP", output)
if not rows["full"]["estimate_transient_bytes"] > 0:
    fail("FULL_SHARD's formula has a transient unit", output)
print("ok:", ", ".join(f"{n} {r['step_ms']:.2f} ms {r['held_bytes']} B" for n, r in rows.items()))
