"""A training loop whose rank FAIL_RANK raises a Python exception after its first step,
while the others go on all-reducing: what early_exit_test.py runs, under braid-run or with
torchrun's variables set by hand. The survivors must fail at once, naming that rank."""

import datetime
import os

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  (registers the "braid" backend)

dist.init_process_group("braid", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
for step in range(1000):
    if step == 1 and rank == int(os.environ["FAIL_RANK"]):
        raise ValueError(f"rank {rank} gives up at step {step}")
    t = torch.ones(1024)
    dist.all_reduce(t)
dist.destroy_process_group()
