#!/usr/bin/env python3
"""The pipeline benchmark, small: `braid-bench pipeline --json` prints a row for every layout
(pp 4, pp 2 x dp 2) and schedule (GPipe, 1F1B, interleaved, ZB-H1), and each row's figures
are consistent: bubbles are percentages, the pipeline's window lies within the step, the
formula column is the textbook bubble for the row's p, m and v, the simulator with the
measured costs (one per kind, transfers free) gives that bubble for GPipe and 1F1B and
interleaved and at most it for ZB-H1, and the data-parallel rows' exposed reduction is a
part of their reduction, all of it when the reduction runs after the step.

Paths from the environment (meson sets them): BRAID_BENCH.
"""
import json
import os
import subprocess
import sys

MICROBATCHES = 4
SHAPE = ["--layers", "8", "--hidden", "16", "--heads", "2", "--seq", "4", "--global-batch", "16",
         "--microbatches", str(MICROBATCHES), "--steps", "4", "--rounds", "1"]


def fail(message, output=""):
    print(output)
    print("FAIL:", message)
    sys.exit(1)


result = subprocess.run([os.environ["BRAID_BENCH"], "pipeline", "--json"] + SHAPE,
                        capture_output=True, text=True, timeout=300)
output = result.stdout + result.stderr
if result.returncode != 0:
    fail(f"braid-bench pipeline exited {result.returncode}", output)
rows = {}
for line in result.stdout.splitlines():
    if line.startswith("{"):
        row = json.loads(line)
        rows[(row["layout"], row["schedule"])] = row
for layout in ["pp4", "pp2xdp2"]:
    for schedule in ["gpipe", "1f1b", "interleaved", "zb"]:
        if (layout, schedule) not in rows:
            fail(f"no row for {layout} {schedule}", output)

for (layout, schedule), row in rows.items():
    name = f"{layout} {schedule}"
    p, m, v = row["pp"], row["microbatches"], row["virtual_stages"]
    if (p, row["dp"], m) != ({"pp4": 4, "pp2xdp2": 2}[layout], {"pp4": 1, "pp2xdp2": 2}[layout],
                             MICROBATCHES):
        fail(f"{name}: pp, dp and microbatches should be the layout's and the option's", output)
    if v != (2 if schedule == "interleaved" else 1):
        fail(f"{name}: interleaved runs two stages per rank, the others one", output)
    if not 0 < row["pipeline_ms"] <= 1.1 * row["step_ms"] + 1:
        fail(f"{name}: the pipeline's window is a part of the step", output)
    for key in ["bubble_percent", "simulated_bubble_percent"]:
        if not 0 <= row[key] < 100:
            fail(f"{name}: {key} should be a percentage below 100", output)
    formula = 100 * (p - 1) / (v * m + p - 1)
    if schedule == "zb":
        # ZB-H1's own unit-cost figure; what it must beat is 1F1B's.
        zb_formula = 100 * (p - 1) / (3 * m + p - 1)
        if abs(row["formula_bubble_percent"] - zb_formula) > 1e-3:
            fail(f"{name}: the formula column should be (p-1)/(3m+p-1) = {zb_formula:.4f}", output)
        costs = ["F_ms", "I_ms", "W_ms"]
        if not row["simulated_bubble_percent"] <= formula + 0.5:
            fail(f"{name}: ZB-H1 simulates no more bubble than 1F1B's formula", output)
    else:
        if abs(row["formula_bubble_percent"] - formula) > 1e-3:
            fail(f"{name}: the formula column should be (p-1)/(vm+p-1) = {formula:.4f}", output)
        costs = ["F_ms", "B_ms"]
        if abs(row["simulated_bubble_percent"] - formula) > 0.5:
            fail(f"{name}: with one cost per kind the simulator gives the formula", output)
    for key in costs:
        if not row.get(key, 0) > 0:
            fail(f"{name}: {key} should be measured", output)
    if not row["simulated_ms"] > 0:
        fail(f"{name}: the simulated step should take time", output)
    if row["dp"] == 1:
        if "dp_exposed_ms" in row or "no_overlap_step_ms" in row:
            fail(f"{name}: one replica has no data-parallel reduction", output)
        continue
    if not (row["dp_comm_ms"] > 0 and row["no_overlap_dp_comm_ms"] > 0
            and row["no_overlap_step_ms"] > 0):
        fail(f"{name}: two replicas reduce their gradients, with and without overlap", output)
    if not 0 <= row["dp_exposed_summary_ms"] <= row["dp_exposed_ms"] + 1e-3:
        fail(f"{name}: braid-trace's exposed time leaves out the waits, so it is no more", output)
    if not row["dp_exposed_ms"] <= row["dp_comm_ms"] + 1e-3:
        fail(f"{name}: the exposed reduction is a part of the reduction", output)
    if abs(row["no_overlap_dp_exposed_ms"] - row["no_overlap_dp_comm_ms"]) > 1e-2:
        fail(f"{name}: a reduction after the step's last action is all exposed", output)
print("ok:", ", ".join(f"{l} {s} {r['step_ms']:.1f} ms {r['bubble_percent']:.0f}%"
                       for (l, s), r in rows.items()))
