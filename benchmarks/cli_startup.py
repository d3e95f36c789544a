"""How quickly the ``perseus`` command answers, and how soon and how steadily it shows progress.

Prints one table:

- ``perseus --help``, ``perseus --version``, ``perseus plan --help``: whole-process wall time,
  median of ``--repeat`` runs (target: ``perseus --help`` under 0.3 s).
- ``perseus plan`` and ``perseus demo`` with stderr on a pseudo-terminal: seconds until the
  first progress line appears (target: under 0.5 s), the longest stretch without a redraw while
  the command ran, the phases it showed, and the whole run's wall time.

Usage::

    python benchmarks/cli_startup.py                  # the example profile, 4 x 8 and 4 x 64
    python benchmarks/cli_startup.py --profile ../shared/data/profiles/bloom+a40_bf16.csv \\
        --p-block 70.38 --microbatches 96

Runs ``perseus`` from the environment's ``PATH`` (the installed entry point), in a temporary
directory. No asserts: it prints what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pty
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

_PHASE = re.compile(rb"perseus: ([^\[\r\x1b]*?)(?: \[| [|/\\-] )")


def wall_s(argv: list[str], repeat: int, cwd: str) -> float:
    """Median whole-process wall time of ``argv``."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def on_terminal(argv: list[str], cwd: str) -> tuple[float | None, float, list[str], float]:
    """Run ``argv`` with stderr on a pseudo-terminal.

    Returns:
        Seconds to the first progress output (None if none), the longest gap between two
        outputs while it ran, the distinct phases shown in order, and the wall time.
    """
    leader, follower = pty.openpty()
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=follower, stdin=subprocess.DEVNULL
    )
    os.close(follower)
    stamps: list[float] = []
    data = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            stamps.append(time.perf_counter() - started)
            data += chunk
        elif process.poll() is not None:
            break
    process.wait()
    ended = time.perf_counter() - started
    os.close(leader)
    phases: list[str] = []
    for match in _PHASE.finditer(data):
        phase = match.group(1).decode(errors="replace").strip()
        if not phases or phases[-1] != phase:
            phases.append(phase)
    first = stamps[0] if stamps else None
    marks = [*stamps, ended] if stamps else [ended]
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    return first, max(gaps, default=0.0), phases, ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=11, help="runs per wall-time figure")
    parser.add_argument("--profile", help="profile for the plan runs (default: the example)")
    parser.add_argument("--p-block", default="100", help="blocking power for --profile")
    parser.add_argument("--microbatches", nargs="*", default=["8", "64"])
    args = parser.parse_args()
    perseus = shutil.which("perseus")
    if perseus is None:
        sys.exit("cli_startup.py: no perseus on PATH; pip install -e . first")
    with tempfile.TemporaryDirectory() as work:
        if args.profile:
            profile = str(Path(args.profile).resolve())
        else:
            profile = str(Path(work) / "example_profile.csv")
            example = resources.files("perseus") / "data" / "example_profile.csv"
            Path(profile).write_bytes(example.read_bytes())
        rows = [["command", "runs", "median s", "first progress s", "longest gap s", "phases"]]
        for argv in (["--help"], ["--version"], ["plan", "--help"]):
            seconds = wall_s([perseus, *argv], args.repeat, work)
            rows.append(
                [f"perseus {' '.join(argv)}", str(args.repeat), f"{seconds:.3f}", "", "", ""]
            )
        runs = [
            ["plan", profile, "--microbatches", m, "--p-block", args.p_block, "--plot", "f.png"]
            for m in args.microbatches
        ]
        runs.append(["demo", "--outdir", "demo"])
        for argv in runs:
            first, gap, phases, seconds = on_terminal([perseus, *argv], work)
            shown = " ".join(a if "/" not in a else Path(a).name for a in argv)
            rows.append(
                [
                    f"perseus {shown} (stderr a terminal)",
                    "1",
                    f"{seconds:.3f}",
                    "-" if first is None else f"{first:.3f}",
                    f"{gap:.3f}",
                    " > ".join(phases),
                ]
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"# perseus CLI start-up, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
