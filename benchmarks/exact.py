"""How far exact mode reaches: one HiGHS MILP per deadline on the shipped example profile.

    python benchmarks/exact.py [--time-limit 120] [--sweep-limit 600]

The example profile (``perseus demo``: 4 stages, 66 clocks, P_block 100 W), 1F1B with 2, 4
and 8 microbatches. For each size, at 1, 1.02 and 1.05 x the default plan's iteration time
(every instruction at its highest clock): one exact solve as ``perseus plan --exact`` runs it
(``ExactProgram.solve``: options that cannot fit removed, started from the fast frontier's
plan, relative gap 1e-10, one thread), timed, with its branch-and-bound nodes, whether it
proved optimality within ``--time-limit``, and the fast mode's energy at that deadline against
the MILP's best ("fast excess": how much the default mode loses there). Then the whole exact
sweep of the smallest size without a time limit (up to ``--sweep-limit``), which is what
``--exact`` runs: one MILP per exact frontier point, and the number of MILPs each size's sweep
would need (its fast frontier's points). Wall times vary with the machine, and so do the nodes
of a solve the time limit stops; a finished solve's nodes do not.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources

import numpy as np

from perseus.core.errors import SolverTimeout
from perseus.solver import (
    build_costs,
    build_dag,
    compute_frontier,
    default_time,
    load_profile,
    make_schedule,
)
from perseus.solver.fast import fast_frontier
from perseus.solver.planner import Planner
from perseus.solver.programs import ExactProgram
from perseus.solver.search import DEFAULT_SEARCH_WORK

P_BLOCK_W = 100.0
STAGES = 4
FACTORS = (1.0, 1.02, 1.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per MILP")
    parser.add_argument("--sweep-limit", type=float, default=600.0, help="seconds for a sweep")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    path = resources.files("perseus") / "data" / "example_profile.csv"
    with resources.as_file(path) as file:
        profile = load_profile(file)
    print(f"# exact mode, example profile ({STAGES} stages), MILP limit {args.time_limit:g} s")
    header = ("S x M", "pairs", "deadline", "MILP s", "nodes", "proven", "fast J", "MILP J",
              "fast excess %", "sweep MILPs")  # fmt: skip
    rows = []
    for microbatches in args.microbatches:
        schedule = make_schedule("1f1b", STAGES, microbatches)
        dag = build_dag(schedule)
        costs = build_costs(profile, schedule, P_BLOCK_W)
        planner = Planner(dag, costs)
        t_default = default_time(profile, schedule, dag=dag)
        times, energies, _, choices, _ = fast_frontier(
            planner, 1e-3, lambda done, total: None, t_default, DEFAULT_SEARCH_WORK
        )
        program = ExactProgram(dag, costs)
        for factor in FACTORS:
            deadline = factor * t_default
            fits = np.flatnonzero(times <= deadline * (1 + 1e-12))[-1]
            started = time.perf_counter()
            solution = program.solve(
                deadline,
                time_limit_s=args.time_limit,
                incumbent=choices[fits],
                allow_incomplete=True,
            )
            seconds = time.perf_counter() - started
            _, (energy,) = planner.evaluate(solution.choice[:, None])
            rows.append((
                f"{STAGES} x {microbatches}", str(int((planner.last + 1).sum())), f"{factor:g} x",
                f"{seconds:.2f}", str(solution.nodes), "yes" if solution.optimal else "no",
                f"{energies[fits]:.3f}", f"{energy:.3f}",
                f"{100 * (energies[fits] / energy - 1):.4f}", str(len(times)),
            ))  # fmt: skip
            print("solved:", "  ".join(rows[-1]), file=sys.stderr, flush=True)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print()
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))

    smallest = min(args.microbatches)
    started = time.perf_counter()
    try:
        frontier = compute_frontier(
            profile,
            make_schedule("1f1b", STAGES, smallest),
            p_block_w=P_BLOCK_W,
            exact=True,
            exact_time_limit_s=args.sweep_limit,
        )
        outcome = f"{len(frontier.times_s)} points, max gap {100 * frontier.gaps.max():.2e} %"
    except SolverTimeout as err:
        outcome = f"refused: {err}"
    print(
        f"\nwhole exact sweep, {STAGES} x {smallest}: {time.perf_counter() - started:.1f} s, "
        f"{outcome}"
    )


if __name__ == "__main__":
    main()
