#!/usr/bin/env python3
"""braid-run --nnodes MIN:MAX: a job whose nodes may change between its starts. Two
braid-runs on this machine as nodes 0 and 1 of a job of 1 to 2 nodes (--join-wait 1):

- both join, and the first start runs on both (world 2); node 1's braid-run is SIGKILLed
  and not replaced: the job restarts on node 0 alone (world 1, node 0 named node 0 of 1)
  and ends there, with status 0;
- node 0 starts alone and, after the wait, runs on its own (world 1); node 1 comes later: it
  restarts the job to take part, and the second start runs on both (world 2);
- that restart is a membership change, not a failure: with --max-restarts 0 the late node
  still takes part;
- fewer nodes than MIN: the wait ends at BRAID_TIMEOUT, naming how many joined.

The ranks are a shell that prints what braid-run gave it. Needs nothing but braid-run
(BRAID_RUN, from meson)."""
import os
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from training_runs import fail  # noqa: E402

# A rank: says who it is; in the job's first start it stays up (until stopped), in later
# ones it ends at once.
RANK = ("echo world=$BRAID_WORLD_SIZE rank=$BRAID_RANK node=$BRAID_NODE_RANK "
        "nodes=$BRAID_NNODES restart=$BRAID_RESTART_COUNT; "
        "if [ \"$BRAID_RESTART_COUNT\" = 0 ]; then exec sleep 30; fi")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def node(rank, port, restarts=1):
    env = dict(os.environ, BRAID_TOKEN="elastic")
    return subprocess.Popen(
        [os.environ["BRAID_RUN"], "--nnodes", "1:2", "--join-wait", "1", "--node-rank",
         str(rank), "--master-addr", "127.0.0.1", "--master-port", port, "-n", "1",
         "--max-restarts", str(restarts), "sh", "-c", RANK],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def starts(output):
    """(world, restart) of every start the output's ranks announced, in order."""
    return [(int(w), int(r)) for w, r in
            re.findall(r"world=(\d+) rank=\d+ node=\d+ nodes=\d+ restart=(\d+)", output)]


def read_until(process, pattern, lines, timeout=60):
    deadline = time.monotonic() + timeout
    for line in process.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return
        if time.monotonic() > deadline:
            break
    fail(f"no line matching {pattern!r}", "".join(lines))


def expect_a_lost_node_leaves_the_job_smaller():
    port = free_port()
    first, second = node(0, port), node(1, port)
    lines = []
    try:
        read_until(first, r"world=2 rank=0", lines)
        second.kill()
        second.wait()
        lines += first.stdout.readlines()
        status = first.wait(timeout=60)
        output = "".join(lines)
        if status != 0:
            fail(f"node 0's braid-run exited {status} after node 1 was lost", output)
        if starts(output) != [(2, 0), (1, 1)]:
            fail(f"the job should run on 2 nodes, then on 1: {starts(output)}", output)
        if "the job now runs on 1 of --nnodes 1:2 (nodes 0)" not in output:
            fail("braid-run should say the job now runs on 1 node", output)
        print("node 1 lost, not replaced: the job restarted on node 0 alone (world 2, then 1) "
              "and ended with status 0")
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()


def expect_a_late_node_to_restart_the_job_to_take_part():
    port = free_port()
    first = node(0, port)
    later = None
    lines = []
    try:
        read_until(first, r"world=1 rank=0 node=0 nodes=1 restart=0", lines)
        later = node(1, port)
        theirs = later.communicate(timeout=60)[0]
        lines += first.stdout.readlines()
        status = first.wait(timeout=60)
        output = "".join(lines)
        if status != 0 or later.returncode != 0:
            fail(f"node 0's braid-run exited {status}, node 1's {later.returncode}",
                 output + theirs)
        if starts(output) != [(1, 0), (2, 1)] or starts(theirs) != [(2, 1)]:
            fail(f"the job should run on node 0 alone, then on both: node 0 saw "
                 f"{starts(output)}, node 1 {starts(theirs)}", output + theirs)
        if "node 1 joined the job, which restarts to take it in" not in output + theirs:
            fail("the restart should name the node that joined", output + theirs)
        print("node 1 came late: it restarted the job, whose second start ran on both nodes "
              "(world 1, then 2)")
    finally:
        for p in (first, later):
            if p and p.poll() is None:
                p.kill()
                p.wait()


def expect_taking_in_a_node_to_cost_no_restart():
    port = free_port()
    first = node(0, port, restarts=0)
    later = None
    lines = []
    try:
        read_until(first, r"world=1 rank=0 node=0 nodes=1 restart=0", lines)
        later = node(1, port, restarts=0)
        theirs = later.communicate(timeout=60)[0]
        lines += first.stdout.readlines()
        status = first.wait(timeout=60)
        output = "".join(lines)
        if status != 0 or later.returncode != 0:
            fail(f"with --max-restarts 0, node 0's braid-run exited {status}, the late node's "
                 f"{later.returncode}", output + theirs)
        if starts(output) != [(1, 0), (2, 1)]:
            fail(f"the job should take in node 1 with --max-restarts 0: {starts(output)}",
                 output + theirs)
        if "to take in a node, not counted against --max-restarts" not in output + theirs:
            fail("the restart should say it is not counted against --max-restarts",
                 output + theirs)
        print("node 1 came late under --max-restarts 0: taken in all the same (a membership "
              "change is not a failure); world 1, then 2")
    finally:
        for p in (first, later):
            if p and p.poll() is None:
                p.kill()
                p.wait()


def expect_too_few_nodes_to_end_the_wait_at_the_timeout():
    port = free_port()
    started = time.monotonic()
    alone = subprocess.run(
        [os.environ["BRAID_RUN"], "--nnodes", "2:3", "--join-wait", "1", "--node-rank", "0",
         "--master-addr", "127.0.0.1", "--master-port", port, "-n", "1", "true"],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, BRAID_TOKEN="elastic", BRAID_TIMEOUT="2"))
    waited = time.monotonic() - started
    if alone.returncode != 1 or "1 of the 2 nodes --nnodes 2:3 needs joined" not in alone.stderr:
        fail(f"braid-run exited {alone.returncode} without naming the nodes missing",
             alone.stdout + alone.stderr)
    if waited > 20:
        fail(f"the wait took {waited:.1f} s with BRAID_TIMEOUT=2", alone.stderr)
    print(f"one node of --nnodes 2:3: the wait ended after {waited:.1f} s (BRAID_TIMEOUT=2), "
          "naming how many joined")


expect_a_lost_node_leaves_the_job_smaller()
expect_a_late_node_to_restart_the_job_to_take_part()
expect_taking_in_a_node_to_cost_no_restart()
expect_too_few_nodes_to_end_the_wait_at_the_timeout()
