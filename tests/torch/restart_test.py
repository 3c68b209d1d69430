#!/usr/bin/env python3
"""A job that loses a rank and restarts ends where the job that never failed ends:
examples/ddp_train under braid-run --max-restarts 1 with --checkpoint-dir, one rank killed
with SIGKILL halfway, resumes from the newest checkpoint every rank holds whole and ends
with exactly the parameters of the same run without a failure (same seed; the data follows
the step), for Adam and for SGD, and with a checkpoint every step (the kill most likely
tears a file being written); and so does examples/train_3d on tp 2 x pp 2. With the state
copied every step into memory braid-run keeps (--memory-every 1), both resume from memory,
at most one step behind the newest step rank 0 had finished. A rank made to die at a chosen
point (BRAID_FAULT: in forward, during a bucket's reduction, a pipeline transfer, an
in-memory copy, a disk write) is recovered from alike. A second kill, past --max-restarts, ends the job with the
failure named.

Paths from the environment (meson sets them): BRAID_RUN, DDP_TRAIN, TRAIN_3D.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from training_runs import checksum, children, fail  # noqa: E402

STEPS = 100
# --straggle-ms: the last rank computes 2 ms more a step (a busy loop, no random numbers), so
# that the job is still running well after the kill is decided.
COMMON = ["--hidden", "64", "--layers", "3", "--batch", "16", "--seed", "11",
          "--steps", str(STEPS), "--straggle-ms", "2"]


def run_and_kill(args, kill_at_steps):
    """Runs braid-run with args; each time rank 0 reports a step in kill_at_steps (one per
    start of the job), SIGKILLs the last rank braid-run started. Returns (status, output)."""
    process = subprocess.Popen([os.environ["BRAID_RUN"]] + args, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    output = []
    pending = list(kill_at_steps)
    deadline = time.monotonic() + 200
    for line in process.stdout:
        output.append(line)
        if time.monotonic() > deadline:
            process.kill()
            fail("the job ran past 200 s", "".join(output))
        step = re.search(r"step +(\d+)/", line)
        if pending and step and int(step.group(1)) >= pending[0]:
            pending.pop(0)
            ranks = children(process.pid)
            if not ranks:
                process.kill()
                fail("the job's ranks had ended before the kill", "".join(output))
            os.kill(ranks[-1], signal.SIGKILL)
    return process.wait(timeout=60), "".join(output)


REFERENCES = {}


def unbroken_checksum(name, program, ranks, args):
    """The parameters' checksum `program` ends with on `ranks` ranks without a failure."""
    key = (program, ranks, tuple(args))
    if key not in REFERENCES:
        reference = subprocess.run([os.environ["BRAID_RUN"], "-n", str(ranks), program] + args,
                                   capture_output=True, text=True, timeout=200)
        if reference.returncode != 0:
            fail(f"{name}: the run without a failure exited {reference.returncode}",
                 reference.stdout + reference.stderr)
        REFERENCES[key] = checksum(reference.stdout)
    return REFERENCES[key]


def expect_restart_ends_alike(name, program, ranks, args, every, kill_at, earliest,
                              memory=False):
    """Runs `program` on `ranks` ranks once unbroken and once killed at step `kill_at` under
    --max-restarts 1, saving a checkpoint every `every` steps: to disk, or with `memory` in
    memory braid-run keeps (--memory-every). The second must say it restarted, resume after a
    step of `earliest` or later (from memory, at most one step before the newest step rank 0
    finished), and end with the first's parameters."""
    want = unbroken_checksum(name, program, ranks, args)
    directory = tempfile.mkdtemp(prefix="braid-restart-")
    step_log = os.path.join(directory, "steps.jsonl")
    saving = (["--memory-every", str(every), "--step-log", step_log] if memory else
              ["--checkpoint-dir", directory, "--checkpoint-every", str(every)])
    try:
        status, output = run_and_kill(
            ["-n", str(ranks), "--max-restarts", "1", program] + args + saving, [kill_at])
        if status != 0:
            fail(f"{name}: the restarted job exited {status}", output)
        if f"restarting the job's {ranks} rank(s) (restart 1 of --max-restarts 1)" not in output:
            fail(f"{name}: braid-run did not say it restarted the job", output)
        resumed = re.search(r"resuming after step (\d+) from (\S+)", output)
        if not resumed or int(resumed.group(1)) < earliest or int(resumed.group(1)) % every:
            fail(f"{name}: the job did not resume from a checkpoint of step {earliest} or "
                 "later", output)
        resumed_step = int(resumed.group(1))
        lost = ""
        if memory:
            if resumed.group(2) != "memory":
                fail(f"{name}: the job resumed from {resumed.group(2)}, not memory", output)
            with open(step_log) as f:
                records = [json.loads(line) for line in f]
            finished = max(r["step"] for r in records if r["start"] == 0)
            if finished - resumed_step > 1:
                fail(f"{name}: rank 0 had finished step {finished} and the job resumed after "
                     f"step {resumed_step}: more than one step lost", output)
            lost = f", {finished - resumed_step} step(s) lost"
        if checksum(output) != want:
            fail(f"{name}: the restarted job ended with parameters {checksum(output)}, the job "
                 f"without a failure with {want}", output)
        print(f"{name}: killed at step {kill_at} or later, resumed after step "
              f"{resumed_step} from {resumed.group(2)}{lost}, ended with the same parameters "
              f"({want})")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


THREE_D = ["--tp", "2", "--pp", "2", "--steps", "60", "--layers", "4", "--hidden", "32",
           "--heads", "4", "--vocab", "32", "--seq", "8", "--global-batch", "8",
           "--microbatches", "4", "--seed", "3"]

# The kill comes once rank 0 reports step 41 (or later: the reader lags). Saves are written
# in the background, each waiting for the one before, so step 35's is whole by the time
# step 40's is taken; step 40's may still be on its way.
for optimizer in ["adam", "sgd"]:
    expect_restart_ends_alike(f"ddp_train {optimizer}", os.environ["DDP_TRAIN"], 2,
                              COMMON + ["--optimizer", optimizer], 5, 41, 35)
# A checkpoint every step: each step waits for the last one's file, so the kill lands, most
# likely, while a file is being written; the torn one is not a checkpoint.
expect_restart_ends_alike("ddp_train, a checkpoint every step", os.environ["DDP_TRAIN"], 2,
                          COMMON, 1, 41, 39)
# The 3D job: each rank's state is its stages' TP slices and their optimizer state.
expect_restart_ends_alike("train_3d tp 2 x pp 2", os.environ["TRAIN_3D"], 4, THREE_D, 5, 21,
                          15)
# In memory every step: rank 0 had finished step 41 or later when the kill came, so every
# rank holds step 40 whole at least; the copy of the step before the kill may be cut off.
expect_restart_ends_alike("ddp_train, in memory every step", os.environ["DDP_TRAIN"], 2,
                          COMMON + ["--optimizer", "adam"], 1, 41, 40, memory=True)
expect_restart_ends_alike("train_3d tp 2 x pp 2, in memory every step", os.environ["TRAIN_3D"],
                          4, THREE_D, 1, 21, 20, memory=True)

def expect_fault_recovered(name, program, ranks, args, saving, fault, earliest, said=None):
    """Runs `program` under --max-restarts 1 with BRAID_FAULT=`fault`, so that one rank dies
    at that point of its first start: the job must restart, resume after a step of
    `earliest` or later, say `said` (where given), and end with the unbroken run's
    parameters."""
    want = unbroken_checksum(name, program, ranks, args)
    directory = tempfile.mkdtemp(prefix="braid-fault-")
    step_log = os.path.join(directory, "steps.jsonl")
    try:
        flags = [f.replace("{dir}", directory) for f in saving] + ["--step-log", step_log]
        run = subprocess.run(
            [os.environ["BRAID_RUN"], "-n", str(ranks), "--max-restarts", "1", program] + args
            + flags, capture_output=True, text=True, timeout=200,
            env=dict(os.environ, BRAID_FAULT=fault))
        output = run.stdout + run.stderr
        point, _, rank = fault.split(":")
        if run.returncode != 0:
            fail(f"{name}: the job exited {run.returncode}", output)
        if f"BRAID_FAULT: rank {rank} dies at {point}" not in output:
            fail(f"{name}: rank {rank} did not die at {point}", output)
        resumed = re.search(r"resuming after step (\d+) from (\S+)", output)
        if not resumed or int(resumed.group(1)) < earliest:
            fail(f"{name}: the job did not resume after step {earliest} or later", output)
        if said and said not in output:
            fail(f"{name}: the output does not say '{said}'", output)
        with open(step_log) as f:
            records = [json.loads(line) for line in f]
        finished = max(r["step"] for r in records if r["start"] == 0)
        if "--memory-every" in saving and finished - int(resumed.group(1)) > 1:
            fail(f"{name}: rank 0 had finished step {finished} and the job resumed after "
                 f"step {resumed.group(1)}: more than one step lost", output)
        if checksum(output) != want:
            fail(f"{name}: the job ended with parameters {checksum(output)}, the job without "
                 f"a failure with {want}", output)
        print(f"{name}: rank {rank} died at {point} after rank 0 finished step {finished}, "
              f"the job resumed after step {resumed.group(1)} from {resumed.group(2)} and "
              "ended with the same parameters")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# A rank dies at a chosen point (braid/core/fault_points.hpp), with the state in memory
# every step: in forward, with a gradient bucket's reduction in flight, with a pipeline
# transfer in flight, halfway through its own in-memory copy (that copy is refused; the
# other slot holds the step before); and with checkpoints on disk, halfway through a file
# (the partial file is no checkpoint; the one before is used).
ADAM = COMMON + ["--optimizer", "adam"]
IN_MEMORY = ["--memory-every", "1"]
expect_fault_recovered("a kill in forward", os.environ["DDP_TRAIN"], 2, ADAM, IN_MEMORY,
                       "forward:31:1", 29)
expect_fault_recovered("a kill during a bucket's reduction", os.environ["DDP_TRAIN"], 2, ADAM,
                       IN_MEMORY, "bucket-reduction:41:0", 10)
expect_fault_recovered("a kill during a pipeline transfer", os.environ["TRAIN_3D"], 4, THREE_D,
                       IN_MEMORY, "pipeline-send:50:3", 5)
expect_fault_recovered("a kill during an in-memory copy", os.environ["DDP_TRAIN"], 2, ADAM,
                       IN_MEMORY, "memory-copy:20:1", 19,
                       "rank 1's in-memory copy of step 20 is refused: its process stopped "
                       "while copying it")
expect_fault_recovered("a kill during a disk write", os.environ["DDP_TRAIN"], 2, ADAM,
                       ["--checkpoint-dir", "{dir}", "--checkpoint-every", "5"], "disk-write:4:1",
                       15)

# One failure more than --max-restarts allows: the job ends, the last failure named.
directory = tempfile.mkdtemp(prefix="braid-restart-")
try:
    status, output = run_and_kill(
        ["-n", "2", "--max-restarts", "1", os.environ["DDP_TRAIN"]] + COMMON
        + ["--checkpoint-dir", directory, "--checkpoint-every", "5"], [21, 61])
    if status != 128 + signal.SIGKILL:
        fail(f"a job failing twice under --max-restarts 1 exited {status}, not 137", output)
    if not re.search(r"its failures: generation 0, node 0: rank 1 \(pid \d+\) was killed by "
                     r"signal 9 \(SIGKILL\).*; generation 1, node 0: rank 1 \(pid \d+\) was "
                     r"killed by signal 9", output):
        fail("the two failures should be named, each with its start", output)
    print("a second failure past --max-restarts 1 ends the job, both failures named")
finally:
    shutil.rmtree(directory, ignore_errors=True)
