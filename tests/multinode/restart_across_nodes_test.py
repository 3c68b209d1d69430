#!/usr/bin/env python3
"""A job across nodes that loses a rank, or a whole node, restarts on every node and ends
where the job that never failed ends. examples/ddp_train runs on two emulated nodes
(braid-run --emulate-nodes 2 --max-restarts 1), one rank each, with its state copied into
memory every step and to disk every 5 steps:

- a rank on node 1 killed: both nodes' braid-runs start their ranks again (one generation
  of the job's store, which braid-run serves on node 0), the job resumes from memory at
  most one step behind, and ends with exactly the unbroken run's parameters;
- node 1 killed whole (its init: every process of the node, its memory with them): the
  node is started again, empty, its braid-run joins the next generation, and the job
  resumes from memory all the same, at most one step behind: node 0's rank held its
  partner's copy (MemoryCheckpoints' partner copies) and gives it back; same parameters;
- a rank killed in each of two starts, one more failure than --max-restarts 1 allows: the
  job fails with 137 on every node, and braid-run names both failures;
- node 0 killed whole, and with it the store: node 1's braid-run stops its rank and says it
  lost the store, within seconds.

And as on a cluster, where a workload manager starts braid-run once per node: two braid-runs
on this machine as nodes 0 and 1 of one job (--nnodes 2 --master-addr 127.0.0.1), node 1's
braid-run SIGKILLed (its rank dies with it) and started again by hand, as a requeued node
would be: the new one joins the job's next start, gets its rank's state back from node 0,
and the job ends with the same parameters.
The same two braid-runs with the job's store in a three-member etcd cluster (--store
etcd://...): node 0's braid-run SIGKILLed, and an etcd member with it, and the job still
ends with the same parameters once a new node 0 joins; its name, used again, is refused.
And with --nnodes 1:2, node 1's braid-run SIGKILLed and not replaced: node 0 goes on alone
from the checkpoint both nodes' ranks wrote, ddp_train accumulating both ranks' data a step
and train_3d (tp 2 x dp 2, two ranks a node) as tp 2 x dp 1, each ending within float
tolerance of its job that never lost a node.
That case needs nothing; the others need root for the namespaces (CI runs as root) and are
skipped, saying why, elsewhere. Paths from the environment (meson sets them): BRAID_RUN,
DDP_TRAIN, TRAIN_3D.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from etcd_cluster import EtcdCluster  # noqa: E402
from training_runs import checksum, children, fail  # noqa: E402

STEPS = 60
# --straggle-ms: the last rank computes 2 ms more a step, so the job is still running well
# after a kill is decided.
COMMON = ["--hidden", "64", "--layers", "3", "--batch", "16", "--seed", "11", "--steps",
          str(STEPS), "--straggle-ms", "2", "--optimizer", "adam"]
DEADLINE_S = 200


def skip_without_namespaces():
    probe = subprocess.run([os.environ["BRAID_RUN"], "--emulate-nodes", "1", "-n", "1", "true"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        print("SKIP: this machine does not let the test make namespaces (run it as root):",
              probe.stderr.strip())
        sys.exit(77)


def node_init(launcher, node):
    """Node `node`'s init: the outer braid-run starts the nodes in order."""
    return children(launcher)[node]


def rank_on(launcher, node):
    """The one rank of node `node`: its init's braid-run's child."""
    node_braid_run = children(node_init(launcher, node))[0]
    return children(node_braid_run)[0]


def run_and_kill(args, kills):
    """Runs braid-run with args; for each (step, victim) in kills, once rank 0 reports that
    step (of the start the kill belongs to, in order), SIGKILLs victim(launcher pid).
    Returns (status, output, seconds from the last kill to braid-run's end)."""
    process = subprocess.Popen([os.environ["BRAID_RUN"]] + args, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    output = []
    pending = list(kills)
    deadline = time.monotonic() + DEADLINE_S
    killed_at = None
    for line in process.stdout:
        output.append(line)
        if time.monotonic() > deadline:
            process.kill()
            fail(f"the job ran past {DEADLINE_S} s", "".join(output))
        step = re.search(r"\[0\] step +(\d+)/", line)
        if pending and step and int(step.group(1)) >= pending[0][0]:
            _, victim = pending.pop(0)
            try:
                os.kill(victim(process.pid), signal.SIGKILL)
            except (IndexError, ProcessLookupError):
                process.kill()
                fail("the process to kill had already ended", "".join(output))
            killed_at = time.monotonic()
    status = process.wait(timeout=60)
    return status, "".join(output), (time.monotonic() - killed_at) if killed_at else 0.0


def unbroken_checksum():
    reference = subprocess.run([os.environ["BRAID_RUN"], "-n", "2", os.environ["DDP_TRAIN"]]
                               + COMMON, capture_output=True, text=True, timeout=DEADLINE_S)
    if reference.returncode != 0:
        fail(f"the run without a failure exited {reference.returncode}",
             reference.stdout + reference.stderr)
    return checksum(reference.stdout)


def expect_recovered(name, victim, source, earliest, want, replaced):
    """Kills victim once rank 0 has finished step 31; the job must restart on both nodes (on
    a `replaced` node, a new braid-run joins the next start instead), resume from `source`
    after a step of `earliest` or later, and end with `want`."""
    directory = tempfile.mkdtemp(prefix="braid-nodes-restart-")
    step_log = os.path.join(directory, "steps.jsonl")
    try:
        status, output, _ = run_and_kill(
            ["--emulate-nodes", "2", "-n", "1", "--max-restarts", "1", os.environ["DDP_TRAIN"]]
            + COMMON + ["--memory-every", "1", "--checkpoint-dir", directory,
                        "--checkpoint-every", "5", "--step-log", step_log],
            [(31, victim)])
        if status != 0:
            fail(f"{name}: the restarted job exited {status}", output)
        restarted = output.count("restarting this node's 1 rank(s) (restart 1 of --max-restarts 1)")
        if restarted != (1 if replaced else 2):
            fail(f"{name}: {restarted} braid-run(s) said they restarted their rank", output)
        # Node 0's braid-run names the cause, node 1's rank killed, not its own rank's
        # failure that followed.
        if not replaced and not re.search(
                r"restarting this node's 1 rank\(s\) \(restart 1 of --max-restarts 1\): node 1: "
                r"rank 1 \(pid \d+\) was killed by signal 9", output):
            fail(f"{name}: node 0's braid-run should name node 1's killed rank as the cause",
                 output)
        if replaced and "node 1 (pid" not in output or replaced and \
                "starting it again (replacement 1 of --max-restarts 1)" not in output:
            fail(f"{name}: braid-run should say it started node 1 again", output)
        resumed = re.search(r"\[0\] .*resuming after step (\d+) from (\S+)", output)
        resumed_from = "memory" if resumed and resumed.group(2) == "memory" else "disk"
        if not resumed or resumed_from != source or int(resumed.group(1)) < earliest:
            fail(f"{name}: the job did not resume from {source} after step {earliest} or "
                 "later", output)
        with open(step_log) as f:
            records = [json.loads(line) for line in f]
        finished = max(r["step"] for r in records if r["start"] == 0)
        lost = finished - int(resumed.group(1))
        if lost > 1:
            fail(f"{name}: rank 0 had finished step {finished} and the job resumed after step "
                 f"{resumed.group(1)}: more than one step lost", output)
        if checksum(output) != want:
            fail(f"{name}: the restarted job ended with parameters {checksum(output)}, the job "
                 f"without a failure with {want}", output)
        print(f"{name}: rank 0 had finished step {finished}; the job resumed after step "
              f"{resumed.group(1)} from {source} ({lost} step(s) lost) and ended with the same "
              f"parameters ({want})")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def read_until_step(process, step, lines):
    """Reads `process`'s output into `lines` until rank 0 says it finished `step`."""
    deadline = time.monotonic() + DEADLINE_S
    for line in process.stdout:
        lines.append(line)
        if time.monotonic() > deadline:
            fail(f"the job ran past {DEADLINE_S} s", "".join(lines))
        found = re.search(r"\[0\] step +(\d+)/", line)
        if found and int(found.group(1)) >= step:
            return
    fail(f"the job ended before step {step}", "".join(lines))


def expect_resumed_from_memory(text, want, whose_copy, output):
    """The job in `text` resumed from memory (`whose_copy`) after step 30 or later and ended
    with the parameters `want`; the step it resumed after."""
    resumed = re.search(r"resuming after step (\d+) from (\S+)", text)
    if not resumed or resumed.group(2) != "memory" or int(resumed.group(1)) < 30:
        fail(f"the job should resume from memory ({whose_copy}) after step 30 or later", output)
    if checksum(text) != want:
        fail(f"the job ended with parameters {checksum(text)}, the job without a failure with "
             f"{want}", output)
    return resumed.group(1)


def kill_what_runs(*processes):
    for process in processes:
        if process and process.poll() is None:
            process.kill()
            process.wait()


def node_by_hand(rank, port, directory, output, env=None, store=(), program=None, ranks=1):
    """Node `rank` of a two-node job on this machine (ddp_train, or `program`), as a workload
    manager would start its braid-run, its output to `output`."""
    return subprocess.Popen(
        [os.environ["BRAID_RUN"], "--nnodes", "2", "--node-rank", str(rank), "--master-addr",
         "127.0.0.1", "--master-port", port, "-n", str(ranks), "--max-restarts", "1", *store]
        + (program or [os.environ["DDP_TRAIN"]] + COMMON)
        + ["--memory-every", "1", "--checkpoint-dir", directory, "--checkpoint-every", "5"],
        stdout=output, stderr=subprocess.STDOUT, text=True, env=env)


def expect_a_node_braid_run_replaced_by_hand(want):
    directory = tempfile.mkdtemp(prefix="braid-nodes-by-hand-")
    port = free_port()
    env = dict(os.environ, BRAID_TOKEN="by-hand")

    def node(rank, output):
        return node_by_hand(rank, port, directory, output, env=env)

    first = node(0, subprocess.PIPE)
    doomed = node(1, subprocess.DEVNULL)
    replacement = None
    output = []
    try:
        read_until_step(first, 31, output)
        doomed.kill()
        doomed.wait()
        replacement = node(1, subprocess.PIPE)
        output += first.stdout.readlines()
        status = first.wait(timeout=60)
        theirs = replacement.communicate(timeout=60)[0] if replacement else ""
        text = "".join(output)
        if status != 0 or replacement is None or replacement.returncode != 0:
            fail(f"node 0's braid-run exited {status}, the replacement "
                 f"{replacement.returncode if replacement else 'never started'}", text + theirs)
        if "node 1's braid-run" not in text or \
                "restarting this node's 1 rank(s) (restart 1 of --max-restarts 1)" not in text:
            fail("node 0's braid-run should restart its rank, naming node 1's braid-run", text)
        resumed = expect_resumed_from_memory(text, want, "node 1's rank's copy, from its "
                                             "partner on node 0", text)
        print(f"node 1's braid-run killed and started again by hand: the job resumed after step "
              f"{resumed} from memory and ended with the same parameters ({want})")
    finally:
        kill_what_runs(first, doomed, replacement)
        shutil.rmtree(directory, ignore_errors=True)


def expect_an_etcd_job_to_survive_the_node_that_started_it(want):
    """Two braid-runs keep the job's store in a three-member etcd cluster (--store): node 0's
    braid-run is SIGKILLed with one etcd member, and the job goes on: a new node 0 joins its
    next start and the job ends with the unbroken run's parameters. A run whose name was used
    is then refused by name."""
    directory = tempfile.mkdtemp(prefix="braid-nodes-etcd-")
    port = free_port()
    with EtcdCluster(3) as etcd:
        url = etcd.url(f"restart-test-{os.getpid()}")

        def node(rank, output):
            return node_by_hand(rank, port, directory, output, store=["--store", url])

        doomed = node(0, subprocess.PIPE)
        survivor = node(1, subprocess.PIPE)
        replacement = None
        before = []
        try:
            read_until_step(doomed, 31, before)
            killed_at = time.monotonic()
            doomed.kill()
            doomed.wait()
            etcd.stop_member(0)
            replacement = node(0, subprocess.PIPE)
            lines, first_step_after = [], None
            for line in replacement.stdout:
                lines.append(line)
                if first_step_after is None and re.search(r"\[0\] step +\d+/", line):
                    first_step_after = time.monotonic() - killed_at
            replacement.wait(timeout=60)
            text = "".join(lines)
            theirs = survivor.communicate(timeout=60)[0]
            everything = "".join(before) + text + theirs
            if replacement.returncode != 0 or survivor.returncode != 0:
                fail(f"the new node 0's braid-run exited {replacement.returncode}, node 1's "
                     f"{survivor.returncode}", everything)
            if "restarting this node's 1 rank(s) (restart 1 of --max-restarts 1)" not in theirs:
                fail("node 1's braid-run should restart its rank", everything)
            resumed = expect_resumed_from_memory(text, want, "rank 0's copy, from its partner "
                                                 "on node 1", everything)
            again = subprocess.run(
                [os.environ["BRAID_RUN"], "--nnodes", "2", "--node-rank", "0", "--master-addr",
                 "127.0.0.1", "-n", "1", "--store", url, "true"],
                capture_output=True, text=True, timeout=60)
            if again.returncode != 1 or "had already ended" not in again.stderr:
                fail(f"a second run under the used name exited {again.returncode} without "
                     "saying the job had ended", again.stdout + again.stderr)
            print(f"node 0's braid-run and an etcd member killed: the job resumed after step "
                  f"{resumed} from memory, its first step {first_step_after:.2f} s "
                  f"after the kill (a new braid-run started by hand at once), and ended with the "
                  f"same parameters ({want}); the run's name, used again, was refused")
        finally:
            kill_what_runs(doomed, survivor, replacement)
            shutil.rmtree(directory, ignore_errors=True)


THREE_D = [os.environ.get("TRAIN_3D", ""), "--tp", "2", "--steps", "60", "--layers", "2",
           "--hidden", "32", "--heads", "4", "--vocab", "32", "--seq", "8", "--global-batch", "8",
           "--microbatches", "2", "--seed", "3"]


def lose_node_1_of_an_elastic_job(program=None, ranks=1):
    """Runs a job (ddp_train, or `program`) of --nnodes 1:2 on two by-hand nodes of `ranks`
    ranks each, SIGKILLs node 1's braid-run once rank 0 has finished step 31 and leaves it
    lost; node 0 must go on alone and end with status 0. Node 0's output."""
    directory = tempfile.mkdtemp(prefix="braid-nodes-smaller-")
    port = free_port()
    elastic = ["--nnodes", "1:2", "--join-wait", "1"]
    first = node_by_hand(0, port, directory, subprocess.PIPE, store=elastic, program=program,
                         ranks=ranks)
    doomed = node_by_hand(1, port, directory, subprocess.DEVNULL, store=elastic,
                          program=program, ranks=ranks)
    output = []
    try:
        read_until_step(first, 31, output)
        killed_at = time.monotonic()
        doomed.kill()
        doomed.wait()
        smaller_at = None
        for line in first.stdout:
            output.append(line)
            if smaller_at is None and re.search(r"\[0\] .*resuming after step", line):
                smaller_at = time.monotonic() - killed_at
        status = first.wait(timeout=DEADLINE_S)
        text = "".join(output)
        if status != 0:
            fail(f"node 0's braid-run exited {status} after node 1 was lost", text)
        if "the job now runs on 1 of --nnodes 1:2 (nodes 0)" not in text:
            fail("braid-run should say the job now runs on node 0 alone", text)
        print(f"  (node 1 killed; node 0's ranks resumed on their own {smaller_at:.2f} s later, "
              "--join-wait 1 included)")
        return text
    finally:
        kill_what_runs(first, doomed)
        shutil.rmtree(directory, ignore_errors=True)


def expect_resumed_smaller(text, ranks_before, expected, what):
    """`text`'s job resumed from a disk checkpoint `ranks_before` ranks wrote -- step 30's, or
    25's where step 30's files were still being written at the kill -- and ended within float
    tolerance of `expected`; the step it resumed after."""
    resumed = re.search(r"resuming after step (\d+) from .* \(written by "
                        + str(ranks_before) + r" rank\(s\)\)", text)
    if not resumed or int(resumed.group(1)) < 25:
        fail(f"{what} should resume from the disk checkpoint {ranks_before} ranks wrote, after "
             "step 25 or later", text)
    got = float(checksum(text))
    if abs(got - expected) > 1e-4 * abs(expected):
        fail(f"{what} on one node ended with parameters {got}, without a failure with "
             f"{expected}: further apart than float tolerance", text)
    return resumed.group(1), got


def expect_a_job_that_loses_a_node_to_continue_smaller(want):
    """--nnodes 1:2: node 1 lost, not replaced. Node 0 goes on alone: from the newest
    checkpoint on disk (written by 2 ranks, put together whole), each step's two parts of data
    now its own, their gradients accumulated. Same global batch, same training: it ends within
    float tolerance of the job that never lost a node."""
    text = lose_node_1_of_an_elastic_job()
    if "1 rank(s) take the data of the job's first 2 (2 parts each" not in text:
        fail("ddp_train should say its one rank takes both ranks' data", text)
    step, got = expect_resumed_smaller(text, 2, float(want), "ddp_train")
    print(f"node 1 lost under --nnodes 1:2: node 0 went on alone from step {step} (the 2 ranks' "
          f"checkpoint put together, 2 parts of data a step accumulated) and ended with "
          f"parameters {got} against {want}")


def expect_a_3d_job_that_loses_a_node_to_continue_smaller():
    """train_3d on tp 2 x dp 2 over two nodes of --nnodes 1:2 (two ranks each): node 1 lost,
    node 0 goes on as tp 2 x dp 1 -- each rank's tensor-parallel slice from the old grid's
    rank of the same slice, the global batch now one replica's -- and ends within float
    tolerance of the job that never lost a node."""
    reference = subprocess.run([os.environ["BRAID_RUN"], "-n", "4"] + THREE_D,
                               capture_output=True, text=True, timeout=DEADLINE_S)
    if reference.returncode != 0:
        fail(f"train_3d without a failure exited {reference.returncode}",
             reference.stdout + reference.stderr)
    expected = float(checksum(reference.stdout))
    text = lose_node_1_of_an_elastic_job(program=THREE_D, ranks=2)
    step, got = expect_resumed_smaller(text, 4, expected, "train_3d")
    print(f"train_3d tp 2 x dp 2 lost node 1: node 0 went on as tp 2 x dp 1 from step {step} "
          f"and ended with parameters {got} against {expected}")


WANT = unbroken_checksum()
expect_a_node_braid_run_replaced_by_hand(WANT)
expect_an_etcd_job_to_survive_the_node_that_started_it(WANT)
expect_a_job_that_loses_a_node_to_continue_smaller(WANT)
expect_a_3d_job_that_loses_a_node_to_continue_smaller()
skip_without_namespaces()

expect_recovered("a rank on node 1 killed", lambda launcher: rank_on(launcher, 1), "memory",
                 30, WANT, replaced=False)
expect_recovered("node 1 killed whole", lambda launcher: node_init(launcher, 1), "memory", 30,
                 WANT, replaced=True)

# One failure more than --max-restarts 1: the job fails everywhere, both failures named.
status, output, _ = run_and_kill(
    ["--emulate-nodes", "2", "-n", "1", "--max-restarts", "1", os.environ["DDP_TRAIN"]]
    + COMMON, [(11, lambda launcher: rank_on(launcher, 1)),
               (21, lambda launcher: rank_on(launcher, 1))])
if status != 128 + signal.SIGKILL:
    fail(f"a job failing twice under --max-restarts 1 exited {status}, not 137", output)
named = re.search(r"its failures: generation 0, node 1: rank 1 \(pid \d+\) was killed by signal "
                  r"9 \(SIGKILL\).*; generation 1, node 1: rank 1 \(pid \d+\) was killed by "
                  r"signal 9", output)
if not named:
    fail("braid-run should name both failures, each with its generation and node", output)
print("a second failure past --max-restarts 1 ends the job on both nodes, both failures named")

# Node 0 lost whole: the store goes with it, and node 1 says so rather than wait.
status, output, seconds = run_and_kill(
    ["--emulate-nodes", "2", "-n", "1", "--max-restarts", "1", "--grace", "1",
     os.environ["DDP_TRAIN"]] + COMMON, [(11, lambda launcher: node_init(launcher, 0))])
if status == 0:
    fail("a job whose node 0 was killed exited 0", output)
if "lost the job's store on node 0" not in output:
    fail("node 1's braid-run should say it lost the store on node 0", output)
if seconds > 30:
    fail(f"the job took {seconds:.1f} s to end after node 0 was killed", output)
print(f"node 0 killed whole: node 1's braid-run named the lost store and the job ended "
      f"{seconds:.1f} s later, with status {status}")
