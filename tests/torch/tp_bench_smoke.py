#!/usr/bin/env python3
"""The tensor-parallel benchmark, small: `braid-bench tp --json` runs every row (braid at TP
1 and 2, TP 2 without the backward overlap and with sequence parallelism, and PyTorch over
Gloo where a python3 with torch is installed), and each row's figures are consistent: a
step time, exposed communication no larger than the traced communication, none at TP 1,
and a speed-up that is the TP 1 step over this one.

Paths from the environment (meson sets them): BRAID_BENCH.
"""
import json
import os
import subprocess
import sys

SHAPE = ["--hidden", "32", "--heads", "4", "--layers", "1", "--seq", "8", "--batch", "2",
         "--steps", "6", "--rounds", "1"]


def fail(message, output=""):
    print(output)
    print("FAIL:", message)
    sys.exit(1)


result = subprocess.run([os.environ["BRAID_BENCH"], "tp", "--json", "--sequence-parallel"] + SHAPE,
                        capture_output=True, text=True, timeout=240)
output = result.stdout + result.stderr
if result.returncode != 0:
    fail(f"braid-bench tp exited {result.returncode}", output)
rows = {}
for line in result.stdout.splitlines():
    if line.startswith("{"):
        row = json.loads(line)
        rows[row["runner"]] = row
expected = ["braid TP 1", "braid TP 2", "braid TP 2 no overlap", "braid TP 2 seq-par"]
if "no Python with torch" not in output:
    expected += ["torch+gloo TP 1", "torch+gloo TP 2"]
for name in expected:
    if name not in rows:
        fail(f"no row for {name}", output)
for name, row in rows.items():
    if not row["step_ms"] > 0:
        fail(f"{name}: step_ms should be positive", output)
    if row["ranks"] == 1 and row["exposed_ms"] != 0:
        fail(f"{name}: one rank communicates nothing", output)
    if "communication_ms" in row and not row["exposed_ms"] <= row["communication_ms"] + 1e-3:
        fail(f"{name}: exposed communication is a part of the communication", output)
    one = rows["braid TP 1" if name.startswith("braid") else "torch+gloo TP 1"]
    if abs(row["speed_up"] - one["step_ms"] / row["step_ms"]) > 0.01:
        fail(f"{name}: speed_up should be the TP 1 step over this one", output)
for name in expected[1:4]:
    if not rows[name]["communication_ms"] > 0:
        fail(f"{name}: two ranks communicate", output)
print("ok:", ", ".join(f"{n} {r['step_ms']:.2f} ms" for n, r in rows.items()))
