"""frontier.json (``perseus.formats.plan_files``, the one model of the format): shape, round trip,
strictness."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, note

from perseus.core.errors import PlanError
from perseus.formats.plan_files import frontier_from_json, frontier_to_json
from perseus.solver import Frontier, compute_frontier, make_schedule, profile_from_rows

from .cases import Case, cases, examples

TOP_KEYS = {"format", "schedule", "stages", "microbatches", "virtual_stages", "p_block_w",
            "order", "baselines", "points", "clock_change_margin_s", "resolution_s"}  # fmt: skip
POINT_KEYS = {"time_s", "energy_j", "gap", "frequencies_mhz"}
BASELINE_KEYS = {"default", "all_fastest", "global_clock", "per_stage_clock"}


def frontier_of(case: Case) -> Frontier:
    return compute_frontier(case.profile(), case.schedule(), p_block_w=case.p_block_w)


def is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@examples(25)
@given(cases(schedules=("1f1b", "gpipe", "interleaved-1f1b")))
def test_shape_and_round_trip(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    frontier = frontier_of(case)
    text = frontier_to_json(frontier)
    doc = json.loads(text)
    assert json.dumps(doc, allow_nan=False)  # plain JSON: no NaN
    assert set(doc) == TOP_KEYS, set(doc) ^ TOP_KEYS
    assert doc["format"] == "perseus.frontier/1"
    assert doc["schedule"] == case.schedule_name
    assert (doc["stages"], doc["microbatches"]) == (case.stages, case.microbatches)
    assert doc["p_block_w"] == case.p_block_w
    assert doc["clock_change_margin_s"] == 0.0  # planned without transitions
    assert doc["resolution_s"] == 1e-3  # small cases keep the 1 ms grid by default
    # order: per GPU, ["forward", mb] or, when interleaved, ["forward", mb, chunk]
    expected_order = [
        [[k, mb, c] if case.chunks > 1 else [k, mb] for k, mb, c in seq] for seq in case.order
    ]
    assert doc["order"] == expected_order
    assert set(doc["baselines"]) == BASELINE_KEYS
    for baseline in doc["baselines"].values():
        assert {"time_s", "energy_j"} <= set(baseline) <= {"time_s", "energy_j", "frequencies_mhz"}
        assert is_number(baseline["time_s"]) and is_number(baseline["energy_j"])
    points = doc["points"]
    assert len(points) == len(frontier)
    for i, point in enumerate(points):
        assert set(point) == POINT_KEYS
        assert all(is_number(point[k]) for k in ("time_s", "energy_j", "gap"))
        assert [len(row) for row in point["frequencies_mhz"]] == [len(s) for s in case.order]
        assert all(is_int(f) for row in point["frequencies_mhz"] for f in row)
        assert point["time_s"] == frontier.times_s[i]
        assert point["energy_j"] == frontier.energies_j[i]
    times = [p["time_s"] for p in points]
    energies = [p["energy_j"] for p in points]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert energies == sorted(energies, reverse=True) and len(set(energies)) == len(energies)

    again = frontier_from_json(text)
    assert json.loads(frontier_to_json(again)) == doc
    assert again.schedule == frontier.schedule
    assert again.p_block_w == frontier.p_block_w
    np.testing.assert_array_equal(again.times_s, frontier.times_s)
    np.testing.assert_array_equal(again.energies_j, frontier.energies_j)
    np.testing.assert_array_equal(again.gaps, frontier.gaps)
    for i in range(len(frontier)):
        assert again.point(i) == frontier.point(i)
    for key in BASELINE_KEYS:
        a, b = again.baselines[key], frontier.baselines[key]
        assert (a.time_s, a.energy_j) == (b.time_s, b.energy_j)


# ----------------------------------------------------------------------------- malformed


@pytest.fixture(scope="module")
def good_doc() -> dict[str, Any]:
    rows = [(s, k, f, t * (1 + s / 10) * 1410 / f, t * f / 20)
            for s in range(2) for k, t in (("forward", 0.05), ("backward", 0.1))
            for f in (1410, 1200, 1000, 800)]  # fmt: skip
    frontier = compute_frontier(profile_from_rows(rows), make_schedule("1f1b", 2, 3), p_block_w=60)
    doc = json.loads(frontier_to_json(frontier))
    assert len(doc["points"]) >= 3
    return doc


def _set(path: tuple[Any, ...], value: Any):
    def edit(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _delete(path: tuple[Any, ...]):
    def edit(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


def _swap_points(doc: dict[str, Any]) -> None:
    doc["points"][0], doc["points"][1] = doc["points"][1], doc["points"][0]


def _swap_energies(doc: dict[str, Any]) -> None:
    p = doc["points"]
    p[0]["energy_j"], p[1]["energy_j"] = p[1]["energy_j"], p[0]["energy_j"]


def _duplicate_time(doc: dict[str, Any]) -> None:
    doc["points"][1]["time_s"] = doc["points"][0]["time_s"]


def _swap_order(doc: dict[str, Any]) -> None:
    seq = doc["order"][0]
    seq[0], seq[1] = seq[1], seq[0]


def _short_plan(doc: dict[str, Any]) -> None:
    doc["points"][0]["frequencies_mhz"][1].pop()


MALFORMED = {
    "format missing": _delete(("format",)),
    "format wrong": _set(("format",), "perseus.frontier/2"),
    "schedule missing": _delete(("schedule",)),
    "schedule unknown": _set(("schedule",), "zero-bubble"),
    "schedule not text": _set(("schedule",), 3),
    "stages missing": _delete(("stages",)),
    "stages zero": _set(("stages",), 0),
    "stages fractional": _set(("stages",), 2.5),
    "stages text": _set(("stages",), "two"),
    "stages mismatch order": _set(("stages",), 3),
    "microbatches missing": _delete(("microbatches",)),
    "microbatches zero": _set(("microbatches",), 0),
    "microbatches fractional": _set(("microbatches",), 3.5),
    "microbatches mismatch order": _set(("microbatches",), 4),
    "p_block_w missing": _delete(("p_block_w",)),
    "p_block_w negative": _set(("p_block_w",), -1.0),
    "p_block_w text": _set(("p_block_w",), "60"),
    "p_block_w nan": _set(("p_block_w",), math.nan),
    "p_block_w bool": _set(("p_block_w",), True),
    "order missing": _delete(("order",)),
    "order not the schedule's": _swap_order,
    "order a GPU short": lambda d: d["order"].pop(),
    "order unknown kind": _set(("order", 0, 0, 0), "sideways"),
    "baselines missing": _delete(("baselines",)),
    "baselines not an object": _set(("baselines",), []),
    "baseline missing": _delete(("baselines", "global_clock")),
    "baseline unknown": _set(("baselines", "magic"), {"time_s": 1.0, "energy_j": 1.0}),
    "baseline time missing": _delete(("baselines", "all_fastest", "time_s")),
    "baseline energy text": _set(("baselines", "all_fastest", "energy_j"), "x"),
    "points missing": _delete(("points",)),
    "points empty": _set(("points",), []),
    "points not a list": _set(("points",), {}),
    "point not an object": _set(("points", 0), [1, 2]),
    "point time missing": _delete(("points", 0, "time_s")),
    "point energy missing": _delete(("points", 1, "energy_j")),
    "point gap missing": _delete(("points", 0, "gap")),
    "point clocks missing": _delete(("points", 0, "frequencies_mhz")),
    "point time text": _set(("points", 0, "time_s"), "0.5"),
    "point time nan": _set(("points", 0, "time_s"), math.nan),
    "point time inf": _set(("points", 1, "time_s"), math.inf),
    "point energy none": _set(("points", 0, "energy_j"), None),
    "point gap text": _set(("points", 0, "gap"), "small"),
    "points time descending": _swap_points,
    "points time repeated": _duplicate_time,
    "points energy ascending": _swap_energies,
    "plan a GPU short": _short_plan,
    "plan extra GPU": lambda d: d["points"][0]["frequencies_mhz"].append([1410]),
    "plan clock fractional": _set(("points", 0, "frequencies_mhz", 0, 0), 1410.5),
    "plan clock text": _set(("points", 0, "frequencies_mhz", 0, 0), "1410"),
    "plan clock bool": _set(("points", 0, "frequencies_mhz", 0, 0), True),
    "plan clock zero": _set(("points", 0, "frequencies_mhz", 0, 0), 0),
    "plan clock negative": _set(("points", 0, "frequencies_mhz", 0, 0), -1410),
    "plan not a list": _set(("points", 0, "frequencies_mhz"), "1410"),
}


@pytest.mark.parametrize("mutation", list(MALFORMED))
def test_from_json_rejects_malformed(good_doc: dict[str, Any], mutation: str) -> None:
    frontier_from_json(copy.deepcopy(good_doc))  # the unmodified document is fine
    doc = copy.deepcopy(good_doc)
    MALFORMED[mutation](doc)
    with pytest.raises(PlanError):
        frontier_from_json(doc)


@pytest.mark.parametrize("document", [None, [], "frontier", 3, {}])
def test_from_json_rejects_non_documents(document: object) -> None:
    with pytest.raises(PlanError):
        frontier_from_json(document)
