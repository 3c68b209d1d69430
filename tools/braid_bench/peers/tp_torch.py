#!/usr/bin/python3
"""Megatron-style tensor parallelism in PyTorch over Gloo, the same transformer blocks
braid-bench-tp-worker trains, so `braid-bench tp` can print braid's TP beside PyTorch's in
the same run.

    /usr/bin/python3 tools/braid_bench/peers/tp_torch.py --ranks 2 --hidden 256 --heads 8 \
        --layers 2 --seq 64 --batch 4 --steps 20

Each block is braid::torch::ParallelTransformerBlock's: pre-LayerNorm causal self-attention
with heads split across the ranks (QKV column-parallel, projection row-parallel), then an
MLP (column-parallel to 4h, GELU, row-parallel back), activations [s, b, h]. The mappings
are Megatron-Core's autograd functions (copy to / reduce from the tensor-parallel region)
over torch.distributed.all_reduce, as Megatron-Core runs them without its fused
gradient-accumulation kernels: the column-parallel layer's input gradient is all-reduced
in its backward, synchronously. Forward and backward of the loss (mean square of the
output) are timed per step, each started after a barrier and timed on the slowest rank;
the time inside all_reduce is the exposed communication (Gloo's calls block the training
thread). One intra-op thread per rank. Ranks are started here (torch.multiprocessing,
spawn) with Gloo on loopback.

Output, rank 0 only: one JSON line
  {"tp_step":1,"runner":"torch_gloo","ranks":2,"step_ms":...,"exposed_ms":...}
"""
import argparse
import json
import math
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COMM_SECONDS = [0.0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def all_reduce(t):
    if dist.get_world_size() == 1:
        return t
    started = time.perf_counter()
    dist.all_reduce(t)
    COMM_SECONDS[0] += time.perf_counter() - started
    return t


class CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g.contiguous().clone())


class ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return all_reduce(x.contiguous().clone())

    @staticmethod
    def backward(ctx, g):
        return g


class ColumnParallelLinear(torch.nn.Module):
    def __init__(self, inp, out, ranks):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(out // ranks, inp).uniform_(-1, 1) / math.sqrt(inp))
        self.bias = torch.nn.Parameter(torch.zeros(out // ranks))

    def forward(self, x):
        return torch.nn.functional.linear(CopyToRegion.apply(x), self.weight, self.bias)


class RowParallelLinear(torch.nn.Module):
    def __init__(self, inp, out, ranks):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(out, inp // ranks).uniform_(-1, 1) / math.sqrt(inp))
        self.bias = torch.nn.Parameter(torch.zeros(out))

    def forward(self, x):
        return ReduceFromRegion.apply(torch.nn.functional.linear(x, self.weight)) + self.bias


class Block(torch.nn.Module):
    def __init__(self, hidden, heads, ranks):
        super().__init__()
        self.hidden, self.heads, self.ranks = hidden, heads, ranks
        self.ln1 = torch.nn.LayerNorm(hidden)
        self.qkv = ColumnParallelLinear(hidden, 3 * hidden, ranks)
        self.proj = RowParallelLinear(hidden, hidden, ranks)
        self.ln2 = torch.nn.LayerNorm(hidden)
        self.fc1 = ColumnParallelLinear(hidden, 4 * hidden, ranks)
        self.fc2 = RowParallelLinear(4 * hidden, hidden, ranks)

    def attention(self, qkv):
        s, b, _ = qkv.shape
        d = self.hidden // self.heads
        local = self.heads // self.ranks
        q, k, v = qkv.view(s, b, local, 3, d).permute(3, 1, 2, 0, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        context = torch.softmax(scores, -1) @ v
        return context.permute(2, 0, 1, 3).reshape(s, b, local * d)

    def forward(self, x):
        h = x + self.proj(self.attention(self.qkv(self.ln1(x))))
        return h + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(h))))


def worker(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as braid's runners (example_models::set_compute_threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    blocks = torch.nn.ModuleList(Block(args.hidden, args.heads, args.ranks) for _ in range(args.layers))
    x = torch.randn(args.seq, args.batch, args.hidden)
    warmup = min(3, args.steps // 4)
    step_ms, comm_ms = [], []
    for step in range(args.steps):
        dist.barrier()
        COMM_SECONDS[0] = 0.0
        started = time.perf_counter()
        for p in blocks.parameters():
            p.grad = None
        h = x
        for block in blocks:
            h = block(h)
        h.square().mean().backward()
        elapsed = time.perf_counter() - started
        if step >= warmup:
            step_ms.append(elapsed * 1e3)
            comm_ms.append(COMM_SECONDS[0] * 1e3)
    times = torch.tensor(step_ms, dtype=torch.float64)
    comms = torch.tensor(comm_ms, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(comms)
    if rank == 0:
        results.put({"tp_step": 1, "runner": "torch_gloo", "ranks": args.ranks,
                     "step_ms": round(times.median().item(), 3),
                     "exposed_ms": round(comms.mean().item() / args.ranks, 3)})
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    for name, default in [("ranks", 2), ("hidden", 256), ("heads", 8), ("layers", 2), ("seq", 64),
                          ("batch", 4), ("steps", 20)]:
        parser.add_argument("--" + name, type=int, default=default)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=worker, args=(r, args, port, results)) for r in range(args.ranks)]
    for p in processes:
        p.start()
    result = results.get(timeout=600)
    for p in processes:
        p.join()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
