"""What the Python tests of training jobs share: failing with the job's output, the parameter
checksum the main jobs print last, and the processes a launcher started."""
import os
import re
import sys


def fail(message, output=""):
    """Prints the job's output, then the failure, and ends the test."""
    print(output)
    print("FAIL:", message)
    sys.exit(1)


def checksum(output):
    """The main jobs' last line: the sum of the parameters' squares."""
    found = re.search(r"parameters: sum of squares (\S+)", output)
    if not found:
        fail("no parameter checksum", output)
    return found.group(1)


def children(pid):
    """The processes `pid` started and still has, oldest first."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(p) for p in f.read().split()]
    return sorted(found)
