"""A training loop whose rank FAIL_RANK leaves after its first step, the way FAIL_MODE says,
while the others go on: what early_exit_test.py runs, under braid-run or with torchrun's
variables set by hand. The survivors must fail at once, naming that rank.

FAIL_MODE: "raise" (a Python exception reaches the top), "exit" (sys.exit(3)), "return"
(the loop ends early and the process group is destroyed cleanly, as on a rank given fewer
steps). FAIL_PLACE, what the others are doing when it leaves: "all_reduce" (a bare
collective), "ddp" (PyTorch DDP's bucket all-reduces in backward), "all_gather" (FSDP's
parameter gather), "p2p" (a pipeline: activations to the next rank, gradients back). The leaving rank prints "doomed_at_ns=<time.monotonic_ns()>" as it leaves."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  (registers the "braid" backend)

dist.init_process_group("braid", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
rank, size = dist.get_rank(), dist.get_world_size()
mode = os.environ.get("FAIL_MODE", "raise")
place = os.environ.get("FAIL_PLACE", "all_reduce")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model) if place == "ddp" else None


def step():
    if place == "all_reduce":
        dist.all_reduce(torch.ones(1024))
    elif place == "ddp":
        ddp(torch.randn(16, 32)).sum().backward()
    elif place == "all_gather":
        whole = torch.empty(1024 * size)
        dist.all_gather_into_tensor(whole, torch.ones(1024))
    elif place == "p2p":
        # Activations forward to the last rank and their gradient back, as a pipeline does.
        tensor = torch.ones(1024)
        if rank > 0:
            dist.recv(tensor, rank - 1)
        if rank + 1 < size:
            dist.send(tensor, rank + 1)
            dist.recv(tensor, rank + 1)
        if rank > 0:
            dist.send(tensor, rank - 1)
    else:
        raise ValueError(f"unknown FAIL_PLACE {place}")


for step_number in range(1000):
    if step_number == 1 and rank == int(os.environ["FAIL_RANK"]):
        print(f"doomed_at_ns={time.monotonic_ns()}", flush=True)
        if mode == "raise":
            raise ValueError(f"rank {rank} gives up at step {step_number}")
        if mode == "exit":
            sys.exit(3)
        break
    step()
dist.destroy_process_group()
