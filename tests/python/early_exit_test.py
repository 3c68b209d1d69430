"""A Python rank that raises leaves the job at once, and its peers with it: the exception
never unwinds through C++, so braid_torch's sys.excepthook announces the failure before the
interpreter exits, and the ranks waiting on it in a collective fail naming it instead of
waiting for their deadline (30 s of leave barrier before). Under braid-run and with
torchrun's variables set by hand. Arguments: braid-run's path."""

import os
import socket
import subprocess
import sys
import time
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raising_rank.py")
BRAID_RUN = None
# Every rank gone within this long of the start: Python's and torch's start-up take a few
# seconds of it on two loaded cores; the leave barrier alone used to take 30 after them.
DEADLINE_S = 25


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ARaisingRankEndsTheJob(unittest.TestCase):
    def check(self, outputs, elapsed, codes):
        self.assertLess(elapsed, DEADLINE_S, f"the job took {elapsed:.1f} s:\n{outputs}")
        self.assertTrue(all(code != 0 for code in codes), f"exit codes {codes}:\n{outputs}")
        self.assertIn("ValueError", outputs)
        # The survivor names the rank that raised, and why.
        self.assertRegex(outputs, r"rank 1 .*raised ValueError", outputs)

    def test_under_braid_run(self):
        start = time.monotonic()
        result = subprocess.run([BRAID_RUN, "-n", "2", sys.executable, SCRIPT],
                                env=dict(os.environ, FAIL_RANK="1"), capture_output=True,
                                text=True, timeout=120)
        self.check(result.stdout + result.stderr, time.monotonic() - start, [result.returncode])

    def test_with_torchruns_variables_and_no_launcher(self):
        port = str(free_port())
        start = time.monotonic()
        ranks = [subprocess.Popen([sys.executable, SCRIPT],
                                  env=dict(os.environ, FAIL_RANK="1", RANK=str(r), WORLD_SIZE="2",
                                           LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                           MASTER_PORT=port),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        outputs = [p.communicate(timeout=120)[0] for p in ranks]
        self.check("\n".join(outputs), time.monotonic() - start, [p.returncode for p in ranks])
        # The survivor itself names the rank that raised.
        self.assertRegex(outputs[0], r"rank 1 .*raised ValueError", outputs[0])


if __name__ == "__main__":
    BRAID_RUN = sys.argv.pop(1)
    unittest.main(verbosity=2)
