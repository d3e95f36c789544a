"""The real profiles of ../shared/data/profiles (skipped when absent): load, 8 x 12 frontier."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from perseus.solver import (
    INSTRUCTIONS,
    Frontier,
    Option,
    Policy,
    baselines_at,
    build_dag,
    choose_point,
    compute_frontier,
    default_time,
    load_profile,
    make_schedule,
)

from . import reference as ref
from .cases import RTOL, SHARED_PROFILES, rel

STAGES, MICROBATCHES = 8, 12
SAMPLE = 20


def spread(n: int, k: int = SAMPLE) -> list[int]:
    """k indices spread across range(n) plus both ends."""
    return sorted({0, n - 1, *(round(i * (n - 1) / (k + 1)) for i in range(1, k + 1))})


@lru_cache(maxsize=4)
def frontier_1f1b(path: Path, p_block: float):
    schedule = make_schedule("1f1b", STAGES, MICROBATCHES)
    return compute_frontier(load_profile(path), schedule, p_block_w=p_block)


def test_real_profile_loads(real_profile: tuple[Path, float]) -> None:
    path, _p_block = real_profile
    profile = load_profile(path)
    table = ref.read_csv_table(path)
    assert profile.num_stages == STAGES
    assert path.name in profile.source
    for stage in range(STAGES):
        for kind in INSTRUCTIONS:
            expected = [Option(f, t, e) for f, t, e in ref.options_of(table, stage, kind)]
            assert list(profile.stages[stage][kind]) == expected


def check_real_frontier(path: Path, p_block: float, name: str, microbatches: int,
                        chunks: int = 1) -> None:  # fmt: skip
    profile = load_profile(path)
    table = ref.read_csv_table(path)
    schedule = make_schedule(name, STAGES, microbatches, chunks)
    if (name, microbatches) == ("1f1b", MICROBATCHES):
        frontier = frontier_1f1b(path, p_block)
    else:
        frontier = compute_frontier(profile, schedule, p_block_w=p_block)
    order = ref.reference_order(name, STAGES, microbatches, chunks)
    assert ref.as_tuples(schedule.order) == order
    dag = ref.build_dag(order, chunks)
    times, energies = frontier.times_s, frontier.energies_j
    assert len(frontier) >= 2
    assert (np.diff(times) > 0).all() and (np.diff(energies) < 0).all()
    assert (frontier.gaps >= -1e-9).all()
    t_min = ref.all_fastest_time(table, dag)
    assert rel(float(times[0]), t_min) <= RTOL, (times[0], t_min)
    for i in spread(len(frontier)):
        point = frontier.point(i)
        t, e = ref.replay(table, dag, p_block, point.frequencies_mhz)
        assert rel(point.time_s, t) <= RTOL and rel(point.energy_j, e) <= RTOL, (i, point, t, e)
    # baselines are truthful; per-instruction planning saves energy at no slowdown
    for key, baseline in frontier.baselines.items():
        t, e = ref.replay(table, dag, p_block, baseline.frequencies_mhz)
        assert rel(baseline.time_s, t) <= RTOL and rel(baseline.energy_j, e) <= RTOL, key
    fastest = frontier.baselines["all_fastest"]
    assert rel(fastest.time_s, t_min) <= RTOL
    saving = 1 - float(energies[0]) / fastest.energy_j
    assert saving > 0, saving
    for key in ("global_clock", "per_stage_clock"):
        assert energies[0] <= frontier.baselines[key].energy_j * (1 + 0.005), key


def test_real_frontier_8x12_1f1b(real_profile: tuple[Path, float]) -> None:
    path, p_block = real_profile
    check_real_frontier(path, p_block, "1f1b", MICROBATCHES)


@pytest.mark.parametrize(("name", "microbatches", "chunks"),
                         [("gpipe", 12, 1), ("interleaved-1f1b", 16, 2)])  # fmt: skip
def test_real_frontier_other_schedules(name: str, microbatches: int, chunks: int) -> None:
    from .conftest import REAL_PROFILES, SHARED_PROFILES

    path = SHARED_PROFILES / "bloom+a100_sxm_bf16.csv"
    if not path.is_file():
        pytest.skip(f"shared profile {path} not present")
    check_real_frontier(path, REAL_PROFILES[path.name], name, microbatches, chunks)


def test_real_global_clock_meets_no_slowdown_when_some_clock_does(
    real_profile: tuple[Path, float],
) -> None:
    """The best single clock at the no-slowdown time, by trying every clock."""
    path, p_block = real_profile
    table = ref.read_csv_table(path)
    frontier = frontier_1f1b(path, p_block)
    order = ref.reference_order("1f1b", STAGES, MICROBATCHES)
    dag = ref.build_dag(order, 1)
    deadline = frontier.baselines["default"].time_s
    best = None
    for f in sorted({f for (_s, _k, f) in table}):
        t, e = ref.replay(table, dag, p_block, [[f] * len(seq) for seq in order])
        if t <= deadline * (1 + RTOL) and (best is None or e < best):
            best = e
    glob = frontier.baselines["global_clock"]
    if best is None:
        pytest.skip("no single clock reaches the all-fastest time on this profile")
    assert glob.time_s <= deadline * (1 + RTOL)
    assert rel(glob.energy_j, best) <= RTOL


def test_polish_never_worsens_the_no_slowdown_point(real_profile: tuple[Path, float]) -> None:
    """The branch and bound starts from the rounded plan: at worst it returns it unchanged."""
    path, p_block = real_profile
    profile = load_profile(path)
    table = ref.read_csv_table(path)
    base = frontier_1f1b(path, p_block)
    schedule = make_schedule("1f1b", STAGES, MICROBATCHES)
    polished = compute_frontier(profile, schedule, p_block_w=p_block, polish_s=3.0)
    assert polished.times_s[0] == base.times_s[0]
    chosen = choose_point(polished, Policy("no-slowdown"))
    before = choose_point(base, Policy("no-slowdown"))
    assert polished.energies_j[chosen] <= base.energies_j[before] * (1 + 1e-12)
    assert (np.diff(polished.times_s) > 0).all() and (np.diff(polished.energies_j) < 0).all()
    dag = ref.build_dag(ref.reference_order("1f1b", STAGES, MICROBATCHES, 1), 1)
    point = polished.point(chosen)
    t, e = ref.replay(table, dag, p_block, point.frequencies_mhz)
    assert rel(point.time_s, t) <= RTOL and rel(point.energy_j, e) <= RTOL


def test_real_per_stage_clock_no_single_stage_change_improves(
    real_profile: tuple[Path, float],
) -> None:
    """The per-stage baseline on 8 real stages (some 60^8 combinations, far beyond exhaustive
    search): no single-stage clock change that meets the deadline lowers its energy."""
    path, p_block = real_profile
    table = ref.read_csv_table(path)
    microbatches = 4
    order = ref.reference_order("1f1b", STAGES, microbatches)
    dag = ref.build_dag(order, 1)
    profile, schedule = load_profile(path), make_schedule("1f1b", STAGES, microbatches)
    for slack in (1.0, 1.03):
        deadline = default_time(profile, schedule) * slack
        stage = baselines_at(profile, schedule, p_block, deadline)["per_stage_clock"]
        current = [row[0] for row in stage.frequencies_mhz]
        assert all(len(set(row)) == 1 for row in stage.frequencies_mhz)
        clocks = sorted({f for (_s, _k, f) in table})
        for g in range(STAGES):
            for f in clocks:
                if (g, "forward", f) not in table or (g, "backward", f) not in table:
                    continue
                trial = [*current[:g], f, *current[g + 1 :]]
                plan = [[trial[s]] * len(seq) for s, seq in enumerate(order)]
                t, e = ref.replay(table, dag, p_block, plan)
                if t <= deadline * (1 + RTOL):
                    assert e >= stage.energy_j * (1 - RTOL), ("a better clock", slack, g, f)


MILP_REFERENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "milp_reference.json"


def test_real_frontier_near_the_milp_at_the_deadlines_users_pick(
    real_profile: tuple[Path, float],
) -> None:
    """8 x 12: at no slowdown (the default plan's time) and 1.01, 1.02, 1.05 x it, the best
    point that fits is within 0.3 % of the energy of the best plan a 300 s MILP found there
    (benchmarks/data/milp_reference.json), and its reported gap bounds it from below."""
    import json

    path, p_block = real_profile
    table = ref.read_csv_table(path)
    order = ref.reference_order("1f1b", STAGES, MICROBATCHES)
    dag = ref.build_dag(order, 1)
    top = [[max(f for (s, k, f) in table if s == g and k == kind) for kind, _mb, _c in seq]
           for g, seq in enumerate(order)]  # fmt: skip
    t_default, _e = ref.replay(table, dag, p_block, top)
    frontier = frontier_1f1b(path, p_block)
    rows = json.loads(MILP_REFERENCE.read_text())
    for row in rows:
        if row["profile"] != path.name or row["microbatches"] != MICROBATCHES:
            continue
        if row.get("schedule", "1f1b") != "1f1b":  # zero-bubble rows: their own test
            continue
        deadline = row["factor"] * t_default
        assert rel(deadline, row["deadline_s"]) <= 1e-9
        fits = [i for i in range(len(frontier)) if frontier.times_s[i] <= deadline * (1 + RTOL)]
        energy = float(frontier.energies_j[fits[-1]])
        assert energy <= row["best_j"] * 1.003, (row["factor"], energy, row["best_j"])
        bound = energy / (1 + float(frontier.gaps[fits[-1]]))
        assert bound <= row["best_j"] * (1 + RTOL)


def _shared_frontier(
    name: str, microbatches: int, schedule_name: str = "1f1b"
) -> tuple[Frontier, float]:
    """The default-mode frontier of shared profile ``name``, 8 x ``microbatches`` (1F1B unless
    said), and the default plan's time (skips without the shared profile)."""
    from .conftest import REAL_PROFILES

    path = SHARED_PROFILES / name
    if not path.is_file():
        pytest.skip(f"real profile {path} not present; set PERSEUS_TEST_PROFILES")
    profile = load_profile(path)
    schedule = make_schedule(schedule_name, STAGES, microbatches)
    frontier = compute_frontier(profile, schedule, p_block_w=REAL_PROFILES[name])
    return frontier, default_time(profile, schedule)


def test_real_frontier_has_no_holes_where_the_profile_is_not_convex() -> None:
    """bloom on the A40 at 48 microbatches: its forwards are fastest at 1575 MHz and the next
    clock on their convex hull is near 1050 MHz, so the frontier between those is made of
    plans that run some forwards at each. Rounding the relaxation missed them: the frontier
    had a step of 1.86 % of the default time and reported gaps near 5 %; now every reported
    gap is under 1 %."""
    frontier, t_default = _shared_frontier("bloom+a40_bf16.csv", 48)
    assert float(np.diff(frontier.times_s).max()) <= 0.01 * t_default
    assert float(frontier.gaps.max()) <= 0.01, float(frontier.gaps.max())


def test_real_frontier_near_the_milp_where_the_profile_is_not_convex() -> None:
    """bloom on the A40 at 24 microbatches, 1.02 x the default time: the best plans run some
    forwards at 1575 MHz and others near 1050 MHz. A local search over plans after the refill
    stopped at 12.16 % (0.4 % of energy above the 300 s MILP's 12.53 %): a refilled plan holds
    its slack in off-hull clocks that no single move gives back. Searching the hull plans
    before the refill gets within 0.3 % at every deadline users pick, and with moves that
    skip a hull option every reported gap is under 1 % (1.08 % without them)."""
    import json

    frontier, t_default = _shared_frontier("bloom+a40_bf16.csv", 24)
    rows = [row for row in json.loads(MILP_REFERENCE.read_text())
            if row["profile"] == "bloom+a40_bf16.csv" and row["microbatches"] == 24
            and row.get("schedule", "1f1b") == "1f1b"]  # fmt: skip
    assert len(rows) == 4
    for row in rows:
        fits = np.flatnonzero(frontier.times_s <= row["factor"] * t_default * (1 + RTOL))
        energy = float(frontier.energies_j[fits[-1]])
        assert energy <= row["best_j"] * 1.003, (row["factor"], energy, row["best_j"])
    assert float(frontier.gaps.max()) <= 0.01, float(frontier.gaps.max())


def test_real_large_frontier_repairs_a_stretch_of_large_gaps() -> None:
    """bloom on the A40 at 96 microbatches (1536 instructions, where only five deadlines
    are searched): points near 1.08 x the default time came from refilling and
    crossing plans searched elsewhere, and 42 of them reported gaps of 1.0-1.08 %. Searching
    once at the worst point's own deadline lifted that point only (its neighbours below it
    stayed over 1 %); searching at the first point of the stretch gives one plan that,
    refilled, serves the whole stretch, and every reported gap is then under 1 %."""
    frontier, t_default = _shared_frontier("bloom+a40_bf16.csv", 96)
    assert float(np.diff(frontier.times_s).max()) <= 0.01 * t_default
    assert float(frontier.gaps.max()) <= 0.01, float(frontier.gaps.max())


def test_real_no_slowdown_within_005_points_of_the_old_30s_polish() -> None:
    """gpt3-175b on the A40, 8 x 12: the old default, a 30 s branch and bound over hull clocks
    after the search, saved 12.39-12.40 % against the default plan at no slowdown; one search
    stopped at 12.30 %. Two more searches from relaxations with scaled slopes (other vertices,
    other local optima) reach 12.36 %, within the 0.05 points the issue allows."""
    from .conftest import REAL_PROFILES

    path = SHARED_PROFILES / "gpt3-175b+a40_bf16.csv"
    if not path.is_file():
        pytest.skip(f"shared profile {path} not present")
    frontier = frontier_1f1b(path, REAL_PROFILES[path.name])
    default = frontier.baselines["default"]
    fits = np.flatnonzero(frontier.times_s <= default.time_s * (1 + RTOL))
    saving = 1 - float(frontier.energies_j[fits[-1]]) / default.energy_j
    assert saving >= 0.1234, saving


def test_real_frontier_just_below_a_searched_deadline() -> None:
    """gpt3-175b on the A40, 8 x 16: just below each searched deadline the frontier held the
    plan searched below it, stretched, and gaps grew to 1.20 % on the way up. The plan
    searched above, shrunk onto those deadlines by the refill, does better: every reported
    gap is under 1 %."""
    frontier, _ = _shared_frontier("gpt3-175b+a40_bf16.csv", 16)
    assert float(frontier.gaps.max()) <= 0.01, float(frontier.gaps.max())


def test_real_large_frontier_searches_inside_its_widest_stretch() -> None:
    """gpt3-175b on the A40 at 96 microbatches searches at 1, 1.01, 1.02, 1.03 and 1.05 x the
    default time. Without 1.03 x, the points from 1.02 to 1.035 x (refilled, crossed and shrunk
    from the plans at 1.02 and 1.05 x) reported gaps up to 1.37 %; with it the largest was
    1.08 %, the plans between the searched deadlines being what was loose, not the bound.
    There each search stops for want of work (one round of single moves costs more than its
    share), so where a gap over 1 % lies among the anchors every anchor searches again from the
    plan its search stopped at: the largest gap is then 0.98 %."""
    frontier, _ = _shared_frontier("gpt3-175b+a40_bf16.csv", 96)
    assert float(frontier.gaps.max()) <= 0.01, float(frontier.gaps.max())


def test_real_small_frontier_repairs_again_while_a_gap_is_over_1_percent() -> None:
    """gpt3-175b on the A40, GPipe 8 x 12: after the repair round one point (1.0087 x the
    default time) still reported 1.02 %; a second round, for small DAGs with a gap still over
    1 % only, takes every gap under it."""
    frontier, _ = _shared_frontier("gpt3-175b+a40_bf16.csv", 12, "gpipe")
    assert float(frontier.gaps.max()) <= 0.01, float(frontier.gaps.max())


@pytest.mark.parametrize(
    ("file_name", "size", "largest"),
    [
        ("gpt3-175b+a40_bf16.csv", (STAGES, MICROBATCHES, 1), 0.0115),
        # the all-fastest plan, restated 0.15 ms faster than the next point, served those
        # 0.15 ms at 10.5 % over the bound until plans between the points were tried
        ("bloom+a40_bf16.csv", (8, 32, 2), 0.0135),
    ],
    ids=["gpt3-a40-8x12", "bloom-a40-8x32v2"],
)
def test_real_gaps_at_the_default_margin_stay_within_the_margin_models_bound(
    file_name: str, size: tuple[int, int, int], largest: float
) -> None:
    """At the default 5 ms clock-change margin. A point's gap is its energy with transitions
    over the relaxation's bound, which cannot price transitions (they hang on the order of
    clocks along each GPU, which a relaxation over each instruction's clock alone does not
    see). So the gap the margin model allows is the search's own (the same plan without
    transitions: at most 1 %) plus the transitions' energy over the bound (at most 1 %; 0.36
    and 0.66 % here, 0.87 % on every artifact case measured). Every point must hold both, and
    its times and energies must replay with transitions; the largest gap is what was measured
    (1.13 and 1.30 %), within 0.05 points."""
    from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S
    from perseus.solver.transitions import clock_tables, evaluate_plans

    from .conftest import REAL_PROFILES

    path = SHARED_PROFILES / file_name
    if not path.is_file():
        pytest.skip(f"shared profile {path} not present")
    profile, p_block_w = load_profile(path), REAL_PROFILES[path.name]
    stages, microbatches, chunks = size
    schedule = make_schedule(
        "interleaved-1f1b" if chunks > 1 else "1f1b", stages, microbatches, chunks
    )
    frontier = compute_frontier(profile, schedule, p_block_w=p_block_w,
                                clock_change_margin_s=CLOCK_CHANGE_MARGIN_S)  # fmt: skip
    bound = frontier.energies_j / (1.0 + frontier.gaps)
    plans = np.asarray(frontier.frequencies_mhz).T.astype(np.int64)
    tables, dag = clock_tables(profile, schedule), build_dag(schedule)
    times, energies = evaluate_plans(tables, dag, p_block_w, plans, CLOCK_CHANGE_MARGIN_S)
    np.testing.assert_allclose(times, frontier.times_s, rtol=1e-9)
    np.testing.assert_allclose(energies, frontier.energies_j, rtol=1e-9)
    _, without = evaluate_plans(tables, dag, p_block_w, plans, 0.0)
    search_gap = without / bound - 1.0
    share = (frontier.energies_j - without) / bound
    assert float(search_gap.max()) <= 0.01, float(search_gap.max())
    assert float(share.min()) >= -1e-12 and float(share.max()) <= 0.01, float(share.max())
    assert np.all(frontier.gaps <= search_gap + share + 1e-9)
    assert float(frontier.gaps.max()) <= largest, float(frontier.gaps.max())
