#!/usr/bin/env python3
"""The recovery benchmark, small: `braid-bench recovery --json` on ddp_train, two kills a
run. Each way's row counts both kills, each kill with a verdict from braid-run and a first
step after the restart within the 5 s goal; braid's way (in memory every step) loses at
most one step a kill, and the anchor's (disk every 50 steps) none fewer; the cost row has
both step times.

Paths from the environment (meson sets them): BRAID_BENCH.
"""
import json
import os
import subprocess
import sys


def fail(message, output=""):
    print(output)
    print("FAIL:", message)
    sys.exit(1)


result = subprocess.run(
    [os.environ["BRAID_BENCH"], "recovery", "--json", "--jobs", "ddp", "--kills", "2",
     "--interval", "0.5", "--rounds", "1"], capture_output=True, text=True, timeout=300)
output = result.stdout + result.stderr
if result.returncode != 0:
    fail(f"braid-bench recovery exited {result.returncode}", output)
rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
ways = {row["way"].split(":")[0]: row for row in rows if "way" in row}
costs = [row for row in rows if "memory_cost" in row]
if set(ways) != {"braid", "anchor"}:
    fail(f"rows for {sorted(ways)}, not braid and anchor", output)
for name, row in ways.items():
    if row["kills"] != 2 or len(row["per_kill"]) != 2:
        fail(f"{name}: {row['kills']} kills measured, not 2", output)
    for kill in row["per_kill"]:
        if not 0 < kill["detect_ms"] < 5000:
            fail(f"{name}: braid-run's verdict {kill['detect_ms']} ms after the kill", output)
        if not 0 < kill["recover_s"] < 5:
            fail(f"{name}: the first step {kill['recover_s']} s after the kill", output)
    if not 0 < row["goodput"] <= 1.5:
        fail(f"{name}: goodput {row['goodput']}", output)
if max(kill["lost"] for kill in ways["braid"]["per_kill"]) > 1:
    fail("braid's way lost more than one step a kill", output)
if len(costs) != 1 or not (costs[0]["plain_step_ms"] > 0 and costs[0]["memory_step_ms"] > 0):
    fail("no cost row with both step times", output)
print("ok: kill to step " + ", ".join(
    f"{name} {max(k['recover_s'] for k in row['per_kill']):.2f} s (lost "
    f"{max(k['lost'] for k in row['per_kill'])})" for name, row in ways.items())
      + f"; in memory every step {100 * costs[0]['memory_cost']:+.0f}% a step")
