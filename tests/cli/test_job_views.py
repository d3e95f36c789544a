"""``perseus job``'s views: the job, the job list, the frontier (and its straggler rows against
``perseus plan --straggler``'s), the savings, the answers to a change, and policies between the
command line's form and the wire's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from perseus.cli import main
from perseus.cli.job_views import (
    duration_text,
    format_frontier,
    format_job,
    format_job_list,
    format_savings,
    policy_spec,
    policy_text,
    printable,
    validation_text,
)
from perseus.core.errors import PolicyError
from perseus.formats.plan_files import frontier_from_json
from perseus.schemas import (
    Baseline,
    FrontierPoint,
    FrontierView,
    JobCreate,
    JobSummary,
    JobView,
    SavingsView,
    StragglerView,
)
from perseus.server.lifecycle.decisions import choose, expected
from perseus.solver import Policy

# ----------------------------------------------------------------------------- text and policies


@given(st.text())
def test_printable_text_prints_as_one_line_of_its_own(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable()
    assert "\n" not in shown and "\r" not in shown and "\x1b" not in shown
    if text.isprintable():
        assert shown == text


def test_control_characters_are_shown_as_python_writes_them() -> None:
    assert printable("a\x1b[2Jb\nc\td") == "a\\x1b[2Jb\\nc\\td"


@pytest.mark.parametrize(
    "text", ["no-slowdown", "min-energy", "max-slowdown:1.05", "deadline:2.5", "zeus-cost:0.5"]
)
def test_policies_go_to_the_wire_and_back_as_written(text: str) -> None:
    spec = policy_spec(Policy.parse(text))
    assert spec.kind == text.partition(":")[0]
    assert policy_text(spec) == text


def test_a_policy_out_of_the_servers_range_names_its_field() -> None:
    # the solver takes any slowdown >= 1; the server at most 100
    with pytest.raises(
        PolicyError, match=r"policy max-slowdown:1000\.0: max-slowdown\.factor: .*100"
    ):
        policy_spec(Policy.parse("max-slowdown:1000"))


def test_validation_text_names_each_field_in_one_line() -> None:
    with pytest.raises(ValidationError) as caught:
        JobCreate.model_validate(
            {"schedule": "1f1b", "stages": 0, "microbatches": 4, "data_parallel": 1}
        )
    text = validation_text(caught.value)
    assert "\n" not in text
    parts = dict(part.split(": ", 1) for part in text.split("; "))
    assert set(parts) == {"stages", "tensor_parallel"}
    assert "greater than or equal to 1" in parts["stages"]


# ----------------------------------------------------------------------------- a job's view

SPEC = {
    "name": "llama",
    "schedule": "interleaved-1f1b",
    "stages": 4,
    "microbatches": 8,
    "virtual_stages": 2,
    "data_parallel": 2,
    "tensor_parallel": 1,
}
CHOSEN = {
    "index": 3,
    "time_s": 1.25,
    "energy_j": 800.0,
    "gap": 0.0,
    "expected_iteration_time_s": 1.5,
    "expected_energy_j": 900.0,
}
STATS = {
    "iterations": 10,
    "ranks": 8,
    "samples": 80,
    "time_s": 1.2,
    "time_p10_s": 1.1,
    "time_p90_s": 1.3,
    "energy_j": 1000.0,
    "energy_p10_j": 950.0,
    "energy_p90_j": 1050.0,
}
SAVINGS = {
    "baseline": STATS,
    "plan": None,
    "plan_version": 2,
    "realized_slowdown": None,
    "realized_saving": None,
    "predicted_slowdown": 0.01,
    "predicted_saving": -0.125,
    "energy_j": 12345.0,
    "energy_saved_j": 0.0,
    "energy_saved_kwh": 0.0,
    "warning": None,
}


def job_view(**fields: Any) -> JobView:
    data: dict[str, Any] = {
        "job_id": "a" * 32,
        "name": "llama",
        "state": "ready",
        "reason": None,
        "spec": SPEC,
        "policy": {"kind": "max-slowdown", "factor": 1.1},
        "straggler": None,
        "version": 2,
        "counts": {
            "ranks_expected": 8,
            "ranks_registered": 8,
            "profiles_reported": 8,
            "stages_profiled": 4,
            "iterations_reported": 0,
        },
        "frontier_points": 40,
        "planning_s": 1.5,
        "chosen": None,
        "telemetry": None,
    }
    data.update(fields)
    return JobView.model_validate(data)


def lines_of(text: str) -> dict[str, str]:
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in text.splitlines() if line)


def test_a_job_is_aligned_label_value_lines() -> None:
    text = format_job(job_view())
    widths = {len(line) - len(line.split("  ", 1)[1].lstrip()) for line in text.splitlines()}
    assert len(widths) == 1  # every value starts in the same column
    shown = lines_of(text)
    assert shown["job"] == f"{'a' * 32} (llama)"
    assert shown["state"] == "ready"
    assert shown["schedule"] == (
        "interleaved-1f1b: 4 stages x 8 microbatches x 2 chunks; 2 data parallel x 1 tensor "
        "parallel"
    )
    assert shown["ranks"] == "8 of 8 registered, 8 profiles (4 of 4 stages)"
    assert shown["progress"] == "no iterations reported"
    assert shown["policy"] == "max-slowdown:1.1"
    assert shown["p_block"] == "unknown (no profile or job value yet)"
    assert shown["straggler"] == "none"
    assert shown["frontier"] == "40 points, planned in 1.50 s"
    assert "chosen" not in shown and "measured" not in shown and "re-run" not in shown


def test_a_job_under_a_straggler_with_telemetry_and_savings() -> None:
    view = job_view(
        straggler={"slowdown": 1.2, "automatic": True, "data_parallel_ranks": [1]},
        chosen=CHOSEN,
        p_block_w=125.0,
        telemetry={
            "predicted_time_s": 1.5,
            "predicted_energy_j": 900.0,
            "measured_time_s": 1.51,
            "measured_energy_j": 905.25,
            "replicas": [],
        },
        counts={
            "ranks_expected": 8,
            "ranks_registered": 8,
            "profiles_reported": 8,
            "stages_profiled": 4,
            "iterations_reported": 24,
            "iterations": 3,
        },
        profiles_since_plan=2,
        savings=SAVINGS,
    )
    text = format_job(view)
    head, _, savings = text.partition("\n\n")
    shown = lines_of(head)
    assert shown["straggler"] == "1.2x slower (detected: replicas 1)"
    assert shown["p_block"] == "125 W per stage"
    assert shown["progress"] == "3 iterations (24 reports from the ranks)"
    assert shown["chosen"] == (
        "point 3 (straggler plan, policy max-slowdown:1.1): 1.2500 s, 800.0 J per iteration "
        "(expected 1.5000 s, 900.0 J)"
    )
    assert shown["measured"] == "1.5100 s, 905.2 J per iteration"
    assert shown["re-run"].startswith("2 of 8 profiles re-reported since this plan")
    assert savings == format_savings(SavingsView.model_validate(SAVINGS))


def test_a_failed_job_and_the_ranks_that_gave_up_are_printed_escaped() -> None:
    view = job_view(
        state="failed",
        reason="bad\nprofile",
        gave_up=[{"rank": 5, "reason": "no\x1bnvml", "at_s": 0.0}],
    )
    shown = lines_of(format_job(view))
    assert shown["state"] == (
        "failed: bad\\nprofile (but 1 of 8 ranks gave up and run at default clocks)"
    )
    assert shown["rank 5"] == "gave up 1970-01-01 00:00:00 UTC: no\\x1bnvml"


def test_each_profiling_rank_says_its_clocks_and_the_time_left() -> None:
    def rank(r: int, done: int, left_s: float | None) -> dict[str, Any]:
        per_clock = None if left_s is None else 3.4
        return {"rank": r, "clocks_done": done, "clocks_planned": 110, "report_age_s": 1.0,
                "seconds_per_clock": per_clock, "time_left_s": left_s}  # fmt: skip

    view = job_view(state="profiling", profiling=[rank(0, 10, 340.0), rank(1, 0, None)])
    shown = lines_of(format_job(view))
    assert shown["state"] == "profiling"
    assert shown["rank 0"] == "profiling: 10 of 110 clocks, 3.4 s per clock, about 5 min 40 s left"
    assert shown["rank 1"] == (
        "profiling: 0 of 110 clocks (the time left is known once the first clock is measured)"
    )
    # A large job: the ranks with the most time left, then how many more.
    many = [rank(r, 10 + r, 340.0 - r) for r in range(12)]
    text = format_job(job_view(state="profiling", profiling=many))
    assert [line.split("  ")[0] for line in text.splitlines() if line.startswith("rank ")] == [
        f"rank {r}" for r in range(8)
    ]
    assert "and 4 more ranks profiling, with less time left" in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "0 s"),
        (59.4, "59 s"),
        (59.6, "1 min 0 s"),
        (340, "5 min 40 s"),
        (599, "9 min 59 s"),
        (630, "10 min"),
        (3599, "1 h 00 min"),
        (3660, "1 h 01 min"),
    ],
)
def test_a_wait_reads_in_minutes_and_seconds(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_savings_show_what_is_missing_as_dashes_and_the_warning() -> None:
    text = format_savings(SavingsView.model_validate(SAVINGS | {"warning": "too far apart"}))
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    assert re.match(r"plan version 2\s+-\s+-\s+0$", rows["plan version 2"])
    assert "1.2000" in rows["baseline (default clocks)"]
    assert "8 ranks" in rows["baseline (default clocks)"]
    assert re.match(r"predicted\s+\+1\.0 %\s+-12\.5 %$", rows["predicted"])
    assert re.match(r"realized\s+-\s+-$", rows["realized"])
    assert "energy saved so far  0 J (0 kWh) of 12,345 J reported" in text
    assert text.endswith("warning: too far apart\n")


def test_job_list() -> None:
    assert format_job_list([]) == "no jobs\n"
    jobs = [
        JobSummary(job_id="b" * 32, name=None, state="ready", version=12, created_at_s=86400.0),
        JobSummary(job_id="a" * 32, name="x", state="profiling", version=0, created_at_s=0.0),
    ]
    header, first, second = format_job_list(jobs).splitlines()
    assert header.split() == ["job", "state", "version", "created", "(UTC)", "name"]
    assert first.split() == ["b" * 32, "ready", "12", "1970-01-02", "00:00:00"]
    assert second.split() == ["a" * 32, "profiling", "0", "1970-01-01", "00:00:00", "x"]
    assert first.index("12") + 2 == second.index("0") + 1  # versions right-aligned


def test_hostile_job_names_are_printed_escaped() -> None:
    # Issue 24, item 14: a name could clear the screen or fake a "state ready" line.

    name = "x\x1b[2J\x1b[H\nstate        ready\r"
    summary = JobSummary(job_id="a" * 32, name=name, state="failed", version=0, created_at_s=0.0)
    text = format_job_list([summary])
    assert "\x1b" not in text and "\r" not in text
    assert text.count("\n") == 2  # the header and one job: no line of the name's own
    assert "\\x1b[2J" in text and "\\nstate" in text


# ----------------------------------------------------------------------------- frontier


def test_a_frontier_without_points() -> None:
    view = FrontierView(version=0, points=[], baselines={}, policy_index=0, chosen_index=0)
    assert format_frontier(view) == "frontier  no points\n"


def _server_views(
    frontier_json: bytes, policy_text: str, imposed_s: float
) -> tuple[object, tuple[float, float]]:
    """What the planner shows of ``frontier_json`` under a straggler of ``imposed_s``: its
    FrontierView and the (time, energy) ``perseus job status`` expects, by the server's own
    choice (as perseus.server.planning.plans builds them)."""

    frontier = frontier_from_json(frontier_json)
    policy = policy_spec(Policy.parse(policy_text))
    straggler = StragglerView(iteration_time_s=imposed_s)
    choice = choose(frontier, policy, straggler)
    status = expected(frontier, choice, straggler)
    view = FrontierView(
        version=1,
        points=[FrontierPoint.from_point(frontier.point(i)) for i in range(len(frontier))],
        baselines={k: Baseline.from_baseline(b) for k, b in frontier.baselines.items()},
        policy_index=choice.policy_index,
        chosen_index=choice.chosen_index,
        policy=policy,
        straggler_time_s=status[0],
    )
    return view, status


@pytest.mark.parametrize(
    ("imposed", "policy"), [("2.0", "no-slowdown"), ("1.8", "max-slowdown:1.1")]
)
def test_straggler_rows_agree_offline_on_the_server_and_in_status(
    imposed: str,
    policy: str,
    example: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``perseus plan --straggler``, ``perseus job frontier`` and ``perseus job status`` show
    the plan that runs at the same iteration time and energy, with the same saving against
    the default plan stretched to the straggler's time; a straggler shorter than the chosen
    plan (1.8 s against about 1.92 s) slows none of them."""

    frontier_file, plan_file = tmp_path / "f.json", tmp_path / "p.json"
    status = main(["plan", str(example), "--microbatches", "8", "--p-block", "100",
                   "--policy", policy, "--straggler", imposed, "--output", str(frontier_file),
                   "--plan-output", str(plan_file)])  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    view, (expected_s, expected_j) = _server_views(
        frontier_file.read_bytes(), policy, float(imposed)
    )
    assert isinstance(view, FrontierView)
    served = format_frontier(view, blocking_w=4 * 100.0)
    saved = json.loads(plan_file.read_text())
    assert saved["time_s"] == view.points[view.chosen_index].time_s  # the plan that runs

    def rows(text: str, label: str) -> list[list[str]]:
        pattern = rf"^{re.escape(label)}\s+([0-9.]+)\s+([0-9.]+)\s+(-?[0-9.]+ %)\s"
        return [list(m.groups()) for m in re.finditer(pattern, text + "\n", re.M)]

    offline_ref = rows(out, "default (max clock), stretched")
    served_ref = rows(served, "default (max clock), stretched")
    n = len(view.points)
    if imposed == "2.0":
        offline = rows(out, f"straggler (point {view.chosen_index} of {n})")
        online = rows(served, f"chosen: straggler (point {view.chosen_index} of {n})")
        assert offline and offline == online, (out, served)
        assert offline_ref and offline_ref == served_ref, (out, served)
        assert offline[0][:2] == [f"{expected_s:.4f}", f"{expected_j:.1f}"]
        assert offline_ref[0][0] == "2.0000" and offline[0][2] != "0.00 %"
        note = (
            "straggler rows: the iteration takes 2.0000 s because of another pipeline;\n"
            "their saving is against default (max clock) stretched to that time\n"
        )
        assert note in out and note in served
    else:  # the straggler is the faster one: the policy's plan runs, unstretched
        assert view.chosen_index == view.policy_index
        chosen = view.points[view.chosen_index]
        assert (expected_s, expected_j) == (chosen.time_s, chosen.energy_j)
        assert not offline_ref and not served_ref
        assert "straggler (point" not in out and "chosen: straggler" not in served
        assert "does not slow this pipeline" in out and "does not slow this pipeline" in served
        assert f"the iteration takes {chosen.time_s:.4f} s" in served
