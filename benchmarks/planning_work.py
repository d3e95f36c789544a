"""Planning work: the server's estimate (perseus.server.planning.worker) against a measured run.

    python benchmarks/planning_work.py            # default grid (a few minutes on 2 cores)
    python benchmarks/planning_work.py --quick    # small cases only

Each case plans the synthetic H200-like profile (``perseus.solver.synthetic``), its times
multiplied by ``x time``, with ``plan_frontier`` (what a planning worker runs: the frontier and
its JSON) in a fresh Python process, so its peak memory is its own. "peak MiB" is that
process's ru_maxrss (imports included, about 100 MiB), "seconds" the wall time of
``plan_frontier``, "est" the estimate's figure, "G" the deadlines the estimate expects and
"points" what the frontier has. No polish (``polish_s=0``). Cases over the server's default
limit (``planning_max_cells``, "limit") are estimated, not run: the issue's 4 x 32,768
microbatches, 4 x 8 at ~5,000 s per instruction, 2 x 2 at ~1e6 s. Fixed seed.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from perseus.server.planning.worker import (
    PlanningInput,
    StoredProfile,
    estimate_planning_work,
    instruction_times,
    plan_frontier,
)
from perseus.solver import MAX_CELLS
from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, synthetic_profile

SEED = 0


@dataclass(frozen=True)
class Case:
    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int = 1
    time_scale: float = 1.0


QUICK = [Case("1f1b", 4, 8), Case("1f1b", 4, 32), Case("1f1b", 4, 8, time_scale=10.0)]
FULL = [
    *QUICK,
    Case("1f1b", 8, 32),
    Case("1f1b", 8, 96),
    Case("gpipe", 8, 96),
    Case("1f1b", 4, 8, time_scale=50.0),
    Case("1f1b", 16, 128),
    Case("interleaved-1f1b", 16, 128, 2),
    Case("1f1b", 32, 128),
    Case("1f1b", 4, 32_768),
    Case("1f1b", 4, 8, time_scale=50_000.0),
    Case("1f1b", 2, 2, time_scale=1e7),
]


def planning_input(case: Case) -> PlanningInput:
    rows = synthetic_profile(case.stages, seed=SEED)
    per_stage: dict[int, list[tuple[str, int, float, float]]] = {}
    for stage, kind, clock, time_s, energy_j in rows:
        per_stage.setdefault(stage, []).append(
            (kind, clock, time_s * case.time_scale, energy_j * case.time_scale)
        )
    profiles = tuple(
        StoredProfile(stage, 0, 0, json.dumps(stage_rows))
        for stage, stage_rows in per_stage.items()
    )
    return PlanningInput(
        job_id="bench",
        schedule=case.schedule,
        stages=case.stages,
        microbatches=case.microbatches,
        virtual_stages=case.virtual_stages,
        tensor_parallel=1,
        p_block_w=EXAMPLE_P_BLOCK_W,
        resolution_s=None,
        profiles=profiles,
    )


def measure(case: Case) -> dict[str, float]:
    """Run in a child process: plan the case, return seconds, peak RSS and frontier points."""
    inp = planning_input(case)
    started = time.perf_counter()
    result = plan_frontier(inp)
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_mib": peak_mib, "points": len(result.frontier)}


def estimate(case: Case) -> tuple[int, int, float, float]:
    inp = planning_input(case)
    times = [
        t for stored in inp.profiles for t in instruction_times(stored.stage, stored.decode().rows)
    ]
    work = estimate_planning_work(
        stages=case.stages,
        microbatches=case.microbatches,
        virtual_stages=case.virtual_stages,
        times=times,
        resolution_s=None,
    )
    return work.deadlines, work.cells, work.memory_bytes / 2**20, work.seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Case(**json.loads(args.child)))))
        return 0
    header = [
        "case",
        "n",
        "G",
        "cells",
        "limit",
        "points",
        "est MiB",
        "peak MiB",
        "est s",
        "seconds",
    ]
    table = []
    for case in QUICK if args.quick else FULL:
        deadlines, cells, est_mib, est_s = estimate(case)
        admitted = cells <= MAX_CELLS
        got: dict[str, float] = {}
        if admitted:
            out = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(case.__dict__)],
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
        label = f"{case.schedule} {case.stages}x{case.microbatches}"
        label += f" v{case.virtual_stages}" if case.virtual_stages > 1 else ""
        label += f" time x{case.time_scale:g}" if case.time_scale != 1 else ""
        n = 2 * case.stages * case.microbatches * case.virtual_stages
        table.append(
            [
                label,
                f"{n:,}",
                f"{deadlines:,}",
                f"{cells:.3g}",
                "admitted" if admitted else "refused",
                f"{int(got['points']):,}" if got else "-",
                f"{est_mib:,.0f}",
                f"{got['peak_mib']:,.0f}" if got else "-",
                f"{est_s:,.1f}",
                f"{got['seconds']:.1f}" if got else "-",
            ]
        )
        print(" | ".join(table[-1]), file=sys.stderr, flush=True)
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        print(
            "  ".join(
                cell.rjust(w) if i else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
