"""Wire models the planner shows (perseus.wire.views): frontier points and baselines
rendered from the solver's own values."""

from __future__ import annotations

from perseus.core.baselines import baseline_label
from perseus.solver import compute_frontier, make_schedule, profile_from_rows
from perseus.wire.views import Baseline, FrontierPoint, TimelineInstruction

ROWS = [(g, kind, f, t * (2 if kind == "backward" else 1), e)
        for g in range(2) for kind in ("forward", "backward")
        for f, t, e in ((1980, 0.05, 12.0), (1500, 0.07, 10.0))]  # fmt: skip


def test_points_and_baselines_render_from_the_solvers() -> None:
    frontier = compute_frontier(
        profile_from_rows(ROWS), make_schedule("1f1b", 2, 3), p_block_w=20.0
    )
    for index in range(len(frontier)):
        point = frontier.point(index)
        assert FrontierPoint.from_point(point).model_dump() == {
            "time_s": point.time_s, "energy_j": point.energy_j, "gap": point.gap}  # fmt: skip
    for key, baseline in frontier.baselines.items():
        assert Baseline.from_baseline(baseline, baseline_label(key)).model_dump() == {
            "time_s": baseline.time_s, "energy_j": baseline.energy_j,
            "label": baseline_label(key)}  # fmt: skip
        assert Baseline.from_baseline(baseline).label is None


def test_a_timeline_instruction_is_a_plan_instruction_with_its_times() -> None:
    wire = {"instruction": "forward", "microbatch": 0, "frequency_mhz": 1980,
            "start_s": 0.0, "finish_s": 0.05, "critical": True}  # fmt: skip
    parsed = TimelineInstruction.model_validate(wire)
    assert parsed.model_dump(exclude_none=True) == wire
