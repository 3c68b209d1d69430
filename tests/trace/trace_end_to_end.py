#!/usr/bin/env python3
"""End to end, as a user does it: run examples/overlap on two ranks under braid-run with
BRAID_TRACE, then read the directory with braid-trace.

  trace_end_to_end.py summary   the rank files, their clock blocks, and the summary's figures;
                                then small all-reduces, sampled, and how the summary counts them
  trace_end_to_end.py html      the HTML timeline rendered in headless Chromium: the
                                screenshot shows the compute, exposed and hidden colours

Paths come from the environment (meson sets them): BRAID_RUN, OVERLAP, BRAID_TRACE_TOOL.
Exit 77 (meson's skip) when Chromium is not installed; tools/dev installs it.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

STEPS = 8
SUMMARY_KIB = 1024
# The render needs exposed communication wide enough to see: 4 MiB all-reduces.
HTML_KIB = 4096
# Sampled: 4 KiB all-reduces, below BRAID_TRACE_SAMPLE_KIB, recorded one in 4.
SAMPLED_STEPS = 200
SAMPLED_KIB = 4
SAMPLE_EVERY = 4


def run_job(directory, kib, steps=STEPS, **extra_env):
    env = dict(os.environ, BRAID_TRACE=directory, **extra_env)
    subprocess.run([os.environ["BRAID_RUN"], "-n", "2", os.environ["OVERLAP"], str(steps), str(kib)],
                   env=env, check=True, timeout=120)


def braid_trace(*args):
    return subprocess.run([os.environ["BRAID_TRACE_TOOL"], *args], check=True, timeout=60,
                          capture_output=True, text=True).stdout


def check_summary(directory):
    files = sorted(os.listdir(directory))
    assert files == ["rank-0.trace.json", "rank-1.trace.json"], files
    for rank in (0, 1):
        trace = json.load(open(os.path.join(directory, f"rank-{rank}.trace.json")))
        assert trace["distributedInfo"] == {"backend": "braid", "rank": rank, "world_size": 2}
        clock = trace["braid"]["clock"]
        if rank == 0:
            assert clock["offset_ns"] == 0 and clock["round_trip_ns"] == 0, clock
        else:
            # One machine, one CLOCK_MONOTONIC: the measured offset is within its error bound.
            assert clock["round_trip_ns"] > 0, clock
            assert abs(clock["offset_ns"]) <= clock["round_trip_ns"], clock
        names = {e["name"] for e in trace["traceEvents"]}
        assert {"all_reduce", "backward", "ring.reduce_scatter"} & names, names
        # Every collective names its communicator (the world's is 1) beside its sequence
        # number: what the summary matches calls across ranks by.
        calls = [e for e in trace["traceEvents"] if e.get("name") == "all_reduce" and e["ph"] != "e"]
        assert calls and all(e["args"]["comm"] == 1 and "seq" in e["args"] for e in calls), calls
    summary = json.loads(braid_trace("summary", "--json", directory))
    job = summary["job"]
    assert summary["world_size"] == 2
    assert job["collectives"]["all_reduce"]["count"] == 2 * STEPS, job["collectives"]
    assert job["collectives"]["all_reduce"]["bytes"] == 2 * STEPS * SUMMARY_KIB * 1024
    assert job["compute_ns"] > 0 and job["communication_ns"] > 0, job
    # Three steps in four overlap their all-reduce with compute, one waits first.
    assert 0 < job["overlap_percent"] < 100, job
    assert job["exposed_communication_ns"] > 0, job
    assert job["exposed_communication_ns"] == job["communication_ns"] - job["overlap_ns"]
    # Every call is matched on both ranks; exposed time splits into waiting and transfer.
    assert job["matched_calls"] == 2 * STEPS, job
    assert 0 <= job["waiting_ns"] <= job["exposed_communication_ns"], job
    assert job["waiting_ns"] + job["transfer_ns"] == job["exposed_communication_ns"], job
    assert sum(job["waited_for_ns"].values()) == job["waiting_ns"], job
    # The compute regions carry their threads' off-core time: a sum over both ranks, never
    # more than their compute.
    assert 0 <= job["compute_off_core_ns"] <= job["compute_ns"], job
    text = braid_trace("summary", directory)
    assert "overlap%" in text and "all_reduce" in text and "off-core" in text, text
    assert "waiting" in text and "transfer" in text, text
    print(text)


def check_sampled(directory):
    """Small all-reduces (4 KiB, one in SAMPLE_EVERY after each communicator's first
    SAMPLE_EVERY): every rank records the same calls, and the summary counts each sampled
    span as the calls it stands for."""
    sampled_seqs, whole = [], 0
    for rank in (0, 1):
        trace = json.load(open(os.path.join(directory, f"rank-{rank}.trace.json")))
        ops = [e for e in trace["traceEvents"] if e.get("name") == "all_reduce" and e["ph"] != "e"]
        seqs = set()
        for e in ops:
            args = e.get("args", {})
            if "sampled" in args:
                assert args["sampled"] == SAMPLE_EVERY, e
                assert args["seq"] >= SAMPLE_EVERY, e
                seqs.add(args["seq"])
            else:
                assert args["seq"] < SAMPLE_EVERY, e
                whole += 1
        sampled_seqs.append(seqs)
    assert sampled_seqs[0] == sampled_seqs[1], "ranks recorded different calls"
    assert whole == 2 * SAMPLE_EVERY, whole
    assert 0 < len(sampled_seqs[0]) < SAMPLED_STEPS - SAMPLE_EVERY, sampled_seqs
    job = json.loads(braid_trace("summary", "--json", directory))["job"]
    all_reduce = job["collectives"]["all_reduce"]
    recorded = whole + 2 * len(sampled_seqs[0])
    assert all_reduce["recorded"] == recorded, all_reduce
    assert all_reduce["count"] == whole + 2 * SAMPLE_EVERY * len(sampled_seqs[0]), all_reduce
    assert all_reduce["bytes"] == all_reduce["count"] * SAMPLED_KIB * 1024, all_reduce
    # Both ranks recorded the same calls, so every one (sampled ones for their calls) is
    # matched across them.
    assert job["matched_calls"] == all_reduce["count"], (job["matched_calls"], all_reduce)
    text = braid_trace("summary", directory)
    assert f"~{all_reduce['count']}" in text, text
    print(text)


def png_pixels(path):
    """RGB(A) 8-bit PNG -> (width, height, list of rows of (r, g, b))."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    channels = 4 if color == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + predictor) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, channels)])
        previous = line
    return width, height, rows


def check_html(directory, scratch):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium is not installed (tools/dev installs it); skipping the render")
        sys.exit(77)
    page = os.path.join(scratch, "timeline.html")
    braid_trace("html", directory, "-o", page)
    shot = os.path.join(scratch, "timeline.png")
    subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", "--window-size=1280,720",
                    f"--user-data-dir={os.path.join(scratch, 'profile')}",
                    f"--screenshot={shot}", "file://" + page],
                   check=True, timeout=120, capture_output=True)
    width, height, rows = png_pixels(shot)
    assert (width, height) == (1280, 720), (width, height)
    counts = {}
    for row in rows:
        for pixel in row:
            counts[pixel] = counts.get(pixel, 0) + 1
    white = counts.get((255, 255, 255), 0)
    assert white < width * height * 0.97, "the screenshot is (almost) blank"
    # Legend swatches are 12x12 (144 px): the lanes must add clearly more than that. How
    # much communication is exposed varies run to run; compute and hidden are wide.
    colours = {"compute": ((242, 142, 43), 1000), "exposed": ((225, 87, 89), 300),
               "hidden": ((89, 161, 79), 1000)}
    for what, (rgb, least) in colours.items():
        seen = sum(n for pixel, n in counts.items()
                   if all(abs(a - b) <= 6 for a, b in zip(pixel, rgb)))
        assert seen > least, f"{what} {rgb}: only {seen} pixels in the screenshot"
        print(f"{what}: {seen} pixels")


def main():
    part = sys.argv[1] if len(sys.argv) > 1 else "summary"
    scratch = tempfile.mkdtemp(prefix="braid-trace-e2e-")
    try:
        directory = os.path.join(scratch, "traces")
        if part == "summary":
            run_job(directory, SUMMARY_KIB)
            check_summary(directory)
            sampled = os.path.join(scratch, "sampled")
            run_job(sampled, SAMPLED_KIB, SAMPLED_STEPS, BRAID_TRACE_SAMPLE_EVERY=str(SAMPLE_EVERY))
            check_sampled(sampled)
        else:
            run_job(directory, HTML_KIB)
            check_html(directory, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
