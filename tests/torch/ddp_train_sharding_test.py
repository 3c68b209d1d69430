#!/usr/bin/env python3
"""The main job under every --sharding on 2 ranks, from one seed: each run succeeds, its loss
falls, and optimizer, grad, full and no_shard end on none's (DDP's) loss within 1e-4, since
they compute the same step; each prints the model state per rank, estimated then held, and
the sharded ones hold less optimizer state than DDP. Without --sharding the main job prints
no memory lines (its output as before); a sharding with --uneven is refused.

Paths from the environment (meson sets them): BRAID_RUN, DDP_TRAIN.
"""
import os
import re
import subprocess
import sys

RUN = [os.environ["BRAID_RUN"], "-n", "2", os.environ["DDP_TRAIN"], "--steps", "30",
       "--seed", "7", "--hidden", "64", "--layers", "3"]
LOSS = re.compile(r"loss (\d+\.\d+) -> (\d+\.\d+)")
HELD = re.compile(r"model state per rank, held .*optimizer state (\d+\.\d+) MiB, total "
                  r"(\d+\.\d+) MiB; peak resident size \(VmHWM\) (\d+\.\d+) MiB")


def fail(message, output=""):
    print(output)
    print("FAIL:", message)
    sys.exit(1)


def run(args):
    result = subprocess.run(RUN + args, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        fail(f"ddp_train {' '.join(args)} exited {result.returncode}", output)
    return output


losses = {}
optimizer_state = {}
for sharding in ["none", "optimizer", "grad", "full", "no_shard"]:
    output = run(["--sharding", sharding])
    loss = LOSS.search(output)
    if not loss:
        fail(f"--sharding {sharding}: no loss line", output)
    first, last = float(loss.group(1)), float(loss.group(2))
    if not last < first:
        fail(f"--sharding {sharding}: the loss did not fall ({first} -> {last})", output)
    if "model state per rank, estimated" not in output:
        fail(f"--sharding {sharding}: no estimate", output)
    held = HELD.search(output)
    if not held or not float(held.group(2)) > 0 or not float(held.group(3)) > 0:
        fail(f"--sharding {sharding}: no held model state and peak resident size", output)
    losses[sharding] = last
    optimizer_state[sharding] = float(held.group(1))
    print(f"--sharding {sharding}: loss {first} -> {last}, held {held.group(2)} MiB")
for sharding in ["optimizer", "grad", "full", "no_shard"]:
    if abs(losses[sharding] - losses["none"]) > 1e-4:
        fail(f"--sharding {sharding} ends on loss {losses[sharding]}, DDP on {losses['none']}")
    sharded = sharding != "no_shard"
    if sharded and not optimizer_state[sharding] < optimizer_state["none"]:
        fail(f"--sharding {sharding} holds as much optimizer state as DDP")

default = run([])
if "model state" in default:
    fail("without --sharding the main job printed memory lines", default)
refused = subprocess.run(RUN + ["--sharding", "full", "--uneven", "2"], capture_output=True,
                         text=True, timeout=60)
if refused.returncode == 0 or "need --sharding none" not in refused.stderr + refused.stdout:
    fail("--sharding full --uneven 2 was not refused", refused.stdout + refused.stderr)
print("ok")
