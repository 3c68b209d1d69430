"""PyTorch's own parallelism on braid's backend: DistributedDataParallel (plain, no_sync,
find_unused_parameters, static_graph, under torch.compile), FSDP2's fully_shard, DTensor
tensor parallelism (parallelize_module, column- and row-wise) and torch.distributed.pipelining
(a two-stage GPipe) each train a small model for a few steps on "braid" and end with the
parameters the same program ends with on "gloo".

Each case is tests/python/torch_parallelism.py run as two processes per backend. Run by
meson with PYTHONPATH naming the build's python/ folder (where braid_torch is); a case name
on the command line runs only that case."""

import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import torch

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_parallelism.py")
RANKS = 2
# A case's processes are killed after this long: a hang fails the test instead of the suite.
DEADLINE_S = 240


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(case, backend, out_dir):
    """Runs `case` on `backend` in RANKS processes; returns each rank's parameters at the
    start and the end ({"start": {name: tensor}, "end": {...}})."""
    port = str(free_port())
    # Output to files, not pipes: a rank whose pipe nobody reads yet would block on it.
    logs = [open(os.path.join(out_dir, f"{rank}.log"), "w+") for rank in range(RANKS)]
    ranks = [subprocess.Popen([sys.executable, PROGRAM, case, backend, str(rank), str(RANKS),
                               port, out_dir],
                              stdout=logs[rank], stderr=subprocess.STDOUT, text=True)
             for rank in range(RANKS)]
    deadline = time.monotonic() + DEADLINE_S
    failures = []
    for rank, process in enumerate(ranks):
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            process.wait()
            failures.append(f"rank {rank} still running after {DEADLINE_S} s")
        if process.returncode != 0 and not failures:
            failures.append(f"rank {rank} exited {process.returncode}")
    if failures:
        for other in ranks:
            other.kill()
        tails = []
        for rank, log in enumerate(logs):
            log.seek(0)
            tails.append(f"rank {rank}:\n{log.read()[-3000:]}")
        raise AssertionError(f"{case} on {backend}: " + "; ".join(failures) + "\n" +
                             "\n".join(tails))
    for log in logs:
        log.close()
    return [torch.load(os.path.join(out_dir, f"{rank}.pt")) for rank in range(RANKS)]


class PyTorchParallelismOnBraid(unittest.TestCase):
    def same_parameters_as_gloo(self, case):
        with tempfile.TemporaryDirectory() as gloo_dir, tempfile.TemporaryDirectory() as braid_dir:
            expected = run_case(case, "gloo", gloo_dir)
            got = run_case(case, "braid", braid_dir)
        for rank in range(RANKS):
            start, end = got[rank]["start"], got[rank]["end"]
            self.assertEqual(sorted(end), sorted(expected[rank]["end"]), f"{case} rank {rank}")
            for name, value in expected[rank]["end"].items():
                # The same arithmetic but for the order of a sum's terms.
                torch.testing.assert_close(
                    end[name], value, rtol=1e-5, atol=1e-6,
                    msg=lambda detail: f"{case}, rank {rank}, {name}: braid differs from gloo: "
                                       f"{detail}")
            # Training moved the parameters, so agreeing with gloo says something.
            moved = max((end[name] - start[name]).abs().max().item() for name in end)
            self.assertGreater(moved, 1e-4, f"{case} rank {rank}: the parameters did not move")
        if case != "pipeline":  # replicas (DDP, FSDP2 and TP gathered whole) end equal
            for backend, ends in (("gloo", expected), ("braid", got)):
                for name, value in ends[0]["end"].items():
                    differ = (ends[1]["end"][name] != value)
                    if differ.any():
                        gap = (ends[1]["end"][name] - value).abs().max().item()
                        self.fail(f"{case} on {backend}: ranks 0 and 1 differ at {name}, in "
                                  f"{int(differ.sum())} of {value.numel()} elements, by up to "
                                  f"{gap:.3g}")

    def test_ddp(self):
        self.same_parameters_as_gloo("ddp")

    def test_ddp_no_sync(self):
        self.same_parameters_as_gloo("ddp_no_sync")

    def test_ddp_find_unused_parameters(self):
        self.same_parameters_as_gloo("ddp_find_unused")

    def test_ddp_static_graph(self):
        self.same_parameters_as_gloo("ddp_static_graph")

    def test_ddp_under_torch_compile(self):
        self.same_parameters_as_gloo("ddp_compiled")

    def test_fsdp2_fully_shard(self):
        self.same_parameters_as_gloo("fsdp2")

    def test_dtensor_tensor_parallel(self):
        self.same_parameters_as_gloo("tensor_parallel")

    def test_pipelining_two_stages(self):
        self.same_parameters_as_gloo("pipeline")


if __name__ == "__main__":
    unittest.main()
