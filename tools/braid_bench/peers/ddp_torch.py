#!/usr/bin/python3
"""PyTorch DDP with Gloo on the model ddp_train trains, so `braid-bench ddp` can print braid's
DistributedDataParallel beside PyTorch's own in the same run.

    /usr/bin/python3 tools/braid_bench/peers/ddp_torch.py --ranks 2 --hidden 1024 --layers 8 \
        --batch 32 --steps 30

The model, data and optimizer mirror examples/ddp_train.cpp's MLP: hidden -> hidden x layers
-> hidden/2 -> 1 with ReLU, fresh N(0, 1) inputs per step, a tanh teacher on 16 features,
MSE loss, SGD (lr 0.01, momentum 0.9) or Adam (lr 1e-3), one intra-op thread per rank. DDP has its defaults (25 MiB buckets,
broadcast_buffers). Ranks are started here (torch.multiprocessing, spawn) on 127.0.0.1 with
Gloo on loopback.

Output, rank 0 only: one JSON line
  {"sync":"pytorch_ddp","parameters":N,"ranks":2,"step_ms":...,"loss":...}
step_ms is the mean over the steps after the warm-up, the slowest rank's.
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model(hidden, layers):
    body = []
    for _ in range(layers):
        body += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    body += [torch.nn.Linear(hidden, hidden // 2), torch.nn.ReLU(), torch.nn.Linear(hidden // 2, 1)]
    return torch.nn.Sequential(*body)


def worker(rank, args, port):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.ranks)
    net = model(args.hidden, args.layers)
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(4242)
    teacher = torch.randn(16, 1) / 4
    warmup = min(5, args.steps // 4)
    loss = torch.zeros(())
    for step in range(args.steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        torch.manual_seed(1000003 * (step + 1) + rank)
        x = torch.randn(args.batch, args.hidden)
        y = torch.tanh(x[:, :16] @ teacher * 2)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    elapsed = torch.tensor([(time.perf_counter() - start) / (args.steps - warmup)])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"sync": "pytorch_ddp",
                          "parameters": sum(p.numel() for p in net.parameters()),
                          "ranks": args.ranks, "step_ms": elapsed.item() * 1e3,
                          "loss": loss.item()}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="sgd")
    args = parser.parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
