#!/usr/bin/env python3
"""braid-plan as a user runs it: a good plan prints each rank's bubble and the textbook's
and writes a Chrome trace and a CSV that plan the same again; the trace it wrote, read
back as measured costs, gives the same plan; a bad schedule name, bad numbers, a malformed
CSV and a schedule that cannot run (a B before its F) each fail with one line on stderr.

Path from the environment (meson sets it): BRAID_PLAN.
"""
import json
import os
import subprocess
import sys
import tempfile
import time


def plan(*args):
    return subprocess.run([os.environ["BRAID_PLAN"], *args], capture_output=True, text=True,
                          timeout=60)


def expect_ok(result):
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr}"
    return result.stdout


def expect_one_line_failure(result, exit_code, needle):
    assert result.returncode == exit_code, (
        f"exit {result.returncode}, expected {exit_code}:\n{result.stdout}{result.stderr}")
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("braid-plan: "), lines[0]
    assert needle in lines[0], f"'{needle}' not in: {lines[0]}"


def bubble_line(stdout):
    return next(line for line in stdout.splitlines() if line.startswith("bubble:"))


def fastest_plan(*args, runs=3):
    """The least wall time of `runs` plans, in seconds (two loaded cores: the least is the
    one least disturbed)."""
    best = None
    for _ in range(runs):
        start = time.monotonic()
        expect_ok(plan(*args))
        took = time.monotonic() - start
        best = took if best is None else min(best, took)
    return best


def check_scaling(tmp):
    """Planning a CSV four times as wide takes about four times as long, not sixteen: every
    pass over the schedule is near-linear in its actions (a pass per pipeline wave over
    every rank was quadratic: 10^4 ranks took 4.7 s, 3x10^4 took 56 s)."""
    times = {}
    for ranks in (1024, 4096):
        csv = os.path.join(tmp, f"wide_{ranks}.csv")
        expect_ok(plan("--schedule", "1f1b", "--ranks", str(ranks), "--microbatches", "16",
                       "--quiet", "--write-csv", csv))
        times[ranks] = fastest_plan("--csv", csv, "--quiet")
    ratio = times[4096] / times[1024]
    print(f"braid-plan --csv: 1024 ranks {times[1024]:.2f} s, 4096 ranks {times[4096]:.2f} s "
          f"({ratio:.1f}x for 4x the ranks)")
    assert ratio < 10, f"4x the ranks took {ratio:.1f}x as long: {times}"


def main():
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "plan.json")
        csv = os.path.join(tmp, "plan.csv")
        out = expect_ok(plan("--schedule", "1f1b", "--ranks", "4", "--microbatches", "8",
                             "--activation-bytes", "64M", "--trace", trace, "--write-csv", csv))
        # 1F1B with unit costs: every rank idles (p-1)/(m+p-1) = 3/11 of the step.
        assert bubble_line(out) == (
            "bubble: simulated 27.27% (mean over ranks), textbook 27.27% ((p-1)/(m+p-1))"), out
        rank_rows = [line.split() for line in out.splitlines()
                     if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])]
        assert [row[2] for row in rank_rows] == ["27.27%"] * 4, out
        assert [row[3] for row in rank_rows] == ["4", "3", "2", "1"], out  # peak in flight
        assert [" ".join(row[4:]) for row in rank_rows] == [
            "256.0 MiB", "192.0 MiB", "128.0 MiB", "64.0 MiB"], out
        assert "step time 33\n" in out, out

        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        spans = [e for e in events if e["ph"] == "X"]
        assert {e["pid"] for e in spans} == {0, 1, 2, 3}, spans
        assert sum(e["name"].endswith(("F0", "F7")) and "SEND" not in e["name"]
                   and "RECV" not in e["name"] for e in spans) == 8
        names = [e["args"]["name"] for e in events if e["name"] == "process_name"]
        assert len(names) == 4, names

        # The CSV it wrote plans the same; the trace it wrote, as measured costs (1 us per
        # unit), too.
        again = expect_ok(plan("--csv", csv, "--quiet"))
        assert bubble_line(again) == bubble_line(out), again
        measured = expect_ok(plan("--schedule", "1f1b", "--ranks", "4", "--microbatches", "8",
                                  "--costs-from", trace, "--quiet"))
        assert "median F 1.0 us (32 spans), B 2.0 us (32)" in measured, measured
        assert bubble_line(measured) == bubble_line(out), measured

        # Interleaved, zero bubble: below 1F1B's bubble.
        for name, extra in (("interleaved", ["--virtual-stages", "2"]), ("zb", [])):
            other = expect_ok(plan("--schedule", name, "--ranks", "4", "--microbatches", "8",
                                   "--quiet", *extra))
            simulated = float(bubble_line(other).split()[2].rstrip("%"))
            assert simulated < 27.27, other

        expect_one_line_failure(plan("--schedule", "pipedream", "--ranks", "4",
                                     "--microbatches", "8"), 2, "pipedream")
        expect_one_line_failure(plan("--schedule", "gpipe", "--ranks", "four",
                                     "--microbatches", "8"), 2, "--ranks takes a number")
        expect_one_line_failure(plan("--ranks", "4"), 2, "--schedule")

        malformed = os.path.join(tmp, "malformed.csv")
        with open(malformed, "w") as f:
            f.write("0F0,0X1\n1F0\n")
        expect_one_line_failure(plan("--csv", malformed), 1, "malformed.csv")

        backward_first = os.path.join(tmp, "backward_first.csv")
        with open(backward_first, "w") as f:
            f.write("0F0,0B0\n1B0,1F0\n")
        expect_one_line_failure(plan("--csv", backward_first), 1, "1B0")

        expect_one_line_failure(plan("--csv", os.path.join(tmp, "absent.csv")), 1,
                                "cannot be opened")
        check_scaling(tmp)
    print("braid-plan: good plans, trace, CSV and measured costs; bad input refused; "
          "near-linear in a CSV's ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
