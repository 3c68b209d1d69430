#!/usr/bin/env python3
"""Ranks started with different settings fail before their first step, every rank naming the
setting and both values, instead of deadlocking (different step counts under pipeline
parallelism) or training a silently different model to the end (another --heads under TP,
--layers under PP, --seed). Ranks are started by hand, each with its own flags, as a
launcher that passes per-rank arguments (or a typo in one line of a job script) would.

Paths from the environment (meson sets them): TRAIN_3D, DDP_TRAIN.
"""
import os
import socket
import subprocess
import sys
import time

BOUND_S = 60  # joining and failing; the deadlock this replaces lasted BRAID_TIMEOUT (300 s)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(program, per_rank_args):
    port = str(free_port())
    ranks = []
    for rank, args in enumerate(per_rank_args):
        env = dict(os.environ, BRAID_RANK=str(rank), BRAID_WORLD_SIZE=str(len(per_rank_args)),
                   BRAID_STORE=f"127.0.0.1:{port}", BRAID_TOKEN="agree", BRAID_TIMEOUT="120")
        ranks.append(subprocess.Popen([program, *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    start = time.monotonic()
    outputs = [p.communicate(timeout=BOUND_S * 3) for p in ranks]
    return time.monotonic() - start, [p.returncode for p in ranks], outputs


def check(program, common, differing, name, values):
    took, codes, outputs = run_ranks(program, [common + differing[0], common + differing[1]])
    shown = f"{os.path.basename(program)} {name} {values[0]} vs {values[1]}"
    assert took < BOUND_S, f"{shown}: took {took:.1f} s"
    for rank, (code, (out, err)) in enumerate(zip(codes, outputs)):
        assert code != 0, f"{shown}: rank {rank} exited 0:\n{out}{err}"
        assert "step    1/" not in out, f"{shown}: rank {rank} trained:\n{out}"
        expected = f"the ranks disagree on {name}: rank 0 has {values[0]}, rank 1 has {values[1]}"
        assert expected in err, f"{shown}: rank {rank} did not say '{expected}':\n{err}"
    print(f"{shown}: both ranks refused in {took:.1f} s")


def main():
    train_3d, ddp = os.environ["TRAIN_3D"], os.environ["DDP_TRAIN"]
    small = ["--layers", "2", "--hidden", "16", "--heads", "2", "--vocab", "16", "--seq", "4",
             "--global-batch", "4", "--microbatches", "2"]
    check(train_3d, small + ["--pp", "2"], (["--steps", "200"], ["--steps", "5"]), "--steps",
          ("200", "5"))
    check(train_3d, ["--tp", "2", "--layers", "2", "--hidden", "16", "--vocab", "16", "--seq",
                     "4", "--global-batch", "4"],
          (["--heads", "2"], ["--heads", "4"]), "--heads", ("2", "4"))
    check(train_3d, ["--pp", "2", "--hidden", "16", "--heads", "2", "--vocab", "16", "--seq",
                     "4", "--global-batch", "4", "--microbatches", "2"],
          (["--layers", "2"], ["--layers", "4"]), "--layers", ("2", "4"))
    check(train_3d, small + ["--dp", "2"], (["--seed", "1"], ["--seed", "2"]), "--seed",
          ("1", "2"))
    check(ddp, ["--batch", "8"], (["--steps", "10"], ["--steps", "20"]), "--steps", ("10", "20"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
