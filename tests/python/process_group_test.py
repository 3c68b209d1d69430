"""braid as a torch.distributed backend (braid_torch): every collective it implements gives
what the Gloo backend gives in the same run, on 2 and 3 processes and over four dtypes;
DistributedDataParallel trained on "braid" ends with the parameters it ends with on
"gloo"; bad arguments raise a RuntimeError naming the rank and the operation, and a
killed rank fails the survivors' work naming it.

Each test spawns its ranks with torch.multiprocessing; the default group is braid's and
a Gloo group over the same ranks is the reference. Run by meson with PYTHONPATH naming the
build's python/ folder (where braid_torch is)."""

import datetime
import os
import socket
import sys
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import braid_torch  # noqa: F401  (registers the "braid" backend)

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank, size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("braid", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    return dist.new_group(backend="gloo")


def values(rank, count, dtype, salt=0):
    """Distinct, small values per rank (products of 3 ranks stay exact in every dtype)."""
    t = torch.arange(count, dtype=torch.int64) % 5 + rank + salt + 1
    return t.to(dtype)


def check_equal(what, got, expected):
    assert torch.equal(got, expected), f"{what}: braid gave {got.tolist()}, gloo {expected.tolist()}"


def collectives_worker(rank, size, port):
    gloo = join(rank, size, port)
    count = 7 * size  # divides by the group's size, as reduce_scatter and all_to_all need
    for dtype in DTYPES:
        for op in OPS:
            mine, theirs = values(rank, count, dtype), values(rank, count, dtype)
            dist.all_reduce(mine, op=op)
            dist.all_reduce(theirs, op=op, group=gloo)
            check_equal(f"all_reduce {op} {dtype}", mine, theirs)

        # AVG: Gloo has none; braid divides the sum once (truncating on integers).
        mine, total = values(rank, count, dtype), values(rank, count, dtype)
        dist.all_reduce(mine, op=dist.ReduceOp.AVG)
        dist.all_reduce(total, group=gloo)
        expected = total / size if dtype.is_floating_point else torch.div(
            total, size, rounding_mode="trunc")
        check_equal(f"all_reduce AVG {dtype}", mine, expected.to(dtype))

        for root in range(size):
            mine, theirs = values(rank, count, dtype), values(rank, count, dtype)
            dist.broadcast(mine, src=root)
            dist.broadcast(theirs, src=root, group=gloo)
            check_equal(f"broadcast from {root} {dtype}", mine, theirs)

            mine, theirs = values(rank, count, dtype), values(rank, count, dtype)
            dist.reduce(mine, dst=root)
            dist.reduce(theirs, dst=root, group=gloo)
            if rank == root:
                check_equal(f"reduce to {root} {dtype}", mine, theirs)

            mine = [torch.empty(count, dtype=dtype) for _ in range(size)] if rank == root else None
            theirs = [torch.empty(count, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(values(rank, count, dtype), mine, dst=root)
            dist.gather(values(rank, count, dtype), theirs, dst=root, group=gloo)
            if rank == root:
                for r in range(size):
                    check_equal(f"gather to {root} {dtype}, block {r}", mine[r], theirs[r])

            blocks = [values(r, count, dtype, salt=root) for r in range(size)]
            mine, theirs = torch.empty(count, dtype=dtype), torch.empty(count, dtype=dtype)
            dist.scatter(mine, blocks if rank == root else None, src=root)
            dist.scatter(theirs, blocks if rank == root else None, src=root, group=gloo)
            check_equal(f"scatter from {root} {dtype}", mine, theirs)

        mine = [torch.empty(count, dtype=dtype) for _ in range(size)]
        theirs = [torch.empty(count, dtype=dtype) for _ in range(size)]
        dist.all_gather(mine, values(rank, count, dtype))
        dist.all_gather(theirs, values(rank, count, dtype), group=gloo)
        for r in range(size):
            check_equal(f"all_gather {dtype}, block {r}", mine[r], theirs[r])

        mine = torch.empty(count * size, dtype=dtype)
        dist.all_gather_into_tensor(mine, values(rank, count, dtype))
        check_equal(f"all_gather_into_tensor {dtype}", mine, torch.cat(theirs))

        # Gloo has no reduce_scatter: its all_reduce, sliced, is the reference.
        block = count // size
        total = values(rank, count, dtype)
        dist.all_reduce(total, group=gloo)
        expected = total[rank * block:(rank + 1) * block]
        mine = torch.empty(block, dtype=dtype)
        dist.reduce_scatter(mine, list(values(rank, count, dtype).chunk(size)))
        check_equal(f"reduce_scatter {dtype}", mine, expected)
        mine = torch.empty(block, dtype=dtype)
        dist.reduce_scatter_tensor(mine, values(rank, count, dtype))
        check_equal(f"reduce_scatter_tensor {dtype}", mine, expected)

        mine, theirs = torch.empty(count, dtype=dtype), torch.empty(count, dtype=dtype)
        dist.all_to_all_single(mine, values(rank, count, dtype))
        dist.all_to_all_single(theirs, values(rank, count, dtype), group=gloo)
        check_equal(f"all_to_all_single {dtype}", mine, theirs)

        # Uneven splits: rank r sends r + j + 1 rows to rank j.
        sends = [rank + j + 1 for j in range(size)]
        receives = [i + rank + 1 for i in range(size)]
        source = values(rank, sum(sends) * 2, dtype).view(-1, 2)
        mine = torch.empty(sum(receives), 2, dtype=dtype)
        theirs = torch.empty(sum(receives), 2, dtype=dtype)
        dist.all_to_all_single(mine, source, receives, sends)
        dist.all_to_all_single(theirs, source, receives, sends, group=gloo)
        check_equal(f"all_to_all_single with splits {dtype}", mine, theirs)

        # all_to_all (lists): Gloo has none; the expected blocks follow from values().
        inputs = [values(rank, j + 1, dtype, salt=10 * j) for j in range(size)]
        mine = [torch.empty(rank + 1, dtype=dtype) for _ in range(size)]
        dist.all_to_all(mine, inputs)
        for i in range(size):
            check_equal(f"all_to_all {dtype}, from {i}", mine[i],
                        values(i, rank + 1, dtype, salt=10 * rank))

        # send and recv around the ring.
        received = torch.empty(count, dtype=dtype)
        right, left = (rank + 1) % size, (rank - 1) % size
        if rank % 2 == 0:
            dist.send(values(rank, count, dtype), right)
            dist.recv(received, left)
        else:
            dist.recv(received, left)
            dist.send(values(rank, count, dtype), right)
        check_equal(f"send/recv {dtype}", received, values(left, count, dtype))

    # all_reduce_coalesced: several tensors of one dtype in one call, against gloo's.
    for dtype in (torch.float32, torch.int64):
        shapes = [(3,), (2, 4), (1,)]
        mine = [values(rank, 8, dtype, salt=i)[: torch.Size(shape).numel()].reshape(shape)
                for i, shape in enumerate(shapes)]
        theirs = [t.clone() for t in mine]
        dist.all_reduce_coalesced(mine)
        dist.all_reduce_coalesced(theirs, group=gloo)
        for i, (a, b) in enumerate(zip(mine, theirs)):
            check_equal(f"all_reduce_coalesced {dtype} tensor {i}", a, b)

    # Asynchronous work: wait(), is_completed() and the future DDP's hooks chain on.
    t = values(rank, count, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    assert work.is_completed(), "all_reduce's work is not completed after wait()"
    expected = values(rank, count, torch.float32)
    dist.all_reduce(expected, group=gloo)
    check_equal("all_reduce's future", future.wait(), expected * 2)
    dist.barrier()
    dist.destroy_process_group()


def errors_worker(rank, size, port):
    join(rank, size, port)
    cases = [
        ("allreduce", lambda: dist.all_reduce(torch.ones(4, 4).t())),  # not contiguous
        ("allreduce", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32),
                                              op=dist.ReduceOp.BAND)),
        ("allreduce", lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool))),
        ("allgather", lambda: dist.all_gather([torch.ones(3)] * size, torch.ones(4))),
        ("reduce_scatter", lambda: dist.reduce_scatter(torch.ones(4), [torch.ones(4)])),
        ("allreduce_coalesced", lambda: dist.all_reduce_coalesced(
            [torch.ones(2), torch.ones(4, 4).t()])),  # the second not contiguous
    ]
    for op, call in cases:
        try:
            call()
        except RuntimeError as error:
            text = str(error)
            assert f"braid rank {rank}: {op}:" in text, f"{op}: the error does not name it: {text}"
        else:
            raise AssertionError(f"{op} with a bad argument raised nothing")
    # The group still works: bad arguments are refused before they take a place in the order.
    t = torch.ones(3)
    dist.all_reduce(t)
    check_equal("all_reduce after refused calls", t, torch.full((3,), float(size)))
    dist.destroy_process_group()


def killed_rank_worker(rank, size, port):
    join(rank, size, port)
    dist.barrier()
    if rank == size - 1:
        os._exit(3)  # dies without leaving
    try:
        dist.all_reduce(torch.ones(1000))
    except RuntimeError as error:
        text = str(error)
        assert f"braid rank {rank}: allreduce:" in text and f"rank {size - 1} failed" in text, (
            f"the survivor's error does not name the operation and the dead rank: {text}")
    else:
        raise AssertionError("all_reduce with a dead member raised nothing")
    dist.destroy_process_group()


def destroy_without_barrier_worker(rank, size, port):
    join(rank, size, port)
    for _ in range(10):
        dist.all_reduce(torch.ones(1000))  # temporaries: Python lets go of them at once
    dist.destroy_process_group()  # no barrier first: operations may still be finishing


def train(model, group, rank, steps=5, prepare=None, **ddp_options):
    """`steps` DDP steps on `group`; `prepare(ddp)` first, where given (a comm hook)."""
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, **ddp_options)
    if prepare:
        prepare(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=generator)
        y = torch.randn(16, 2, generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp_worker(rank, size, port):
    gloo = join(rank, size, port)
    torch.manual_seed(rank)  # different initial weights: DDP broadcasts rank 0's

    def model():
        torch.manual_seed(1234 + rank)
        return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))

    on_braid = train(model(), dist.group.WORLD, rank)
    on_gloo = train(model(), gloo, rank)
    for i, (b, g) in enumerate(zip(on_braid, on_gloo)):
        assert torch.allclose(b, g, rtol=1e-6, atol=1e-7), (
            f"parameter {i} after 5 DDP steps: braid and gloo differ by "
            f"{(b - g).abs().max().item()}")
    dist.destroy_process_group()


def new_group_worker(rank, size, port):
    """new_group with the braid backend under a braid default group: a group of some ranks
    (the others take no part) and of all, each computing over its own members, calls on
    them interleaved with the default group's."""
    join(rank, size, port)
    evens = dist.new_group([0, 2], backend="braid")  # every rank calls new_group
    everyone = dist.new_group(backend="braid")
    alone = dist.new_group([1], backend="braid")
    if rank == 1:
        one = torch.full((2,), 5.0)
        dist.all_reduce(one, group=alone)
        check_equal("all_reduce over a group of one", one, torch.full((2,), 5.0))
    t = torch.full((3,), float(rank + 1))
    if rank in (0, 2):
        dist.all_reduce(t, group=evens)
        check_equal("all_reduce over ranks 0 and 2", t, torch.full((3,), 4.0))
        b = torch.full((2,), float(rank))
        dist.broadcast(b, src=2, group=evens)  # src is the global rank
        check_equal("broadcast from rank 2 over ranks 0 and 2", b, torch.full((2,), 2.0))
        # A subgroup is destroyed by name (PyTorch 2 reads the group's name to do it).
        dist.destroy_process_group(evens)
    else:
        assert evens == dist.GroupMember.NON_GROUP_MEMBER, "rank 1 should not be in evens"
    w = torch.ones(5)
    work = dist.all_reduce(w, async_op=True)
    a = torch.full((5,), float(rank))
    dist.all_reduce(a, group=everyone)
    work.wait()
    check_equal("all_reduce over the default group", w, torch.full((5,), float(size)))
    check_equal("all_reduce over a new group of all", a, torch.full((5,), float(sum(range(size)))))
    dist.barrier()
    dist.destroy_process_group()


def exit_past_gloos_callbacks():
    """Leaves without Python's finalization. A gloo worker thread can still be letting go of
    a Python callback's function (PowerSGD's) after the future the training thread waited
    for completed; if the interpreter is finalizing by then, taking the GIL ends the thread
    through a forced unwind, which aborts the process ("terminate called without an active
    exception", PyTorch 2.11). Everything the test checks is checked by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def power_sgd_worker(rank, size, port):
    """PowerSGD's comm hook issues all-reduces inside the callbacks it chains on earlier ones
    and waits for them there: on braid it must neither hang nor train differently from gloo.

    One bucket: with a bucket per layer the callbacks' all-reduces race the backward pass's,
    issued on the training thread, on any backend whose futures complete after the collective
    (gloo's cross or deadlock there too); NCCL's futures complete at enqueue, so its callbacks
    run on the training thread. The order among callbacks is ordered_callbacks_worker's."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    gloo = join(rank, size, port)

    def trained(group, bucket_cap_mb):
        torch.manual_seed(1234)
        layers = [torch.nn.Linear(8, 32), torch.nn.ReLU()]
        for _ in range(6):
            layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(32, 2))
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2, random_seed=7)
        # 2 plain all-reduces, then 3 compressed steps.
        return train(model, group, rank, steps=5,
                     prepare=lambda ddp: ddp.register_comm_hook(state, powerSGD.powerSGD_hook),
                     bucket_cap_mb=bucket_cap_mb)

    on_braid = trained(dist.group.WORLD, bucket_cap_mb=25)
    on_gloo = trained(gloo, bucket_cap_mb=25)
    for i, (b, g) in enumerate(zip(on_braid, on_gloo)):
        assert torch.allclose(b, g, rtol=1e-5, atol=1e-6), (
            f"parameter {i} after 5 PowerSGD steps: braid and gloo differ by "
            f"{(b - g).abs().max().item()}")
    dist.destroy_process_group()
    exit_past_gloos_callbacks()


def ordered_callbacks_worker(rank, size, port):
    """Callbacks chained on a group's futures that issue collectives of their own issue them
    in one order on every rank: the order of the operations whose futures they follow.
    Sixteen all-reduces in flight, each future's callback all-reduces a tensor of its own size
    on a second group and waits for it; callbacks run out of order on any rank would pair
    tensors of different sizes, which braid names as a mismatch."""
    join(rank, size, port)
    follow = dist.new_group(backend="braid")
    count = 16
    results = [None] * count

    def callback_for(i):
        def callback(fut):
            t = torch.full((i + 1,), float(i + rank))
            dist.all_reduce(t, group=follow)  # from the callback, waited for there
            results[i] = t
            return t
        return callback

    futures = [dist.all_reduce(torch.full((4,), float(rank)), async_op=True).get_future()
               .then(callback_for(i)) for i in range(count)]
    torch.futures.wait_all(futures)
    for i in range(count):
        expected = torch.full((i + 1,), float(size * i + sum(range(size))))
        check_equal(f"the all-reduce callback {i} issued", results[i], expected)
    dist.barrier()
    dist.destroy_process_group()


def cuda_worker(rank, size, port):
    """CUDA tensors on the braid backend (a braid built against a PyTorch with CUDA): each
    call follows the current stream, so values written there by a kernel still running when
    the call is made are the ones reduced; the results match Gloo's on CPU copies."""
    gloo = join(rank, size, port)
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    for dtype in (torch.float32, torch.float16, torch.int64):
        x = torch.zeros(4099, dtype=dtype, device=device)
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time before the fill, on this stream
        x.fill_(rank + 1)
        dist.all_reduce(x)
        expected = values(rank, 4099, dtype) * 0 + (rank + 1)
        dist.all_reduce(expected, group=gloo)
        check_equal(f"all_reduce of CUDA {dtype}", x.cpu(), expected)
    gathered = [torch.empty(33, device=device) for _ in range(size)]
    dist.all_gather(gathered, torch.full((33,), float(rank), device=device))
    for r, g in enumerate(gathered):
        check_equal(f"all_gather block {r}", g.cpu(), torch.full((33,), float(r)))
    dist.destroy_process_group()


class ProcessGroupTest(unittest.TestCase):
    def spawn(self, worker, size):
        mp.spawn(worker, args=(size, free_port()), nprocs=size, join=True)

    def test_every_collective_and_dtype_matches_gloo_on_2_ranks(self):
        self.spawn(collectives_worker, 2)

    def test_every_collective_and_dtype_matches_gloo_on_3_ranks(self):
        self.spawn(collectives_worker, 3)

    def test_bad_arguments_raise_runtime_errors_naming_rank_and_op(self):
        self.spawn(errors_worker, 2)

    def test_a_killed_rank_fails_the_survivors_work_naming_it(self):
        size = 3
        context = mp.start_processes(killed_rank_worker, args=(size, free_port()), nprocs=size,
                                     join=False, start_method="spawn")
        for process in context.processes:
            process.join(120)
        codes = [process.exitcode for process in context.processes]
        self.assertEqual(codes, [0] * (size - 1) + [3],
                         "survivors exit 0 having seen the failure; the killed rank exits 3")

    def test_destroying_the_group_right_after_its_calls_returns(self):
        # braid's thread must not free Python's tensors (the GIL) while Python's thread waits
        # for it in destroy_process_group.
        size = 2
        context = mp.start_processes(destroy_without_barrier_worker, args=(size, free_port()),
                                     nprocs=size, join=False, start_method="spawn")
        for process in context.processes:
            process.join(60)
        hung = [process.pid for process in context.processes if process.exitcode is None]
        for process in context.processes:
            if process.exitcode is None:
                process.kill()
        self.assertEqual(hung, [], "destroy_process_group hung")
        self.assertEqual([p.exitcode for p in context.processes], [0] * size)

    def test_ddp_trained_on_braid_ends_with_gloos_parameters(self):
        self.spawn(ddp_worker, 2)

    def test_new_groups_compute_over_their_members(self):
        self.spawn(new_group_worker, 3)

    def test_power_sgd_hook_trains_as_on_gloo(self):
        self.spawn(power_sgd_worker, 2)

    def test_callbacks_issue_their_collectives_in_one_order_on_every_rank(self):
        self.spawn(ordered_callbacks_worker, 2)

    @unittest.skipUnless(getattr(braid_torch, "with_cuda", False) and torch.cuda.is_available(),
                         "braid_torch built without CUDA, or no GPU")
    def test_cuda_tensors_follow_the_current_stream(self):
        self.spawn(cuda_worker, 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
