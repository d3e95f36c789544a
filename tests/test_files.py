"""``perseus.formats.plan_files``: plan and frontier files render and parse through one model
each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perseus.core.errors import PlanError
from perseus.formats.plan_files import (
    FrontierFile,
    PlanFile,
    profile_fingerprint,
    read_plan_or_frontier,
)
from perseus.solver import Frontier, Profile, compute_frontier, load_profile, make_schedule


@pytest.fixture(scope="module")
def profile() -> Iterator[Profile]:
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        yield load_profile(path)


@pytest.fixture(scope="module", params=[("1f1b", 1), ("interleaved-1f1b", 2)])
def frontier(profile: Profile, request: pytest.FixtureRequest) -> Frontier:
    name, chunks = request.param
    schedule = make_schedule(name, profile.num_stages, 4, chunks)
    return compute_frontier(profile, schedule, p_block_w=100.0)


def _write(tmp_path: Path, data: bytes | dict[str, Any]) -> str:
    path = tmp_path / "file.json"
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return str(path)


def test_a_frontier_file_reads_back_as_the_same_frontier(
    profile: Profile, frontier: Frontier, tmp_path: Path
) -> None:
    fingerprint = profile_fingerprint(profile)
    document = FrontierFile.of_run(
        frontier, frontier.baselines, profile=fingerprint, baselines_deadline_s=1.8
    )
    read = read_plan_or_frontier(_write(tmp_path, document.render()))
    assert isinstance(read, FrontierFile)
    assert read == document
    again = read.to_frontier()
    assert again.schedule == frontier.schedule and again.p_block_w == frontier.p_block_w
    for name in ("times_s", "energies_j", "gaps", "frequencies_mhz"):
        assert np.array_equal(getattr(again, name), getattr(frontier, name)), name
    assert again.baselines == frontier.baselines


def test_a_plan_file_reads_back(profile: Profile, frontier: Frontier, tmp_path: Path) -> None:
    document = PlanFile.of_point(frontier, 1, profile=profile_fingerprint(profile))
    text = document.render()
    assert text.count(b"\n") == len(document.model_dump(exclude_none=True)) + 3 + 4
    read = read_plan_or_frontier(_write(tmp_path, text))
    assert isinstance(read, PlanFile) and read == document
    assert read.to_schedule() == frontier.schedule
    assert read.clocks == frontier.point(1).frequencies_mhz
    assert read.time_s == frontier.point(1).time_s


def test_the_fingerprint_follows_the_measurements_not_the_file(
    profile: Profile, tmp_path: Path
) -> None:
    from perseus.solver import profile_to_json

    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps(profile_to_json(profile)))
    same = profile_fingerprint(load_profile(as_json))
    assert same.sha256 == profile_fingerprint(profile).sha256
    assert same.source == "p.json"
    data = profile_to_json(profile)
    data["rows"][5]["energy_j"] *= 1.000001
    as_json.write_text(json.dumps(data))
    assert profile_fingerprint(load_profile(as_json)).sha256 != same.sha256


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["points"][1].update(time_s=float("nan")), "points[1].time_s"),
        (lambda d: d["points"][0].update(gap=True), "points[0].gap"),
        (lambda d: d.update(stages="4"), "stages"),
        (lambda d: d.update(p_block_w=-1), "p_block_w"),
        (lambda d: d.pop("order"), "order: missing"),
        (lambda d: d["order"][0].reverse(), "order: does not match"),
        (lambda d: d["points"][2]["frequencies_mhz"][1].pop(), "points[2].frequencies_mhz[1]"),
        (lambda d: d["points"][2]["frequencies_mhz"][1].__setitem__(0, 0), "points[2]"),
        (lambda d: d["baselines"].update(fastest=d["baselines"]["global_clock"]), "fastest"),
        (lambda d: d["points"].reverse(), "must rise"),
        (lambda d: d.update(schedule="zigzag"), "schedule"),
        (lambda d: d["profile"].update(sha256="abc"), "profile.sha256"),
    ],
)
def test_a_bad_frontier_file_names_the_field(
    profile: Profile, frontier: Frontier, tmp_path: Path, edit: Any, expected: str
) -> None:
    document = FrontierFile.of_run(
        frontier,
        frontier.baselines,
        profile=profile_fingerprint(profile),
        baselines_deadline_s=None,
    )
    data = json.loads(document.render())
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(PlanError) as raised:
        read_plan_or_frontier(path).to_frontier()  # type: ignore[union-attr]
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)


def test_other_files_say_what_is_expected(tmp_path: Path) -> None:
    for content, words in [
        (b"stage,instruction,frequency,time,energy\n", ["CSV profile", "perseus.plan/1"]),
        (b"[1, 2]", ["a JSON list", "perseus.frontier/1"]),
        (b'{"format": "perseus.profile/1"}', ["format 'perseus.profile/1'", "--plan-output"]),
        (b"\xff\xfe", ["not a text file"]),
    ]:
        with pytest.raises(PlanError) as raised:
            read_plan_or_frontier(_write(tmp_path, content))
        for word in words:
            assert word in str(raised.value)
    with pytest.raises(PlanError, match="cannot read"):
        read_plan_or_frontier(str(tmp_path / "missing.json"))


def test_points_and_baselines_are_rendered_from_the_solvers(frontier: Frontier) -> None:
    """FilePoint and FileBaseline are the solver's Point and Baseline in a file: rendered
    from them, and read back to the same values."""
    from perseus.formats.plan_files import FileBaseline, FilePoint

    for i in (0, len(frontier) - 1):
        point = frontier.point(i)
        rendered = FilePoint.from_point(point)
        assert (rendered.time_s, rendered.energy_j, rendered.gap) == (
            point.time_s,
            point.energy_j,
            point.gap,
        )
        assert tuple(tuple(row) for row in rendered.frequencies_mhz) == point.frequencies_mhz
    for baseline in frontier.baselines.values():
        assert FileBaseline.from_baseline(baseline).to_baseline() == baseline


@pytest.fixture(scope="module")
def timed(profile: Profile) -> Frontier:
    """A frontier whose stated times and energies include clock-change transitions."""
    schedule = make_schedule("1f1b", profile.num_stages, 4)
    return compute_frontier(profile, schedule, p_block_w=100.0, clock_change_margin_s=0.005)


def test_the_clock_change_margin_travels_with_frontier_and_plan_files(
    profile: Profile, timed: Frontier, tmp_path: Path
) -> None:
    from perseus.formats.plan_files import frontier_from_json, frontier_to_json

    fingerprint = profile_fingerprint(profile)
    document = FrontierFile.of_run(
        timed, timed.baselines, profile=fingerprint, baselines_deadline_s=None
    )
    assert json.loads(document.render())["clock_change_margin_s"] == 0.005
    again = read_plan_or_frontier(_write(tmp_path, document.render()))
    assert isinstance(again, FrontierFile)
    assert again.to_frontier().clock_change_margin_s == 0.005
    assert frontier_from_json(frontier_to_json(timed)).clock_change_margin_s == 0.005
    plan = PlanFile.of_point(timed, 0, profile=fingerprint)
    read = read_plan_or_frontier(_write(tmp_path, plan.render()))
    assert isinstance(read, PlanFile)
    assert read.clock_change_margin_s == 0.005 and read.time_s == timed.point(0).time_s


def test_files_without_a_margin_read_as_zero(timed: Frontier, tmp_path: Path) -> None:
    """Files written before the margin existed planned without transitions: margin 0."""
    data = json.loads(
        FrontierFile.of_run(
            timed, timed.baselines, profile=None, baselines_deadline_s=None
        ).render()
    )
    del data["clock_change_margin_s"]
    read = read_plan_or_frontier(_write(tmp_path, data))
    assert isinstance(read, FrontierFile) and read.to_frontier().clock_change_margin_s == 0.0
    plan = json.loads(PlanFile.of_point(timed, 0, profile=None).render())
    del plan["clock_change_margin_s"]
    read_plan = read_plan_or_frontier(_write(tmp_path, plan))
    assert isinstance(read_plan, PlanFile) and read_plan.clock_change_margin_s == 0.0


@pytest.mark.parametrize("margin", [-0.001, 1.0, "0.005", None])
def test_a_bad_margin_names_the_field(timed: Frontier, tmp_path: Path, margin: object) -> None:
    for document in (
        FrontierFile.of_run(timed, timed.baselines, profile=None, baselines_deadline_s=None),
        PlanFile.of_point(timed, 0, profile=None),
    ):
        data = json.loads(document.render())
        data["clock_change_margin_s"] = margin
        with pytest.raises(PlanError, match="clock_change_margin_s"):
            read_plan_or_frontier(_write(tmp_path, data))


def test_the_grid_spacing_travels_with_frontier_files(timed: Frontier, tmp_path: Path) -> None:
    """A frontier file records the deadline spacing it was planned on; older files, without
    it, still read (spacing unknown)."""
    from perseus.formats.plan_files import frontier_from_json, frontier_to_json

    assert timed.resolution_s == 1e-3  # a small job keeps the 1 ms grid
    data = json.loads(frontier_to_json(timed))
    assert data["resolution_s"] == 1e-3
    assert frontier_from_json(data).resolution_s == 1e-3
    del data["resolution_s"]
    read = read_plan_or_frontier(_write(tmp_path, data))
    assert isinstance(read, FrontierFile) and read.to_frontier().resolution_s is None
    data["resolution_s"] = -1.0
    with pytest.raises(PlanError, match="resolution_s"):
        read_plan_or_frontier(_write(tmp_path, data))
