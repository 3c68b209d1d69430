"""PyTorch's own parallelism, one program per case, run on the backend named on the command
line: what tests/python/torch_parallelism_test.py runs on "gloo" and on "braid" and compares.

    python torch_parallelism.py CASE BACKEND RANK WORLD_SIZE PORT OUT_DIR

Each rank trains a small model for a few steps with the same seed and data on either
backend, then writes the parameters it starts and ends with (full tensors, gathered where
the case shards them) to OUT_DIR/RANK.pt as {"start": ..., "end": ...}. Cases: ddp, ddp_no_sync, ddp_find_unused,
ddp_static_graph, ddp_compiled, fsdp2, tensor_parallel, pipeline."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import braid_torch  # noqa: F401  (registers the "braid" backend)

STEPS = 4
WIDTH = 16


def mlp(width=WIDTH, depth=3):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


class Stack(nn.Module):
    """The MLP with a forward of its own: Dynamo compiles frames of user code, not of
    torch.nn's own classes (an nn.Sequential inside DDP would run uncompiled)."""

    def __init__(self, width, depth):
        super().__init__()
        self.layers = mlp(width, depth)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def batch(rank, step, rows=8, width=WIDTH):
    """The same batch for a (rank, step) on every backend; different across ranks."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(rows, width, generator=generator), torch.randn(rows, 1, generator=generator)


def named_full_parameters(model):
    """Parameters as plain tensors: a DTensor (FSDP2, tensor parallelism) gathered whole."""
    full = {}
    for name, parameter in model.named_parameters():
        value = parameter.detach()
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        full[name] = value.clone()
    return full


def train_ddp(rank, model, steps=STEPS, optimizer=None, loss_of=None, **ddp_options):
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(model, **ddp_options)
    start = named_full_parameters(model)
    optimizer = optimizer or torch.optim.SGD(ddp.parameters(), lr=0.05)
    loss_of = loss_of or (lambda module, x, y, step: nn.functional.mse_loss(module(x), y))
    for step in range(steps):
        x, y = batch(rank, step)
        optimizer.zero_grad()
        loss_of(ddp, x, y, step).backward()
        optimizer.step()
    return start, named_full_parameters(ddp.module)


def case_ddp(rank, size):
    return train_ddp(rank, mlp())


def case_ddp_static_graph(rank, size):
    return train_ddp(rank, mlp(), static_graph=True)


def case_ddp_no_sync(rank, size):
    """Two micro-batches a step: the first accumulates locally under no_sync(), the second's
    backward reduces the sum."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(mlp())
    start = named_full_parameters(ddp.module)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(rank, 2 * step)
        with ddp.no_sync():
            nn.functional.mse_loss(ddp(x), y).backward()
        x, y = batch(rank, 2 * step + 1)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    return start, named_full_parameters(ddp.module)


class Branches(nn.Module):
    """A trunk and two heads, one used a step: DDP must find the other's parameters unused
    every step and still reduce the rest."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(WIDTH, WIDTH)
        self.first = nn.Linear(WIDTH, 1)
        self.second = nn.Linear(WIDTH, 1)

    def forward(self, x, head):
        hidden = torch.tanh(self.trunk(x))
        return self.first(hidden) if head == 0 else self.second(hidden)


def case_ddp_find_unused(rank, size):
    loss_of = lambda module, x, y, step: nn.functional.mse_loss(module(x, step % 2), y)
    return train_ddp(rank, Branches(), loss_of=loss_of, find_unused_parameters=True)


def case_ddp_compiled(rank, size):
    """torch.compile (Inductor) over a DDP-wrapped model with Adam: layers of 1 MiB in
    buckets of 1 MiB, so DDPOptimizer splits the graph at the buckets and the backend's
    all-reduces run between compiled pieces."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    width = 512
    ddp = DDP(Stack(width, depth=2), bucket_cap_mb=1)
    start = named_full_parameters(ddp.module)
    compiled = torch.compile(ddp)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.001)
    for step in range(STEPS):
        x, y = batch(rank, step, width=width)
        optimizer.zero_grad()
        nn.functional.mse_loss(compiled(x), y).backward()
        optimizer.step()
    from torch._dynamo.utils import counters
    assert counters["inductor"], "torch.compile compiled nothing: the test would not test it"
    return start, named_full_parameters(ddp.module)


def case_fsdp2(rank, size):
    """fully_shard on every linear layer and the root, Adam."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (size,))
    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    start = named_full_parameters(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = batch(rank, step)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return start, named_full_parameters(model)


def case_tensor_parallel(rank, size):
    """A feed-forward block over DTensor: the up projection column-wise, the down projection
    row-wise (Megatron's split), every rank on the same batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(WIDTH, 4 * WIDTH)
            self.down = nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    mesh = init_device_mesh("cpu", (size,))
    model = parallelize_module(FeedForward(), mesh,
                               {"up": ColwiseParallel(), "down": RowwiseParallel()})
    start = named_full_parameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, _ = batch(0, step)  # tensor parallelism: one batch, split weights
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), torch.ones_like(x)).backward()
        optimizer.step()
    return start, named_full_parameters(model)


def case_pipeline(rank, size):
    """torch.distributed.pipelining: the MLP cut in two stages, one per rank, GPipe over four
    micro-batches; the last stage computes the loss."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    model = mlp(depth=4)
    cut = len(model) // 2
    stage_module = model[:cut] if rank == 0 else model[cut:]
    # Shapes are inferred at the first step, from the real inputs sent between the stages.
    start = named_full_parameters(stage_module)
    stage = PipelineStage(stage_module, rank, size, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4,
                             loss_fn=lambda output, target: nn.functional.mse_loss(output, target))
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(0, step)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        optimizer.step()
    return start, named_full_parameters(stage_module)


CASES = {name[len("case_"):]: function for name, function in globals().items()
         if name.startswith("case_")}


def main():
    case, backend, rank, size, port, out_dir = sys.argv[1:7]
    rank, size = int(rank), int(size)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.manual_seed(0)
    dist.init_process_group(backend, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    start, end = CASES[case](rank, size)
    torch.save({"start": start, "end": end}, os.path.join(out_dir, f"{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
