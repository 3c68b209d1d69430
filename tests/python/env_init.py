#!/usr/bin/env python3
"""Run under braid-run or torchrun: PyTorch's default init_method (env://) joins the
"braid" backend from the variables the launcher sets, and an all_reduce sums the ranks."""
import os

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  (registers the "braid" backend)

dist.init_process_group("braid")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
rank, size = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]), f"rank {rank} is not RANK"
assert size == int(os.environ["WORLD_SIZE"]), f"world size {size}"
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
expected = size * (size + 1) / 2
assert torch.equal(t, torch.full((4,), expected)), f"all_reduce gave {t}, not {expected}"
print(f"rank {rank} of {size}: env:// all_reduce {t[0].item():g}")
dist.destroy_process_group()
