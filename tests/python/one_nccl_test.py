"""One NCCL per process: a Python program with torch and braid_torch loaded maps a single
libnccl, the one PyTorch's wheel brings (braid links it rather than the CUDA toolkit's), and a
C++ program on libbraid_torch (argv[1], run to its exit) does the same.

Two NCCLs in one process would be two sets of communicators, environment readers and
versions, each unaware of the other; the loader also gives the second request for
libnccl.so.2 whichever was loaded first, so which one a piece of code ran would depend on
the order of loading. Skipped where braid has no CUDA build."""

import os
import subprocess
import sys
import unittest

import torch

import braid_torch  # noqa: F401


WHEEL_NCCL = os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "nccl", "lib")
PROGRAM = None  # a C++ program on libbraid_torch, from the command line


def mapped_nccls(maps_text):
    return sorted({line.split()[-1] for line in maps_text.splitlines()
                   if os.path.basename(line.split()[-1]).startswith("libnccl")})


class OneNccl(unittest.TestCase):
    def test_python_with_torch_and_braid_maps_one_nccl(self):
        if not braid_torch.with_cuda:
            self.skipTest("braid_torch built without CUDA: no NCCL to load")
        with open("/proc/self/maps") as maps:
            nccls = mapped_nccls(maps.read())
        self.assertEqual(len(nccls), 1, f"libnccl mapped from {nccls}")
        self.assertEqual(os.path.realpath(os.path.dirname(nccls[0])), os.path.realpath(WHEEL_NCCL))

    def test_cpp_program_loads_the_wheels_nccl(self):
        if PROGRAM is None or not braid_torch.with_cuda:
            self.skipTest("no C++ program given, or no CUDA build")
        # libbraid and libtorch_cuda both need libnccl.so.2; the loader resolves the name
        # once, for whichever asks first: both must name the same file.
        libraries = subprocess.run(["ldd", PROGRAM], capture_output=True, text=True,
                                   check=True).stdout
        nccls = sorted({line.split("=>")[1].split()[0] for line in libraries.splitlines()
                        if "libnccl" in line and "=>" in line})
        self.assertEqual(len(nccls), 1, f"{PROGRAM} resolves libnccl to {nccls}")
        self.assertEqual(os.path.realpath(os.path.dirname(nccls[0])), os.path.realpath(WHEEL_NCCL))


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        PROGRAM = sys.argv.pop(1)
    unittest.main()
