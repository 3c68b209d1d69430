#!/usr/bin/python3
"""torch.distributed's Gloo collectives, measured the way nccl-tests measures, so that
`braid-bench collectives` can print braid beside Gloo in the same run.

    /usr/bin/python3 tools/braid_bench/peers/gloo_collectives.py --ranks P \
        --ops all_reduce --min-bytes 8 --max-bytes 64M

braid-bench runs it with a python3 that can import torch.distributed (subprocess.cpp, torch_python).
The script starts its P ranks itself (torch.multiprocessing, spawn), on 127.0.0.1 at a free
port, each with one intra-op thread, and Gloo's sockets on loopback (GLOO_SOCKET_IFNAME=lo
unless already set), so it needs no network. Started once per rank by a launcher instead
(RANK and WORLD_SIZE set: braid-run, torchrun), it runs that rank, rendezvous env://: how
braid-bench runs it across emulated nodes.

Output: one JSON object per line on stdout, from rank 0 only (diagnostics on stderr):
  {"peer":"gloo","op":"all_reduce","ranks":2,"bytes":1048576,"count":262144,"dtype":"f32",
   "iters":50,"time_us":123.4,"algbw_gbps":8.5,"busbw_gbps":8.5,"wrong":0}
with the same meaning as braid-bench-mpi-peer's (tools/braid_bench/peers/README.md).

Each op uses the first call in FORMS that the installed Gloo accepts: all_gather takes
all_gather_into_tensor where Gloo has it, else all_gather into views of one output tensor
(older torch), which is what a torch user writes there. An op with no accepted call gets
no rows and a note on stderr.
"""
import argparse
import json
import os
import re
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
       "all_to_all", "all_gather_v", "all_to_all_v", "barrier")
# Ops that cut the buffer into one block per rank: count must divide by ranks.
SPLIT_OPS = set(OPS) - {"all_reduce", "broadcast", "reduce", "barrier"}
WARMUP_ITERS = 3
MIN_ITERS = 5
MAX_ITERS = 100000
TARGET_SECONDS = 0.2  # timed work per size when --iters is not given
SENTINEL = -1.0  # outputs are cleared to this; no expected value is negative
F32 = 4


def parse_bytes(text):
    """'64M' -> 67108864. K, M, G are powers of 1024; a trailing 'B' or 'iB' is accepted."""
    match = re.fullmatch(r"(\d+)(?:([kKmMgG])i?)?[bB]?", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    scale = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[
        match.group(2) and match.group(2).lower()]
    return int(match.group(1)) * scale


def parse_ops(text):
    ops = text.split(",")
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown ops {unknown}; known: {','.join(OPS)}")
    return ops


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--ops", type=parse_ops, default=list(OPS))
    parser.add_argument("--min-bytes", type=parse_bytes, default=8)
    parser.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    parser.add_argument("--iters", type=int, default=0, help="fixed count; default adaptive")
    args = parser.parse_args(argv)
    if args.ranks < 1 or args.iters < 0 or not 0 < args.min_bytes <= args.max_bytes:
        parser.error("need --ranks >= 1, --iters >= 0 and 0 < --min-bytes <= --max-bytes")
    return args


def input_values(rank, count, offset=0):
    """(rank + 1) * (i % 7 + 1): small integers, so every sum over ranks is exact in f32."""
    return ((torch.arange(offset, offset + count) % 7 + 1) * (rank + 1)).float()


def reduced_values(ranks, count, offset=0):
    return sum(input_values(rank, count, offset) for rank in range(ranks))


def uneven_counts(total, ranks, shift):
    """`total` cut into `ranks` uneven parts, as braid-bench cuts them: part j weighs
    ((j + shift) % P) + 1 of P(P+1)/2, rounded down, the last taking the remainder.
    all_gather_v: rank r contributes part r (shift 0); all_to_all_v: rank s sends part d of
    its input to rank d (shift s)."""
    weights = ranks * (ranks + 1) // 2
    counts = [total * ((j + shift) % ranks + 1) // weights for j in range(ranks - 1)]
    return counts + [total - sum(counts)]


def bus_factor(op, ranks):
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op in SPLIT_OPS:
        return (ranks - 1) / ranks
    return 1.0


# The calls that do each op, in order of preference: the first one this Gloo accepts is used.
FORMS = {
    "all_reduce": [("all_reduce", lambda case: dist.all_reduce(case.out))],
    "all_gather": [
        ("all_gather_into_tensor", lambda case: dist.all_gather_into_tensor(case.out, case.inp)),
        ("all_gather", lambda case: dist.all_gather(case.out_parts, case.inp))],
    "reduce_scatter": [
        ("reduce_scatter_tensor", lambda case: dist.reduce_scatter_tensor(case.out, case.inp)),
        ("reduce_scatter", lambda case: dist.reduce_scatter(case.out, case.inp_parts))],
    "broadcast": [("broadcast", lambda case: dist.broadcast(case.out, src=0))],
    "reduce": [("reduce", lambda case: dist.reduce(case.out, dst=0))],
    "gather": [("gather", lambda case: dist.gather(
        case.inp, case.out_parts if case.rank == 0 else None, dst=0))],
    "scatter": [("scatter", lambda case: dist.scatter(
        case.out, case.inp_parts if case.rank == 0 else None, src=0))],
    "all_to_all": [("all_to_all_single", lambda case: dist.all_to_all_single(case.out, case.inp))],
    "all_gather_v": [("all_gather", lambda case: dist.all_gather(case.out_parts, case.inp))],
    "all_to_all_v": [("all_to_all_single", lambda case: dist.all_to_all_single(
        case.out, case.inp, output_split_sizes=case.recv_counts,
        input_split_sizes=case.send_counts))],
    "barrier": [("barrier", lambda case: dist.barrier())],
}


class Case:
    """The buffers of one (op, size) and the three things done with them: `run` one call
    (through `form`, one of FORMS[op]), `reset` inputs and clear outputs, count the `wrong`
    elements after a call. `count` elements of the buffer `bytes` describes; `block` =
    count / ranks."""

    def __init__(self, op, form, nbytes, rank, ranks):
        self.op, self.form, self.rank, self.ranks = op, form, rank, ranks
        self.count = nbytes // F32
        self.block = self.count // ranks
        count, block = self.count, self.block
        self.inp = self.out = None
        # Per-rank parts of the output (input) in rank order, for the list forms.
        out_counts = in_counts = [block] * ranks
        if op in ("all_reduce", "broadcast", "reduce"):
            self.inp = self.out = torch.empty(count)  # in place: torch has no other form
        elif op in ("all_gather", "gather"):
            # gather's root only has an output; the others still pass their input.
            self.inp, self.out = torch.empty(block), torch.empty(count)
        elif op in ("reduce_scatter", "scatter"):
            self.inp, self.out = torch.empty(count), torch.empty(block)
        elif op == "all_to_all":
            self.inp, self.out = torch.empty(count), torch.empty(count)
        elif op == "all_gather_v":
            out_counts = uneven_counts(count, ranks, 0)
            self.inp, self.out = torch.empty(out_counts[rank]), torch.empty(count)
        elif op == "all_to_all_v":
            self.send_counts = in_counts = uneven_counts(count, ranks, rank)
            self.recv_counts = out_counts = [uneven_counts(count, ranks, source)[rank]
                                             for source in range(ranks)]
            self.inp, self.out = torch.empty(count), torch.empty(sum(out_counts))
        def parts(tensor, counts):  # only where the buffer is the one split across ranks
            if tensor is None or tensor.numel() != sum(counts):
                return []
            return list(tensor.split(counts))
        self.inp_parts, self.out_parts = parts(self.inp, in_counts), parts(self.out, out_counts)
        self.out_counts = out_counts
        self.reset()

    def run(self):
        self.form(self)

    def reset(self):
        if self.op == "barrier":
            return
        self.out.fill_(SENTINEL)
        if self.op == "broadcast":
            if self.rank == 0:
                self.inp.copy_(input_values(0, self.count))
        elif self.op == "scatter":
            self.inp.copy_(input_values(0, self.count))  # only the root's is sent
        else:
            self.inp.copy_(input_values(self.rank, self.inp.numel()))

    def expected(self):
        op, rank, ranks, count, block = self.op, self.rank, self.ranks, self.count, self.block
        if op in ("all_reduce", "reduce"):
            return reduced_values(ranks, count)
        if op == "all_gather":
            return torch.cat([input_values(source, block) for source in range(ranks)])
        if op == "reduce_scatter":
            return reduced_values(ranks, block, offset=rank * block)
        if op == "broadcast":
            return input_values(0, count)
        if op == "gather":
            return torch.cat([input_values(source, block) for source in range(ranks)])
        if op == "scatter":
            return input_values(0, block, offset=rank * block)
        if op == "all_gather_v":
            return torch.cat([input_values(source, part)
                              for source, part in enumerate(self.out_counts)])
        if op == "all_to_all_v":
            # part s came from rank s: the piece of its input it cut for this rank
            return torch.cat([input_values(source, part,
                                           offset=sum(uneven_counts(count, ranks, source)[:rank]))
                              for source, part in enumerate(self.out_counts)])
        # all_to_all: block s came from rank s, which sent its [rank*block, (rank+1)*block)
        return torch.cat([input_values(source, block, offset=rank * block)
                          for source in range(ranks)])

    def wrong(self):
        if self.op == "barrier" or (self.op in ("reduce", "gather") and self.rank != 0):
            return 0
        return int((self.out != self.expected()).sum())


def choose_form(op, rank, ranks):
    """The first of FORMS[op] that every rank can run, tried once on a small buffer; None
    when there is none. Gloo refuses a call it lacks before sending anything, so a refusal
    cannot leave a peer waiting."""
    refusals = []
    for name, form in FORMS[op]:
        try:
            Case(op, form, F32 * ranks, rank, ranks).run()
            ok = 1
        except (RuntimeError, AttributeError) as error:  # AttributeError: older torch
            refusals.append(f"{name}: {error}")
            ok = 0
        agreed = torch.tensor([ok])
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        if agreed.item():
            if refusals and rank == 0:
                print(f"gloo_collectives: {op} uses {name} ({'; '.join(refusals)})",
                      file=sys.stderr, flush=True)
            return form
    if rank == 0:
        print(f"gloo_collectives: skipping {op}, not supported by this Gloo "
              f"({'; '.join(refusals)})", file=sys.stderr, flush=True)
    return None


def max_over_ranks(seconds):
    slowest = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()


def warm_up(case, fixed_iters, rank):
    """Runs the warm-up; without --iters, rank 0 sizes the timed loop from the slowest
    rank's last two warm-up calls (the first pays for page faults) and broadcasts it."""
    case.run()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(WARMUP_ITERS - 1):
        case.run()
    per_call = max_over_ranks(time.perf_counter() - start) / (WARMUP_ITERS - 1)
    if fixed_iters:
        return fixed_iters
    iters = torch.tensor([MAX_ITERS])
    if rank == 0 and per_call * MAX_ITERS > TARGET_SECONDS:
        iters[0] = max(MIN_ITERS, int(TARGET_SECONDS / per_call))
    dist.broadcast(iters, src=0)
    return int(iters.item())


def measure(op, form, nbytes, rank, ranks, fixed_iters):
    case = Case(op, form, nbytes, rank, ranks)
    iters = warm_up(case, fixed_iters, rank)
    # A tenth of the loop again, untimed (~20 ms), as braid does: the processes settle.
    for _ in range(max(iters // 10, 10)):
        case.run()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        case.run()
    slowest = max_over_ranks(time.perf_counter() - start)

    # In-place ops kept reducing into their own output while timed; verify one fresh call.
    case.reset()
    case.run()
    wrong = torch.tensor([case.wrong()])
    dist.all_reduce(wrong)
    if rank != 0:
        return
    time_us = slowest / iters * 1e6
    algbw = nbytes / time_us / 1e3  # GB/s, 1e9 bytes
    row = {"peer": "gloo", "op": op, "ranks": ranks, "bytes": nbytes, "count": case.count,
           "dtype": "f32", "iters": iters, "time_us": round(time_us, 3),
           "algbw_gbps": significant(algbw), "busbw_gbps": significant(algbw * bus_factor(op, ranks)),
           "wrong": int(wrong.item())}
    print(json.dumps(row, separators=(",", ":")), flush=True)


def significant(value):
    """Six significant digits, so the bandwidth of an 8-byte call does not print as 0."""
    return float(f"{value:.6g}")


def sizes(op, ranks, min_bytes, max_bytes):
    """Doubling from min to max; split ops round down to whole f32 elements per rank and
    skip a size where a rank would get none, the others need one element."""
    granule = F32 * (ranks if op in SPLIT_OPS else 1)
    size = min_bytes
    while size <= max_bytes:
        if size >= granule:
            yield size // granule * granule
        size *= 2


def worker(rank, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    try:
        for op in args.ops:
            form = choose_form(op, rank, args.ranks)
            if form is None:
                continue
            if op == "barrier":
                measure(op, form, 0, rank, args.ranks, args.iters)
                continue
            for nbytes in sizes(op, args.ranks, args.min_bytes, args.max_bytes):
                measure(op, form, nbytes, rank, args.ranks, args.iters)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv):
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # Started once per rank by a launcher (braid-run, torchrun: across emulated nodes),
        # which set the rendezvous (env://) and, across nodes, GLOO_SOCKET_IFNAME.
        if int(os.environ["WORLD_SIZE"]) != args.ranks:
            print(f"gloo_collectives: --ranks {args.ranks} but WORLD_SIZE="
                  f"{os.environ['WORLD_SIZE']}", file=sys.stderr)
            return 2
        worker(int(os.environ["RANK"]), args)
        return 0
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        mp.spawn(worker, args=(args,), nprocs=args.ranks, join=True)
    except mp.ProcessException as error:
        print(f"gloo_collectives: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
