"""A training loop whose rank FAIL_RANK leaves after its first step, the way FAIL_MODE says,
while the others go on all-reducing: what early_exit_test.py runs, under braid-run or with
torchrun's variables set by hand. The survivors must fail at once, naming that rank.

FAIL_MODE: "raise" (a Python exception reaches the top), "exit" (sys.exit(3)), "return"
(the loop ends early and the process group is destroyed cleanly, as on a rank given fewer
steps). The leaving rank prints "doomed_at_ns=<time.monotonic_ns()>" as it leaves."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  (registers the "braid" backend)

dist.init_process_group("braid", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
mode = os.environ.get("FAIL_MODE", "raise")
for step in range(1000):
    if step == 1 and rank == int(os.environ["FAIL_RANK"]):
        print(f"doomed_at_ns={time.monotonic_ns()}", flush=True)
        if mode == "raise":
            raise ValueError(f"rank {rank} gives up at step {step}")
        if mode == "exit":
            sys.exit(3)
        break
    t = torch.ones(1024)
    dist.all_reduce(t)
dist.destroy_process_group()
