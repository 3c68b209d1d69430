#!/usr/bin/python3
"""PyTorch DDP (Gloo; NCCL on GPUs with --device cuda) on the model ddp_train trains, so `braid-bench ddp` can print braid's
DistributedDataParallel beside PyTorch's own in the same run.

    /usr/bin/python3 tools/braid_bench/peers/ddp_torch.py --ranks 2 --hidden 1024 --layers 8 \
        --batch 32 --steps 30

The model, data and optimizer mirror examples/ddp_train.cpp's MLP: hidden -> hidden x layers
-> hidden/2 -> 1 with ReLU, fresh N(0, 1) inputs per step, a tanh teacher on 16 features,
MSE loss, SGD (lr 0.01, momentum 0.9) or Adam (lr 1e-3), one intra-op thread per rank. DDP has its defaults (25 MiB buckets,
broadcast_buffers, gradients copied into the buckets and back), or with
--gradient-as-bucket-view gradient_as_bucket_view=True, as braid's default keeps them. Ranks are started here (torch.multiprocessing, spawn) on 127.0.0.1 with
Gloo on loopback; started once per rank by a launcher (RANK and WORLD_SIZE set: braid-run,
torchrun, across emulated nodes), the script runs that rank, rendezvous env://.

Steps are paired as in `braid-bench-ddp-worker --sync paired`: each pair is one synchronised step and
one under no_sync(), in alternating order, each started after a barrier and timed on its
slowest rank; the exposed communication is the mean of the pairs' differences.

Output, rank 0 only: one JSON line
  {"sync":"pytorch_ddp","parameters":N,"ranks":2,"step_ms":...,"none_step_ms":...,
   "exposed_ms":...,"exposed_ci_ms":...,"cpu_ms":...,"none_cpu_ms":...,"loss":...}
step_ms and none_step_ms are the means of the synchronised and the no_sync() steps after
the warm-up; exposed_ci_ms is the 95% confidence half-width; CPU times are the process's
(every thread), the mean over ranks.
"""
import argparse
import contextlib
import json
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Student's t for a two-sided 95% interval, by degrees of freedom (as braid-bench-ddp-worker's t95).
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(df):
    if df < 1:
        return 0.0
    if df <= 30:
        return T95[df - 1]
    return 2.000 if df <= 60 else 1.980 if df <= 120 else 1.960


def model(hidden, layers):
    body = []
    for _ in range(layers):
        body += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    body += [torch.nn.Linear(hidden, hidden // 2), torch.nn.ReLU(), torch.nn.Linear(hidden // 2, 1)]
    return torch.nn.Sequential(*body)


def backend_for(args):
    """Gloo on the CPU; on GPUs NCCL where every rank has one of its own, else Gloo (NCCL
    refuses two ranks on one GPU), as braid's DDP chooses between NCCL and staging."""
    if args.device == "cpu":
        return "gloo"
    return "nccl" if args.ranks <= torch.cuda.device_count() else "gloo"


def worker(rank, args, port):
    """`port`: the rendezvous on 127.0.0.1; None under a launcher (env://)."""
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as braid's runners (example_models::set_compute_threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    backend = backend_for(args)
    dist.init_process_group(backend,
                            init_method="env://" if port is None else f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.ranks)
    net = model(args.hidden, args.layers).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        net, device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=args.gradient_as_bucket_view)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(4242)
    teacher = (torch.randn(16, 1) / 4).to(device)
    # Paired steps, as braid-bench-ddp-worker --sync paired: pair k syncs first when k is even, second
    # when odd, the other step under no_sync(); every timed step starts after a barrier
    # and counts on its slowest rank.
    warmup = min(5, args.steps // 4) & ~1
    straggler = args.straggle_ms > 0 and rank == args.ranks - 1
    loss = torch.zeros(())
    wall, cpu, synced = [], [], []
    for step in range(args.steps):
        sync = step % 2 == (step // 2) % 2
        if step >= warmup:
            dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        torch.manual_seed(1000003 * (step + 1) + rank)
        x = torch.randn(args.batch, args.hidden).to(device)
        y = torch.tanh(x[:, :16] @ teacher * 2)
        with contextlib.ExitStack() as local:
            if not sync:
                local.enter_context(ddp.no_sync())
            # In place, as libtorch 1.13's zero_grad() in ddp_train: torch 2.x sets
            # gradients to None by default, which costs bucket views a copy each step.
            opt.zero_grad(set_to_none=False)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            if straggler:
                compute_for(args.straggle_ms)
            loss.backward()
            opt.step()
        loss.item()
        if step >= warmup:
            wall.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - cpu_start) * 1e3)
            synced.append(sync)
    # loss.item() above waited for the step's kernels, so on a GPU the times are its too.
    wall_t = torch.tensor(wall, dtype=torch.float64, device=device)
    cpu_t = torch.tensor(cpu, dtype=torch.float64, device=device)
    dist.all_reduce(wall_t, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu_t)
    cpu_t /= args.ranks
    if rank == 0:
        wall, cpu = wall_t.tolist(), cpu_t.tolist()
        mean = lambda v: sum(v) / max(len(v), 1)
        with_sync = [i for i, s in enumerate(synced) if s]
        without = [i for i, s in enumerate(synced) if not s]
        pairs = [(i, i + 1) if synced[i] else (i + 1, i) for i in range(0, len(wall) - 1, 2)]
        differences = [wall[a] - wall[b] for a, b in pairs]
        exposed = mean(differences)
        spread = (sum((d - exposed) ** 2 for d in differences) / (len(differences) - 1)
                  if len(differences) > 1 else 0.0)
        print(json.dumps({
            "sync": "pytorch_ddp",
            "nccl": 1 if backend == "nccl" else 0,
            "parameters": sum(p.numel() for p in net.parameters()),
            "ranks": args.ranks,
            "step_ms": mean([wall[i] for i in with_sync]),
            "cpu_ms": mean([cpu[i] for i in with_sync]),
            "none_step_ms": mean([wall[i] for i in without]),
            "none_cpu_ms": mean([cpu[i] for i in without]),
            "pairs": len(pairs),
            "exposed_ms": exposed,
            "exposed_ci_ms": t95(len(differences) - 1) * math.sqrt(
                spread / max(len(differences), 1)),
            "exposed_cpu_ms": mean([cpu[a] - cpu[b] for a, b in pairs]),
            "loss": loss.item()}), flush=True)
    dist.destroy_process_group()


def compute_for(ms):
    """Keeps this core busy for `ms` milliseconds (ddp_train's --straggle-ms)."""
    until = time.perf_counter() + ms / 1e3
    while time.perf_counter() < until:
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="sgd")
    parser.add_argument("--straggle-ms", type=float, default=0.0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: rank r on GPU r modulo the GPUs, NCCL where each has one")
    parser.add_argument("--gradient-as-bucket-view", action="store_true",
                        help="DDP's gradient_as_bucket_view=True (default: PyTorch's, False)")
    args = parser.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # Started once per rank by a launcher (braid-run, torchrun: across emulated nodes),
        # which set the rendezvous (env://) and, across nodes, GLOO_SOCKET_IFNAME.
        if int(os.environ["WORLD_SIZE"]) != args.ranks:
            sys.exit(f"ddp_torch: --ranks {args.ranks} but WORLD_SIZE={os.environ['WORLD_SIZE']}")
        worker(int(os.environ["RANK"]), args, None)
        return
    mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
