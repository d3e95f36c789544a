"""Quality at no slowdown: perseus's saving against the exact optimum (MILP) and its bounds.

    python benchmarks/quality.py [--time-limit 120] [--polish 30] [--microbatches 12 24]

For every shared profile (../shared/data/profiles) and microbatch count, 8-stage 1F1B, at the
all-fastest iteration time: the saving of perseus's no-slowdown point in fast mode (no
polish), with ``--polish`` seconds of branch and bound (the CLI's and the server's default),
of the best plan the MILP (scipy.optimize.milp / HiGHS, options that cannot fit the deadline
removed) finds within the time limit, the MILP's proven bound, and the convex relaxation's
bound. "pp to bound" is how far perseus's saving is from the best saving the bound allows;
where the MILP proves optimality, that is the distance to the exact optimum. Savings are
against the all-fastest plan. The polish has a wall-clock budget, so its column depends on
the machine's speed and load; everything else is deterministic.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from scipy.optimize import milp

from perseus.solver import build_costs, build_dag, compute_frontier, load_profile, make_schedule
from perseus.solver.programs import ExactProgram, Relaxation

PROFILES = {
    "bloom+a100_sxm_bf16.csv": 83.64,
    "bloom+a40_bf16.csv": 70.38,
    "gpt3-175b+a40_bf16.csv": 70.38,
}
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "profiles"
HEADER = (
    "profile", "M", "fast %", "s", "polished %", "s", "MILP best %", "MILP bound %",
    "LP bound %", "MILP status", "fast pp to bound", "polished pp to bound",
)  # fmt: skip


def _case(
    name: str, p_block: float, microbatches: int, polish_s: float, limit_s: float
) -> tuple[str, ...]:
    profile = load_profile(SHARED / name)
    schedule = make_schedule("1f1b", profile.num_stages, microbatches)
    started = time.perf_counter()
    fast = compute_frontier(profile, schedule, p_block_w=p_block)
    fast_s = time.perf_counter() - started
    started = time.perf_counter()
    polished = compute_frontier(profile, schedule, p_block_w=p_block, polish_s=polish_s)
    polished_s = time.perf_counter() - started
    base = fast.baselines["all_fastest"].energy_j
    deadline = float(fast.times_s[0])
    dag = build_dag(schedule)
    costs = build_costs(profile, schedule, p_block)
    relaxed = Relaxation(dag, costs).solve(deadline).value_j
    arguments = ExactProgram(dag, costs).milp_arguments(deadline)
    result = milp(**arguments, options={"time_limit": limit_s, "mip_rel_gap": 1e-6})

    def saving(energy: float) -> float:  # the MILP's objective is the energy itself
        return 100 * (1 - energy / base)

    ours, better = saving(float(fast.energies_j[0])), saving(float(polished.energies_j[0]))
    best = saving(float(result.fun)) if result.x is not None else float("nan")
    bound = saving(float(result.mip_dual_bound))
    status = "optimal" if result.status == 0 else "time limit"
    return (
        name.removesuffix(".csv"), str(microbatches), f"{ours:.3f}", f"{fast_s:.2f}",
        f"{better:.3f}", f"{polished_s:.1f}", f"{best:.3f}", f"{bound:.3f}",
        f"{saving(relaxed):.3f}", status, f"{bound - ours:.3f}", f"{bound - better:.3f}",
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=120.0, help="MILP seconds per case")
    parser.add_argument("--polish", type=float, default=30.0, help="polish seconds per case")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[12, 24])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    args = parser.parse_args()
    rows = []
    for name in args.profiles:
        for microbatches in args.microbatches:
            rows.append(_case(name, PROFILES[name], microbatches, args.polish, args.time_limit))
            print("  done", name, microbatches, flush=True)
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    for row in [HEADER, tuple("-" * w for w in widths), *rows]:
        cells = zip(row, widths, strict=True)
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(cells)))


if __name__ == "__main__":
    main()
