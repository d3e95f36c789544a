"""What a plan saves as it runs: the README's flow, end to end, on CPU ranks with the fake GPU.

    python benchmarks/realized_saving.py           # every schedule, 20 and 40 ms, 3 runs each
    python benchmarks/realized_saving.py --cases 1f1b:0.02,zbv:0.04 --runs 1

Each case is ``SCHEDULE:DELAY``: ``1f1b`` is 4 ranks x 8 microbatches, ``interleaved``, ``zbv``
and ``dualpipev`` 2 ranks x 2 chunks x 8 microbatches (the zero-bubble ones with split
backwards), and ``DELAY`` the fake GPU's clock-change delay in seconds
(``PERSEUS_FAKE_CLOCK_DELAY_S``; 0.02 is its default). Per case, as a user would: a planner
(``perseus serve`` on loopback, SQLite in a scratch folder, told the GPUs' clock-change delay
with ``PERSEUS_CLOCK_CHANGE_DELAY_S``), ``perseus job create``, ``torchrun``
of ``examples/torch_pipeline.py`` with ``PERSEUS_GPU=fake`` for ``--steps`` steps (profiling,
``PERSEUS_BASELINE_ITERATIONS`` iterations at default clocks, then the plan), and ``perseus
job status --json``. Printed per case:

- the baseline's and the plan's median iteration (the planner's savings view: rank spans,
  energies summed over ranks), realized against predicted slowdown and saving;
- from every rank's clock log, how many of the instructions run under the plan ran at
  another clock than planned at their middle (``ran_mhz``), counting a clock the fake's power
  limit throttles to as the planned one (a real GPU throttles a lock alike), and how many of
  those fell in the plan's first three iterations;
- what ran, in time: from the fake's record of every unit of work (``PERSEUS_FAKE_TRACE``:
  the clocks each ran at, and when), the time instructions under the plan (after its first
  three iterations) lost to running below their planned clock (a raise landing late, a
  lowering early; :func:`perseus.client.gpu.fake.time_lost_s`), in ms per iteration on the rank
  that lost the most, and how many instructions lost more than 0.1 ms.

The profiler is shortened as in the e2e tests (every 8th clock, 0.3 s windows). The host's
load moves the figures: run it on a quiet machine, and read medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from perseus.client.gpu.fake import FakeGpuModel, FakeRun, time_lost_s
from perseus.client.gpu.fake_model import default_throttled_clocks_mhz

REPO = Path(__file__).resolve().parents[1]
PERSEUS = [sys.executable, "-m", "perseus.cli"]  # no installed script needed
WARM_UP_ITERATIONS = 3
PROFILING_ENV = {
    "PERSEUS_PROFILE_CLOCKS": "every:8",
    "PERSEUS_PROFILE_WINDOW_S": "0.3",
    "PERSEUS_PROFILE_SETTLE_S": "0.1",
    "PERSEUS_PROFILE_BLOCKING_S": "0.5",
    "OMP_NUM_THREADS": "1",
}
TWO_CHUNKS = ["--virtual-stages", "2"]
SHAPES = {  # schedule -> (job create arguments, ranks, example arguments)
    "1f1b": (["--stages", "4", "--microbatches", "8"], 4, ["--schedule", "1f1b"]),
    "interleaved": (
        ["--stages", "2", "--microbatches", "8", "--schedule", "interleaved-1f1b"],
        2,
        ["--schedule", "interleaved-1f1b"],
    ),
    "zbv": (
        ["--stages", "2", "--microbatches", "8", "--schedule", "zbv", *TWO_CHUNKS],
        2,
        ["--schedule", "zbv"],
    ),
    "dualpipev": (
        ["--stages", "2", "--microbatches", "8", "--schedule", "dualpipev", *TWO_CHUNKS],
        2,
        ["--schedule", "dualpipev"],
    ),
}
THROTTLED_MHZ = default_throttled_clocks_mhz()
LOSING_S = 0.0001


@dataclass(frozen=True)
class Outcome:
    case: str
    baseline_s: float
    plan_s: float
    baseline_j: float
    plan_j: float
    realized_slowdown: float
    predicted_slowdown: float
    realized_saving: float
    predicted_saving: float
    off_clock: int
    off_clock_warm_up: int
    planned: int
    lost_ms: float  # per iteration, on the rank that lost the most
    losing: int  # instructions that lost more than LOSING_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_case(case: str, steps: int, scratch: Path) -> Outcome:
    schedule, delay = case.split(":")
    create, ranks, example = SHAPES[schedule]
    folder = scratch / case.replace(":", "-")
    folder.mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [*PERSEUS, "serve", "--port", str(port), "--database",
         f"sqlite:///{folder / 'perseus.db'}"],
        env={**os.environ, "PERSEUS_CLOCK_CHANGE_DELAY_S": delay},
        stdout=(folder / "server.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the planner did not start: see {folder / 'server.log'}")
            time.sleep(0.2)
        created = subprocess.run(
            [*PERSEUS, "job", "create", "--server", url, *create],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        env = dict(os.environ)
        for line in created.splitlines():  # export PERSEUS_SERVER=... lines
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        env.update(PROFILING_ENV)
        env.update(
            PERSEUS_GPU="fake",
            PERSEUS_FAKE_CLOCK_DELAY_S=delay,
            PERSEUS_CLOCK_LOG=str(folder / "clocks"),
            PERSEUS_FAKE_TRACE=str(folder / "fake"),
        )
        with (folder / "train.log").open("w") as log:
            subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                 "--master-port", str(free_port()), str(REPO / "examples" / "torch_pipeline.py"),
                 *example, "--microbatches", "8", "--steps", str(steps)],
                check=True, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip
        status = json.loads(
            subprocess.run(
                [*PERSEUS, "job", "status", "--json"],
                check=True, capture_output=True, text=True, env=env,
            ).stdout
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    savings = status["savings"]
    off, off_warm, planned = off_clock(folder / "clocks")
    lost_ms, losing = lost_to_clocks(folder, float(delay))
    return Outcome(
        case=case,
        baseline_s=savings["baseline"]["time_s"],
        plan_s=savings["plan"]["time_s"],
        baseline_j=savings["baseline"]["energy_j"],
        plan_j=savings["plan"]["energy_j"],
        realized_slowdown=savings["realized_slowdown"],
        predicted_slowdown=savings["predicted_slowdown"],
        realized_saving=savings["realized_saving"],
        predicted_saving=savings["predicted_saving"],
        off_clock=off,
        off_clock_warm_up=off_warm,
        planned=planned,
        lost_ms=lost_ms,
        losing=losing,
    )


def off_clock(folder: Path) -> tuple[int, int, int]:
    """Instructions under a plan that ran at another clock than planned (all; of those, in
    the plan's first iterations), and how many ran under a plan, over every rank's log."""
    off = warm = planned = 0
    for path in sorted(folder.glob("rank*.jsonl")):
        entries = [json.loads(line) for line in path.read_text().splitlines()]
        under = [e for e in entries if e["phase"] == "plan" and e["frequency_mhz"] is not None]
        first = min((e["iteration"] for e in under), default=0)
        for e in under:
            planned += 1
            expected = min(e["frequency_mhz"], THROTTLED_MHZ.get(e["instruction"], 10**6))
            if e["ran_mhz"] != expected:
                off += 1
                warm += e["iteration"] < first + WARM_UP_ITERATIONS
    return off, warm, planned


def lost_to_clocks(folder: Path, delay_s: float) -> tuple[float, int]:
    """Time lost to clocks below the planned one: ms per iteration on the worst rank, and the
    instructions that lost more than :data:`LOSING_S`, after the plan's first iterations.

    Each rank's clock log ends with the same instructions as its fake's record (the
    profiler's own units of work come before the iterations at default clocks), so the two
    are paired from the end; a pair of different kinds stops the pairing."""
    model = FakeGpuModel(clock_change_delay_s=delay_s)
    worst_ms = 0.0
    losing = 0
    for path in sorted((folder / "clocks").glob("rank*.jsonl")):
        entries = [json.loads(line) for line in path.read_text().splitlines()]
        trace = folder / "fake" / f"fake-{path.name}"
        runs = [FakeRun.from_json(line) for line in trace.read_text().splitlines()]
        under = [e for e in entries if e["phase"] == "plan" and e["frequency_mhz"] is not None]
        first = min((e["iteration"] for e in under), default=0) + WARM_UP_ITERATIONS
        lost_s = 0.0
        iterations = set()
        for entry, run in zip(reversed(entries), reversed(runs), strict=False):
            if entry["instruction"] != run.kind:
                break
            if entry["phase"] != "plan" or entry["frequency_mhz"] is None:
                continue
            if entry["iteration"] < first:
                continue
            iterations.add(entry["iteration"])
            lost = time_lost_s(model, run, entry["frequency_mhz"])
            lost_s += lost
            losing += lost > LOSING_S
        if iterations:
            worst_ms = max(worst_ms, 1000.0 * lost_s / len(iterations))
    return worst_ms, losing


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default=",".join(f"{s}:{d}" for s in SHAPES for d in ("0.02", "0.04")),
        help=f"comma-separated SCHEDULE:DELAY (schedules: {', '.join(SHAPES)})",
    )
    parser.add_argument("--steps", type=int, default=110, help="training steps per case")
    parser.add_argument("--runs", type=int, default=3, help="runs per case (medians printed)")
    parser.add_argument("--keep", help="keep each case's logs under this folder")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for case in cases:
        schedule, _, delay = case.partition(":")
        if schedule not in SHAPES or not delay:
            parser.error(f"--cases: {case!r} is not SCHEDULE:DELAY with SCHEDULE in {list(SHAPES)}")
    scratch = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="perseus-realized-"))
    print(
        f"# median of {args.runs} run(s) per case, each figure's own median; "
        f"{os.cpu_count()} CPUs\n"
        "case               baseline   plan (s)  baseline   plan (J)  slowdown: real / pred"
        "  saving: real / pred  off clock (warm-up) of planned  lost to clocks",
        flush=True,
    )
    for case in cases:
        runs = []
        for k in range(args.runs):
            runs.append(run_case(case, args.steps, scratch / f"run{k}"))
        o = Outcome(
            case=case,
            **{
                name: statistics.median(getattr(r, name) for r in runs)
                for name in Outcome.__dataclass_fields__
                if name != "case"
            },
        )
        slowdown = f"{o.realized_slowdown:+9.1%} / {o.predicted_slowdown:+.1%}"
        saving = f"{o.realized_saving:+9.1%} / {o.predicted_saving:+.1%}"
        print(
            f"{o.case:<17} {o.baseline_s:9.4f} {o.plan_s:10.4f} {o.baseline_j:9.1f} "
            f"{o.plan_j:10.1f} {slowdown} {saving}"
            f"  {o.off_clock:5.0f} ({o.off_clock_warm_up:.0f}) of {o.planned:.0f}"
            f"  {o.lost_ms:5.2f} ms/it, {o.losing:.0f} instr.",
            flush=True,
        )


if __name__ == "__main__":
    main()
