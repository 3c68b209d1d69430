#!/usr/bin/env python3
"""The 3D job's invariant: with the same --seed and --global-batch, examples/train_3d prints
the same loss at every step, and the same final parameter checksum, for every layout and
schedule (to float rounding): one rank; pp 2 under GPipe, 1F1B, interleaved 1F1B (two
stages per rank) and ZB-H1; tp 2; tp 2 x pp 2; and tp 2 x pp 2 x dp 2 on 8 ranks. The
loss falls. And bad input is one clear line: a layer count that does not split over the
stages, a grid that does not make the world.

Paths from the environment (meson sets them): BRAID_RUN, TRAIN_3D.
"""
import os
import re
import subprocess
import sys

COMMON = ["--steps", "4", "--layers", "4", "--hidden", "32", "--heads", "4", "--vocab", "32",
          "--seq", "8", "--global-batch", "8", "--microbatches", "4", "--seed", "3"]


def fail(message, output=""):
    print(output)
    print("FAIL:", message)
    sys.exit(1)


def run(ranks, args, expect_ok=True):
    result = subprocess.run([os.environ["BRAID_RUN"], "-n", str(ranks), os.environ["TRAIN_3D"]]
                            + args, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    if expect_ok and result.returncode != 0:
        fail(f"train_3d {' '.join(args)} on {ranks} ranks exited {result.returncode}", output)
    return result.returncode, output


def figures(output):
    losses = [float(m) for m in re.findall(r"step +\d+/\d+ +loss (\S+)", output)]
    checksum = re.search(r"sum of squares (\S+)", output)
    if len(losses) != 4 or not checksum:
        fail("expected 4 losses and a checksum", output)
    return losses, float(checksum.group(1)), output


def close(a, b, tolerance=2e-4):
    return abs(a - b) <= tolerance * max(1.0, abs(b))


layouts = [
    (1, []),
    (2, ["--pp", "2", "--schedule", "gpipe"]),
    (2, ["--pp", "2", "--schedule", "1f1b"]),
    (2, ["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2"]),
    (2, ["--pp", "2", "--schedule", "zb"]),
    (2, ["--tp", "2"]),
    (4, ["--tp", "2", "--pp", "2"]),
    (8, ["--tp", "2", "--pp", "2", "--dp", "2"]),
]
reference = None
for ranks, args in layouts:
    losses, checksum, output = figures(run(ranks, args + COMMON)[1])
    if reference is None:
        reference = (losses, checksum)
        if not losses[-1] < losses[0]:
            fail("the loss should fall", output)
        continue
    for step, (got, want) in enumerate(zip(losses, reference[0])):
        if not close(got, want):
            fail(f"{ranks} ranks {' '.join(args)}: step {step + 1} loss {got} differs from one "
                 f"rank's {want}", output)
    if not close(checksum, reference[1]):
        fail(f"{ranks} ranks {' '.join(args)}: parameter checksum {checksum} differs from one "
             f"rank's {reference[1]}", output)
    print(f"ok: {ranks} ranks {' '.join(args)}: losses {losses}")

code, output = run(2, COMMON + ["--pp", "2", "--layers", "3"], expect_ok=False)
if code == 0 or "--layers 3 does not split evenly over 2 stages" not in output:
    fail("an uneven layer split should be refused, naming --stage-layers", output)
code, output = run(2, COMMON + ["--tp", "4"], expect_ok=False)
if code == 0 or "world" not in output:
    fail("a grid larger than the world should be refused", output)
print("ok: refusals")
