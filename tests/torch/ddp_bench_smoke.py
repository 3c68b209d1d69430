#!/usr/bin/env python3
"""The DDP benchmark's measurement, small: `braid-bench-ddp-worker --sync paired` pairs each synchronised
step with a no_sync() step and reports their difference; `braid-bench ddp` prints braid's
rows (and PyTorch's, where a python3 with torch is installed) with the goal ratios.

What this proves: the pairing is what the JSON says (steps after the warm-up, two per
pair); no_sync() steps leave braid's runtime thread idle while synchronised steps keep it
busy (so the CPU figures measure communication); the table has every row and ratio.

Paths from the environment (meson sets them): BRAID_RUN, DDP_WORKER, BRAID_BENCH.
"""
import json
import os
import re
import shutil
import subprocess
import sys

# 512 wide (0.66M parameters, 2.6 MB of gradients): enough reduction that a synchronised
# step's runtime-thread CPU (0.29-0.40 ms here) stands far above a no_sync() step's idle
# wake-ups (0.005-0.010 ms). At 256 wide, once the rank still in backward left its share
# to the free one and stopped spinning, it was 0.03-0.13 ms, too close to tell.
MODEL = ["--hidden", "512", "--layers", "2", "--batch", "8", "--optimizer", "sgd"]


def fail(message, output=""):
    print(output)
    print("FAIL:", message)
    sys.exit(1)


def paired_run():
    steps = 12  # warm-up min(5, 12 // 4) = 3, rounded down to a pair boundary: 2
    result = subprocess.run(
        [os.environ["BRAID_RUN"], "-n", "2", os.environ["DDP_WORKER"], "--sync", "paired",
         "--steps", str(steps)] + MODEL, capture_output=True, text=True, timeout=180)
    if result.returncode != 0:
        fail(f"braid-bench-ddp-worker --sync paired exited {result.returncode}", result.stdout + result.stderr)
    lines = [l[l.index("{"):] for l in result.stdout.splitlines() if '{"sync"' in l]
    if len(lines) != 1:
        fail("expected one JSON line from rank 0", result.stdout)
    row = json.loads(lines[0])
    if row["sync"] != "paired" or row["pairs"] != (steps - 2) // 2:
        fail(f"expected {(steps - 2) // 2} pairs", lines[0])
    for key in ("step_ms", "none_step_ms", "cpu_ms", "bare_all_reduce_ms", "bare_cpu_ms",
                "bare_shared_all_reduce_ms", "bare_shared_cpu_ms"):
        if not row[key] > 0:
            fail(f"{key} should be positive", lines[0])
    # No collective runs during a no_sync() step: the runtime thread's CPU is all DDP's.
    if not row["progress_cpu_ms"] > 10 * row["none_progress_cpu_ms"]:
        fail("the runtime thread should work in synchronised steps and idle in no_sync() ones",
             lines[0])
    # The training thread's extra off-core time in a synchronised step: a difference of two
    # parts of the steps' times, so no larger than a step.
    if "exposed_off_core_ms" not in row or not abs(row["exposed_off_core_ms"]) <= row["step_ms"]:
        fail("exposed_off_core_ms should be there, within a step's time", lines[0])
    # The exposed figure is the mean of the pairs' differences: within the two means' gap.
    if abs(row["exposed_ms"] - (row["step_ms"] - row["none_step_ms"])) > 1e-2:
        fail("exposed_ms should be the synchronised minus the no_sync() mean", lines[0])


def straggler_run():
    """--straggle-ms: the last rank computes more before each backward; the run still ends
    with every rank on the same weights (the worker fails if not) and a JSON line."""
    result = subprocess.run(
        [os.environ["BRAID_RUN"], "-n", "2", os.environ["DDP_WORKER"], "--steps", "8",
         "--straggle-ms", "20"] + MODEL, capture_output=True, text=True, timeout=180)
    if result.returncode != 0 or '{"sync":"ddp"' not in result.stdout:
        fail(f"the worker with --straggle-ms exited {result.returncode}",
             result.stdout + result.stderr)


def bench_table():
    result = subprocess.run(
        [os.environ["BRAID_BENCH"], "ddp", "--steps", "8", "--rounds", "1"] + MODEL,
        capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        fail(f"braid-bench ddp exited {result.returncode}", output)
    number = r"-?\d+\.\d\d"
    for name in ("braid DDP", "braid DDP, copy mode"):
        # step, no-sync, exposed +- CI, traced, off-core
        if not re.search(rf"^{re.escape(name)} +{number} +{number} +{number} \+- {number} +"
                         rf"{number} +{number} ", result.stdout, re.M):
            fail(f"no '{name}' row with figures", output)
    if not re.search(r"^bare all-reduce of all gradients .*: \d+\.\d\d ms .* plain buffer; "
                     r"\d+\.\d\d ms .* allocate_shared", result.stdout, re.M):
        fail("no bare all-reduce line with plain and shared-memory figures", output)
    with_peer = "PyTorch DDP (Gloo)" in result.stdout
    if with_peer and not re.search(rf"^PyTorch DDP, bucket view +{number} +{number}",
                                   result.stdout, re.M):
        fail("PyTorch's default ran but its gradient_as_bucket_view run has no row", output)
    for name in ("braid DDP", "braid DDP, copy mode"):
        line = next((l for l in result.stdout.splitlines() if l.startswith(name + ":")), None)
        if line is None or "exposed / bare all-reduce" not in line:
            fail(f"no ratio line for {name}", output)
        if with_peer and "step / PyTorch's" not in line:
            fail(f"the PyTorch peer ran but {name} has no ratio to it", output)
    # braid's default keeps gradients in the buckets: its like-for-like PyTorch does too.
    line = next(l for l in result.stdout.splitlines() if l.startswith("braid DDP:"))
    if with_peer and "like for like, against PyTorch with gradient_as_bucket_view" not in line:
        fail("braid's default has no ratio to PyTorch with gradient_as_bucket_view", output)
    # MODEL asks for SGD alone: one table, headed so (the default runs SGD and Adam).
    headings = re.findall(r"^MLP .*, (sgd|adam), ", result.stdout, re.M)
    if headings != ["sgd"]:
        fail(f"expected one table, for sgd, got {headings}", output)
    print(result.stdout)
    print("PyTorch peer:", "measured" if with_peer else "not installed")


def balance_table():
    """braid-bench ddp --balance: rows for equal shares, the batch balancer and the cadence
    mode with their ratio to the ideal, and the ideal itself; the balancer's batch sizes add
    up to the global batch and give the slower last rank the smaller share."""
    result = subprocess.run(
        [os.environ["BRAID_BENCH"], "ddp", "--balance", "--straggle-ms", "4", "--rounds", "1",
         "--steps", "8", "--optimizers", "sgd", "--hidden", "128", "--layers", "2",
         "--batch", "16"],
        capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        fail(f"braid-bench ddp --balance exited {result.returncode}", output)
    number = r"\d+\.\d\d"
    for name in ("equal shares", "balanced (BatchBalancer)", "cadence (CadenceBalancer)"):
        if not re.search(rf"^{re.escape(name)} +{number} +\d+ +{number} +\d+ +{number} +{number}",
                         result.stdout, re.M):
            fail(f"no '{name}' row with figures", output)
    if not re.search(rf"^ideal \(batch / sum of rates\) +{number} +32 ", result.stdout, re.M):
        fail("no ideal row for the global batch of 32", output)
    sizes = re.search(r"batch (\d+) (\d+)$", result.stdout, re.M)
    if not sizes or int(sizes.group(1)) + int(sizes.group(2)) != 32:
        fail("the balancer's batch sizes should add up to the global batch, 32", output)
    if not int(sizes.group(1)) > int(sizes.group(2)):
        fail("the slower last rank should get the smaller batch", output)
    if not re.search(rf"^balanced / ideal {number} \(goal <= 1.15\)", result.stdout, re.M):
        fail("no balanced / ideal ratio", output)
    print(result.stdout)


def compute_tax_table():
    """braid-bench compute-tax: a row per model and optimizer with each runner's step time
    and page faults, and braid's ratios."""
    result = subprocess.run(
        [os.environ["BRAID_BENCH"], "compute-tax", "--models", "mlp", "--optimizers", "adam",
         "--rounds", "1", "--steps", "6"],
        capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        fail(f"braid-bench compute-tax exited {result.returncode}", output)
    cell = r"\d+\.\d\d \(\d+\)"
    row = re.search(rf"^mlp +adam +({cell}) +({cell}) +(-|{cell}) +(\d+\.\d\d)x +(\d+\.\d\d)x$",
                    result.stdout, re.M)
    if not row:
        fail("no 'mlp adam' row with plain, braid and python cells and two ratios", output)
    if float(row.group(4)) <= 0 or float(row.group(5)) <= 0:
        fail("braid's ratios should be positive", output)
    print(result.stdout)


def main():
    paired_run()
    straggler_run()
    bench_table()
    balance_table()
    compute_tax_table()
    print("ok")


if __name__ == "__main__":
    main()
