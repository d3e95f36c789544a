"""Frontier quality at the deadlines users pick, against a 300 s MILP's best plan and bound.

    python benchmarks/quality.py [--microbatches 12 24 48 96] [--profiles ...] [--schedules ...]

For every shared profile (../shared/data/profiles), microbatch count and schedule (8-stage 1F1B;
the zero-bubble ``zbv`` and ``interleaved-zb`` on the same 8 GPUs with 2 chunks each), the
frontier in default mode (``compute_frontier`` with default settings, as ``perseus plan``
runs it). Savings are against the default plan: every instruction at the profile's highest
clock, what a GPU left alone runs. At the no-slowdown deadline (the default plan's iteration
time ``T0``) and at 1.01, 1.02 and 1.05 x ``T0``: the saving of the best frontier point that
fits, next to the saving of the best plan a single-threaded 300 s HiGHS MILP found at that
deadline ("MILP") and the most its proven bound allows ("bound"), from
``benchmarks/data/milp_reference.json`` (made by ``benchmarks/milp_reference_job.py``; "-"
where absent). Then the minimum-energy point's saving, the largest gap the frontier reports
at the deadlines where the fast mode searches ("anchor gap": the default plan's time x 1,
1.005, ..., 1.1 on DAGs up to 1024 instructions, x 1, 1.01, 1.02, 1.03, 1.05 on larger ones) and
over all its points ("max gap": each point's energy against a proven lower bound over the
deadlines it serves), the largest time step between neighbouring points, and the wall time
of ``compute_frontier``. Everything but the wall time is deterministic.

The shared profiles measure the backward whole; for the zero-bubble rows each stage's backward
is split the way the example profile's is (``perseus.solver.synthetic.INPUT_SHARE``):
``backward_input`` takes 55 % of its time and energy at every clock, ``backward_weight`` the
rest. The MILP reference has the zero-bubble schedules where ``milp_reference_job.py
--schedules`` was run for them ("-" elsewhere).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from perseus.solver import compute_frontier, load_profile, make_schedule, replay
from perseus.solver.frontier import anchor_slowdowns
from perseus.solver.synthetic import split_backward

PROFILES = {
    "bloom+a100_sxm_bf16.csv": 83.64,
    "bloom+a40_bf16.csv": 70.38,
    "gpt3-175b+a40_bf16.csv": 70.38,
}
FACTORS = (1.0, 1.01, 1.02, 1.05)
HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data" / "profiles"
REFERENCE = HERE / "data" / "milp_reference.json"


def _reference() -> dict[tuple[str, str, int, float], dict[str, Any]]:
    if not REFERENCE.is_file():
        return {}
    rows = json.loads(REFERENCE.read_text())
    return {
        (r["profile"], r.get("schedule", "1f1b"), r["microbatches"], r["factor"]): r for r in rows
    }


def _case(
    name: str, microbatches: int, extra: dict[str, Any], schedule_name: str = "1f1b"
) -> tuple[list[str], float]:
    power = PROFILES[name]
    profile = load_profile(SHARED / name)
    chunks = 1
    if schedule_name != "1f1b":
        profile, chunks = split_backward(profile), 2
    schedule = make_schedule(schedule_name, profile.num_stages, microbatches, chunks)
    top = [
        [max(o.frequency_mhz for o in profile.stages[g][inst.kind]) for inst in seq]
        for g, seq in enumerate(schedule.order)
    ]
    default = replay(profile, schedule, power, top)
    started = time.perf_counter()
    frontier = compute_frontier(profile, schedule, p_block_w=power, **extra)
    seconds = time.perf_counter() - started
    reference = _reference()

    def saving(energy_j: float | None) -> str:
        return "-" if energy_j is None else f"{100 * (1 - energy_j / default.energy_j):.2f}"

    cells = [name.removesuffix(".csv").replace("_sxm_bf16", "").replace("_bf16", ""),
             schedule_name, str(microbatches)]  # fmt: skip
    worst = 0.0
    for factor in FACTORS:
        deadline = factor * default.time_s
        fits = [i for i in range(len(frontier)) if frontier.times_s[i] <= deadline * (1 + 1e-12)]
        ours = float(frontier.energies_j[fits[-1]]) if fits else None
        ref = reference.get((name, schedule_name, microbatches, factor))
        best = ref.get("best_j") if ref else None
        bound = ref.get("bound_j") if ref else None
        cells += [saving(ours), saving(best), saving(bound)]
        if ours is not None and best is not None:
            worst = max(worst, ours / best - 1)
    times = frontier.times_s
    step = float((times[1:] - times[:-1]).max()) if len(frontier) > 1 else 0.0
    at_anchors = [
        float(frontier.gaps[np.flatnonzero(times <= f * default.time_s * (1 + 1e-12))[-1]])
        for f in anchor_slowdowns(sum(len(seq) for seq in schedule.order))
        if times[0] <= f * default.time_s * (1 + 1e-12)
    ]
    cells += [
        saving(float(frontier.energies_j[-1])),
        f"{100 * max(at_anchors, default=0.0):.2f}",
        f"{100 * float(frontier.gaps.max()):.2f}",
        f"{100 * step / default.time_s:.2f}",
        f"{seconds:.2f}",
    ]
    return cells, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[12, 24, 48, 96])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument(
        "--schedules",
        nargs="+",
        default=["1f1b", "zbv", "interleaved-zb"],
        choices=["1f1b", "zbv", "interleaved-zb"],
    )
    parser.add_argument(
        "--polish-s", type=float, help="pass polish_s to compute_frontier (older versions)"
    )
    args = parser.parse_args()
    extra: dict[str, Any] = {} if args.polish_s is None else {"polish_s": args.polish_s}
    header = ["profile", "schedule", "M"]
    for label in ("no-slowdown", "1.01x", "1.02x", "1.05x"):
        header += [f"{label} %", "MILP %", "bound %"]
    header += ["min-E %", "anchor gap %", "max gap %", "max step %", "s"]
    rows = []
    worst = 0.0
    for name in args.profiles:
        for schedule_name in args.schedules:
            for microbatches in args.microbatches:
                cells, case_worst = _case(name, microbatches, extra, schedule_name)
                rows.append(cells)
                worst = max(worst, case_worst)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("# savings against the default plan (every instruction at the highest clock)")
    for row in [header, ["-" * w for w in widths], *rows]:
        cells = zip(row, widths, strict=True)
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(cells)))
    print(f"largest excess energy over the MILP's best at those deadlines: {100 * worst:.3f} %")


if __name__ == "__main__":
    main()
