"""The default online sweep (coarse then fine) against every clock: clocks measured, plans lost.

    python benchmarks/sweep_reduction.py            # every profile below (about a minute)
    python benchmarks/sweep_reduction.py --quick    # the shipped profile only

For each profile, each stage's sweep is simulated on the profile's own values: the sweep of
``PERSEUS_PROFILE_CLOCKS=auto`` (:class:`perseus.client.profiling.sweep_order.SweepOrder`, the
rank's code) is fed the energy of a microbatch (forward + backward) at each clock it asks for,
and decides from those energies where to stop and where to measure finer, as it does on a
GPU. The profile restricted to the clocks each stage measured ("auto") and the whole profile
("all") are planned with the solver's defaults (``compute_frontier``), and the energies of
the best plans within 1, 1.01 and 1.05 times the all-fastest plan's time are compared ("gap
%": auto over all, minus one; "-" where auto has no plan that fast). "clocks" is the stages'
clocks in the profile, "auto" the clocks the sweep measured (fewest-most over the stages),
"stride 1" what the sweep of ``all`` measures (every clock from the top until energy rose at
five clocks in a row).

Profiles: the shipped example (``perseus/data/example_profile.csv``, 66 H200-like clocks down
to 1005 MHz); ``perseus.solver.synthetic``'s model on the H200's 110 clocks (1980-345 MHz);
the fake GPU's model (``perseus.client.gpu.fake_model``, 110 clocks, its power limit, no
noise, planned with its idle power); and the shared measured profiles
(``../shared/data/profiles``, skipped where absent). Nothing is random.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perseus.client.gpu.fake_model import FakeGpuModel, default_work
from perseus.client.profiling.sweep_order import STRIDE, SweepOrder
from perseus.client.settings import ProfileBudget
from perseus.solver import Profile, compute_frontier, load_profile, make_schedule
from perseus.solver.profiles import profile_from_rows
from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, example_profile, synthetic_profile

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data" / "profiles"
FACTORS = (1.0, 1.01, 1.05)
H200_CLOCKS_MHZ = tuple(range(1980, 344, -15))  # 110 clocks
RISING_STOP = ProfileBudget().rising_stop


@dataclass(frozen=True)
class Case:
    label: str
    load: Callable[[], Profile]
    p_block_w: float
    schedules: tuple[tuple[str, int, int], ...]  # (schedule, microbatches, chunks)


def fake_profile() -> Profile:
    """The fake GPU's model on 4 stages and its 110 clocks, at the clock each work really runs
    (a lock above its power limit's clock runs at that clock, as the fake does)."""
    model = FakeGpuModel()
    rows = []
    for stage in range(4):
        for kind, work in default_work(stage, 4).items():
            for f in model.clocks_mhz:
                ran = model.running_clock_mhz(work, f)
                rows.append((stage, kind, f, model.time_s(work, ran), model.energy_j(work, ran)))
    return profile_from_rows(rows, source="fake model", p_block_w=model.idle_power_w)


def cases(quick: bool) -> list[Case]:
    both = (("1f1b", 8, 1), ("zbv", 8, 2))
    found = [Case("example", example_profile, EXAMPLE_P_BLOCK_W, both)]
    if quick:
        return found
    found += [
        Case(
            "synthetic-h200",
            lambda: profile_from_rows(synthetic_profile(clocks_mhz=H200_CLOCKS_MHZ)),
            EXAMPLE_P_BLOCK_W,
            both,
        ),
        Case("fake-h200", fake_profile, FakeGpuModel().idle_power_w, both),
    ]
    for name, power in (
        ("bloom+a100_sxm_bf16.csv", 83.64),
        ("bloom+a40_bf16.csv", 70.38),
        ("gpt3-175b+a40_bf16.csv", 70.38),
    ):
        path = SHARED / name
        if path.is_file():
            label = name.removesuffix(".csv").replace("_sxm_bf16", "").replace("_bf16", "")
            found.append(Case(label, lambda p=path: load_profile(p), power, (("1f1b", 16, 1),)))
    return found


def swept_clocks(profile: Profile, stage: int, stride: int) -> tuple[int, ...]:
    """The clocks a sweep of ``stride`` measures on ``stage``, fed the profile's energies."""
    kinds = profile.stages[stage]
    microbatch = {
        f.frequency_mhz: (f.energy_j + b.energy_j, (f.time_s, b.time_s))
        for f in kinds["forward"]
        for b in kinds["backward"]
        if b.frequency_mhz == f.frequency_mhz
    }
    order = SweepOrder(sorted(microbatch, reverse=True), rising_stop=RISING_STOP, stride=stride)
    while (clock := order.next_clock()) is not None:
        order.record(clock, *microbatch[clock])
    return tuple(sorted(order.measured, reverse=True))


def restricted(profile: Profile, clocks: list[tuple[int, ...]]) -> Profile:
    """``profile`` with each stage's rows at its ``clocks`` only."""
    rows = [
        (stage, kind, o.frequency_mhz, o.time_s, o.energy_j)
        for stage, per_kind in enumerate(profile.stages)
        for kind, options in per_kind.items()
        for o in options
        if o.frequency_mhz in clocks[stage]
    ]
    return profile_from_rows(rows, source=f"{profile.source} (swept)", p_block_w=profile.p_block_w)


def best_within(times: list[float], energies: list[float], deadline_s: float) -> float | None:
    fits = [e for t, e in zip(times, energies, strict=True) if t <= deadline_s * (1 + 1e-12)]
    return min(fits) if fits else None


def run_case(case: Case) -> list[list[str]]:
    profile = case.load()
    stages = profile.num_stages
    auto = [swept_clocks(profile, g, STRIDE) for g in range(stages)]
    full = [swept_clocks(profile, g, 1) for g in range(stages)]
    counts = [len({o.frequency_mhz for o in profile.stages[g]["forward"]}) for g in range(stages)]
    reduced = restricted(profile, auto)
    rows = []
    for name, microbatches, chunks in case.schedules:
        schedule = make_schedule(name, stages, microbatches, chunks)
        started = time.perf_counter()
        every = compute_frontier(profile, schedule, p_block_w=case.p_block_w)
        some = compute_frontier(reduced, schedule, p_block_w=case.p_block_w)
        seconds = time.perf_counter() - started
        fastest = every.baselines["all_fastest"].time_s
        gaps = []
        for factor in FACTORS:
            deadline = factor * fastest
            e_all = best_within(every.times_s.tolist(), every.energies_j.tolist(), deadline)
            e_auto = best_within(some.times_s.tolist(), some.energies_j.tolist(), deadline)
            gaps.append(
                "-" if e_all is None or e_auto is None else f"{100 * (e_auto / e_all - 1):+.3f}"
            )
        rows.append(
            [
                case.label,
                f"{name} {stages}x{microbatches}",
                _span(counts),
                _span([len(c) for c in full]),
                _span([len(c) for c in auto]),
                *gaps,
                f"{seconds:.1f}",
            ]
        )
    return rows


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the shipped profile only")
    args = parser.parse_args()
    header = ["profile", "schedule", "clocks", "stride 1", "auto"]
    header += [f"gap {f:g}x %" for f in FACTORS] + ["plan s"]
    rows = [row for case in cases(args.quick) for row in run_case(case)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                c.rjust(w) if i > 1 else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


if __name__ == "__main__":
    main()
