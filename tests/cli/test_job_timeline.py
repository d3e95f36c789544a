"""``perseus job frontier --timeline``: the timeline of the point a job runs, drawn from the
server's frontier and profile documents, and refused when the ranks re-profiled since."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.cli.job_timeline import timeline_png_of
from perseus.core.errors import JobStateError, PlanError, ProfileError
from perseus.schemas import Baseline, FrontierPoint, FrontierView
from perseus.solver import load_profile, profile_to_json

from .plans import frontier_of

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def documents(planned: tuple[Path, Path, Path, str], example: Path) -> tuple[bytes, bytes]:
    """The server's frontier file and profile JSON of the shared planning run."""
    profile = json.dumps(profile_to_json(load_profile(example))).encode()
    return planned[0].read_bytes(), profile


@pytest.fixture(scope="module")
def view(planned: tuple[Path, Path, Path, str]) -> FrontierView:
    frontier = frontier_of(planned[0])
    return FrontierView(
        version=3,
        points=[FrontierPoint.from_point(frontier.point(i)) for i in range(len(frontier))],
        baselines={k: Baseline.from_baseline(b) for k, b in frontier.baselines.items()},
        policy_index=0,
        chosen_index=len(frontier) - 1,
        straggler_time_s=9.5,
    )


def test_the_running_points_timeline_is_a_png(
    view: FrontierView, documents: tuple[bytes, bytes]
) -> None:
    png = timeline_png_of(view, *documents, job_id="j1")
    assert png.startswith(PNG) and len(png) > 10_000


def test_a_profile_other_than_the_planned_one_is_refused(
    view: FrontierView, documents: tuple[bytes, bytes]
) -> None:
    frontier, profile = documents
    rerun = json.loads(profile)
    rerun["rows"][0]["time_s"] *= 1.01  # the ranks measured again
    with pytest.raises(JobStateError, match="re-profiled since plan version 3"):
        timeline_png_of(view, frontier, json.dumps(rerun).encode(), job_id="j1")


def test_documents_that_do_not_read_name_the_job(
    view: FrontierView, documents: tuple[bytes, bytes]
) -> None:
    frontier, profile = documents
    with pytest.raises(PlanError, match="job j1's frontier"):
        timeline_png_of(view, b'{"format": "perseus.frontier/1"}', profile, job_id="j1")
    with pytest.raises(ProfileError, match="job j1's profile"):
        timeline_png_of(view, frontier, b"[]", job_id="j1")
