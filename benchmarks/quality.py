"""Quality at no slowdown: perseus's saving against the exact optimum (MILP) and its bounds.

    python benchmarks/quality.py [--time-limit 120] [--microbatches 12 24]

For every shared profile (../shared/data/profiles) and microbatch count, 8-stage 1F1B, at the
all-fastest iteration time: the saving of perseus's no-slowdown point (fast mode), of the best
plan the MILP (scipy.optimize.milp / HiGHS) finds within the time limit, the MILP's proven
bound, and the convex relaxation's bound. "pp to bound" is how far perseus's saving is from the
best saving the bound allows; where the MILP proves optimality, that is the distance to the
exact optimum. Savings are against the all-fastest plan. Deterministic (no randomness).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, milp

from perseus.solver import build_costs, build_dag, compute_frontier, load_profile, make_schedule
from perseus.solver.programs import ExactProgram, Relaxation

PROFILES = {
    "bloom+a100_sxm_bf16.csv": 83.64,
    "bloom+a40_bf16.csv": 70.38,
    "gpt3-175b+a40_bf16.csv": 70.38,
}
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "profiles"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=120.0, help="MILP seconds per case")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[12, 24])
    args = parser.parse_args()
    header = (
        "profile", "M", "perseus %", "s", "MILP best %", "MILP bound %", "LP bound %",
        "MILP status", "pp to MILP", "pp to bound",
    )  # fmt: skip
    rows = []
    for name, p_block in PROFILES.items():
        profile = load_profile(SHARED / name)
        for microbatches in args.microbatches:
            schedule = make_schedule("1f1b", profile.num_stages, microbatches)
            started = time.perf_counter()
            frontier = compute_frontier(profile, schedule, p_block_w=p_block)
            seconds = time.perf_counter() - started
            base = frontier.baselines["all_fastest"].energy_j
            deadline = float(frontier.times_s[0])
            dag = build_dag(schedule)
            costs = build_costs(profile, schedule, p_block)
            relaxed = Relaxation(dag, costs).solve(deadline).value_j
            program = ExactProgram(dag, costs)
            upper = np.concatenate([np.full(dag.size + 1, np.inf), np.ones(program._width - dag.size - 1)])
            upper[dag.size] = deadline
            result = milp(
                program._cost,
                integrality=program._integrality,
                bounds=Bounds(np.zeros(program._width), upper),
                constraints=program._constraints,
                options={"time_limit": args.time_limit, "mip_rel_gap": 1e-6},
            )
            ours = 1 - float(frontier.energies_j[0]) / base
            best = 1 - float(result.fun) / base if result.x is not None else float("nan")
            bound = 1 - float(result.mip_dual_bound) / base
            status = "optimal" if result.status == 0 else "time limit"
            rows.append(
                (
                    name.removesuffix(".csv"), str(microbatches), f"{100 * ours:.3f}",
                    f"{seconds:.2f}", f"{100 * best:.3f}", f"{100 * bound:.3f}",
                    f"{100 * (1 - relaxed / base):.3f}", status,
                    f"{100 * (best - ours):.3f}", f"{100 * (bound - ours):.3f}",
                )  # fmt: skip
            )
            print("  done", rows[-1][0], microbatches, flush=True)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))


if __name__ == "__main__":
    main()
