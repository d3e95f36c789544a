"""Reference MILPs for benchmarks/quality.py: the best plan HiGHS finds within a time limit.

    python benchmarks/milp_reference_job.py OUT.json --time-limit 300 --jobs 32 [--part 0/2]
        [--schedules 1f1b zbv interleaved-zb] [--factors 1 1.01 1.02 1.05]

For every shared profile x microbatch count x schedule (8-stage 1F1B by default; the zero-bubble
ones on 8 GPUs x 2 chunks with the backward split as ``perseus.solver.synthetic.split_backward``
does) and every deadline factor (1, 1.01,
1.02, 1.05 times the default plan's iteration time: every instruction at the profile's highest
clock), one single-threaded HiGHS MILP (options that cannot fit removed), run in parallel
processes. Writes the best energy found, its replayed time, HiGHS's dual bound and status.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.solver import build_costs, build_dag, load_profile, make_schedule, replay
from perseus.solver.programs import ExactProgram
from perseus.solver.synthetic import split_backward

PROFILES = {
    "bloom+a100_sxm_bf16.csv": 83.64,
    "bloom+a40_bf16.csv": 70.38,
    "gpt3-175b+a40_bf16.csv": 70.38,
}
MICROBATCHES = (12, 24, 48, 96)
FACTORS = (1.0, 1.01, 1.02, 1.05)


def _load(profile_dir: Path, name: str, schedule_name: str, microbatches: int) -> tuple:
    profile = load_profile(profile_dir / name)
    chunks = 1
    if schedule_name != "1f1b":
        profile, chunks = split_backward(profile), 2
    return profile, make_schedule(schedule_name, profile.num_stages, microbatches, chunks)


def default_plan_time(
    profile_dir: Path, name: str, microbatches: int, schedule_name: str = "1f1b"
) -> tuple[float, float]:
    """(time, energy) of every instruction at its stage's highest measured clock."""
    profile, schedule = _load(profile_dir, name, schedule_name, microbatches)
    clocks = [
        [max(o.frequency_mhz for o in profile.stages[g][inst.kind]) for inst in seq]
        for g, seq in enumerate(schedule.order)
    ]
    result = replay(profile, schedule, PROFILES[name], clocks)
    return result.time_s, result.energy_j


def solve(job: tuple[str, str, int, float, float, str]) -> dict[str, Any]:
    profile_dir, name, microbatches, factor, limit_s, schedule_name = job
    profile, schedule = _load(Path(profile_dir), name, schedule_name, microbatches)
    power = PROFILES[name]
    dag = build_dag(schedule)
    costs = build_costs(profile, schedule, power)
    t_default, e_default = default_plan_time(Path(profile_dir), name, microbatches, schedule_name)
    deadline = factor * t_default
    program = ExactProgram(dag, costs)
    highs = program.reference_model(deadline)
    highs.setOptionValue("time_limit", float(limit_s))
    highs.setOptionValue("mip_rel_gap", 1e-6)
    started = time.perf_counter()
    highs.run()
    seconds = time.perf_counter() - started
    info = highs.getInfo()
    status = highs.modelStatusToString(highs.getModelStatus())
    out: dict[str, Any] = {
        "profile": name, "schedule": schedule_name, "microbatches": microbatches,
        "factor": factor,
        "deadline_s": deadline, "default_time_s": t_default, "default_energy_j": e_default,
        "status": status, "seconds": seconds, "bound_j": float(info.mip_dual_bound),
        "best_j": None, "best_time_s": None,
    }  # fmt: skip
    x = np.asarray(highs.getSolution().col_value)
    if x.shape == (highs.getNumCol(),) and np.isfinite(x).all():
        n = dag.size
        chosen = x[n + 1 :] > 0.5
        choice = program.plan_of(x)
        if chosen.sum() == n:
            flat = costs.start[dag.cost_class] + choice
            freqs = costs.frequency_mhz[flat]
            rows, at = [], 0
            for seq in schedule.order:
                rows.append([int(f) for f in freqs[at : at + len(seq)]])
                at += len(seq)
            check = replay(profile, schedule, power, rows)
            if check.time_s <= deadline * (1 + 1e-9):
                out["best_j"], out["best_time_s"] = check.energy_j, check.time_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument(
        "--profiles-dir",
        default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "profiles"),
    )
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--jobs", type=int, default=multiprocessing.cpu_count())
    parser.add_argument("--part", default="0/1", help="K/N: the K-th of N interleaved shares")
    parser.add_argument("--microbatches", type=int, nargs="+", default=list(MICROBATCHES))
    parser.add_argument("--schedules", nargs="+", default=["1f1b"])
    parser.add_argument("--factors", type=float, nargs="+", default=list(FACTORS))
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    args = parser.parse_args()
    k, parts = (int(v) for v in args.part.split("/"))
    jobs = [
        (args.profiles_dir, name, m, f, args.time_limit, schedule)
        for m in args.microbatches[::-1]
        for name in args.profiles
        for schedule in args.schedules
        for f in args.factors
    ][k::parts]
    with multiprocessing.Pool(args.jobs) as pool:
        results = []
        for result in pool.imap_unordered(solve, jobs):
            print(json.dumps(result), flush=True)
            results.append(result)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
