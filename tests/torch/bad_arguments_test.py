#!/usr/bin/env python3
"""Bad arguments, for every tool and example, as a newcomer types them: each is refused at
once (well under the test's time limit, never by running out of memory) with one line on
stderr that starts with the program's name and names the argument or file, exit code 2 for
a usage error and 1 for input that cannot be used. Values near and past the integer limits
are among them: a count that would overflow an int, or size a table past memory, is refused
by its limit before anything is built.

Paths from the environment (meson sets them): PLAN_PROGRAM, TRACE_PROGRAM, BENCH_PROGRAM,
RUN_PROGRAM, DDP_TRAIN, TRAIN_3D, RING, OVERLAP (not BRAID_*: those are braid's own settings, and the
programs run with none but the case's).
"""
import os
import subprocess
import sys
import tempfile
import time

# No case may take longer: a refusal is immediate, so this is generous for two loaded cores.
LIMIT_S = 20
# What a refusal may echo of its input at most.
LONGEST_LINE = 400


def cases(tmp):
    def write(name, text):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    huge_rank = write("huge_rank.csv", "999999999F0\n")
    long_cell = write("long_cell.csv", "0F0," + "x" * (20 << 20) + "\n")
    not_json = write("not_json.json", "this is not json {")
    wrong_type = write("wrong_type.json", '{"traceEvents": [{"ph": "X", "ts": "soon"}]}')
    plan, trace, bench, run, ddp, train_3d, ring, overlap = (
        os.environ[k] for k in ("PLAN_PROGRAM", "TRACE_PROGRAM", "BENCH_PROGRAM", "RUN_PROGRAM",
                                "DDP_TRAIN", "TRAIN_3D", "RING", "OVERLAP"))
    one = {"BRAID_WORLD_SIZE": "1"}
    return [
        # braid-plan
        ([plan, "--schedule", "interleaved", "--ranks", "65536", "--microbatches", "65536",
          "--virtual-stages", "65536"], 2, "past the limit", {}),
        ([plan, "--schedule", "interleaved", "--ranks", "4", "--microbatches", "8",
          "--virtual-stages", "2000000000"], 2, "past the limit", {}),
        ([plan, "--schedule", "1f1b", "--ranks", "2147483647", "--microbatches", "1"], 2,
         "past the limit", {}),
        ([plan, "--schedule", "1f1b", "--ranks", "2147483648", "--microbatches", "1"], 2,
         "--ranks", {}),
        ([plan, "--schedule", "gpipe", "--ranks", "4", "--microbatches", "2000000"], 2,
         "past the limit", {}),
        ([plan, "--schedule", "1f1b", "--ranks", "-1", "--microbatches", "8"], 2, "--ranks", {}),
        ([plan, "--csv", huge_rank], 1, "past the limit", {}),
        ([plan, "--csv", long_cell], 1, "long_cell.csv", {}),
        ([plan, "--csv", "/dev/zero"], 1, "larger than", {}),
        ([plan, "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--costs-from",
          not_json], 1, "not valid JSON", {}),
        ([plan, "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2",
          "--activation-bytes", "99999999999999999999G"], 2, "--activation-bytes", {}),
        # braid-trace
        ([trace, "summary", not_json], 1, "not valid JSON", {}),
        ([trace, "summary", wrong_type], 1, "wrong_type.json", {}),
        ([trace, "frobnicate", tmp], 2, "unknown command", {}),
        ([trace, "merge", tmp], 2, "-o FILE", {}),
        # braid-bench
        ([bench, "trace-cost", "--sizes", "abc"], 2, "--sizes", {}),
        ([bench, "trace-cost", "--sizes", "99999999999999999999"], 2, "--sizes", {}),
        ([bench, "frobnicate"], 2, "unknown mode", {}),
        # braid-run
        ([run, "-n", "abc", "true"], 2, "-n", {}),
        ([run, "-n", "99999999999", "true"], 2, "-n", {}),
        # the small examples
        ([ring, "abc"], 2, "laps", one),
        ([ring, "99999999999"], 2, "laps", one),
        ([overlap, "20", "99999999999"], 2, "KiB per all-reduce", one),
        ([overlap, "5abc"], 2, "steps", one),
        # the main job
        ([ddp, "--steps", "abc"], 2, "--steps", one),
        ([ddp, "--steps", "99999999999999999999"], 2, "--steps", one),
        ([ddp, "--hidden", "1000000000"], 2, "--hidden", one),
        ([ddp, "--layers", "1000000000"], 2, "--layers", one),
        ([ddp, "--batch", "1000000000"], 2, "--batch", one),
        # the 3D job
        ([train_3d, "--microbatches", "1000000000"], 1, "past the limit", one),
        ([train_3d, "--schedule", "interleaved", "--virtual-stages", "1000000000"], 1,
         "past the limit", one),
        ([train_3d, "--layers", "1000000000"], 2, "--layers", one),
        ([train_3d, "--hidden", "1000000000", "--heads", "1"], 2, "--hidden", one),
        ([train_3d, "--vocab", "1000000000"], 2, "--vocab", one),
        ([train_3d, "--seq", "1000000000"], 2, "--seq", one),
        ([train_3d, "--global-batch", "1000000000"], 2, "--global-batch", one),
        ([train_3d, "--steps", "2147483648"], 2, "--steps", one),
    ]


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for args, code, needle, env in cases(tmp):
            name = os.path.basename(args[0])
            shown = " ".join(a if len(a) < 60 else a[:20] + "..." for a in args[1:])
            start = time.monotonic()
            clean = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
            try:
                result = subprocess.run(args, capture_output=True, text=True, timeout=LIMIT_S,
                                        env=dict(clean, **env), errors="replace")
            except subprocess.TimeoutExpired:
                failures.append(f"{name} {shown}: still running after {LIMIT_S} s")
                continue
            took = time.monotonic() - start
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            problem = None
            if result.returncode != code:
                problem = f"exit {result.returncode}, expected {code}"
            elif len(lines) != 1:
                problem = f"{len(lines)} lines on stderr, expected one"
            elif not lines[0].startswith(name):
                problem = "the line does not start with the program's name"
            elif needle not in lines[0]:
                problem = f"'{needle}' not in the line"
            elif len(lines[0]) > LONGEST_LINE:
                problem = f"a line of {len(lines[0])} characters"
            print(f"{name} {shown}: exit {result.returncode} in {took:.2f} s: "
                  f"{lines[0][:160] if lines else '(nothing on stderr)'}")
            if problem:
                failures.append(f"{name} {shown}: {problem}:\n{result.stderr[-2000:]}")
    for failure in failures:
        print("FAILED", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
