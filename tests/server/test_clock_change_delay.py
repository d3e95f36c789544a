"""The clock-change delay a server plans for: the plans keep every run of one clock long
enough for its changes to land in turn, and the frontier and timeline views say the delay."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from perseus.schemas import FRONTIER_PATH, TIMELINE_PATH
from perseus.server.settings import Settings

from .conftest import ProfileRows, clocks_of, create_job


def _runs_too_short(gpus: list[list[dict]], total: float, margin: float, delay: float) -> int:
    """Runs of one clock, on the timeline view's replayed starts, shorter than the delay
    their changes need (``delay + margin * (s_in - s_out)``, -1 a raise, +1 a lowering)."""
    short = 0
    for row in gpus:
        clocks = [i["frequency_mhz"] for i in row]
        starts = [i["start_s"] for i in row]
        firsts = [k for k in range(len(row)) if clocks[k] != clocks[k - 1]]
        for j, k in enumerate(firsts):
            nxt = firsts[(j + 1) % len(firsts)]
            span = (starts[nxt] if nxt > k else starts[nxt] + total) - starts[k]
            into = -1 if clocks[k] > clocks[k - 1] else 1
            out = -1 if clocks[nxt] > clocks[nxt - 1] else 1
            short += span < (delay + margin * (into - out)) * (1 - 1e-9)
    return short


@pytest.mark.parametrize("delay", [0.0, 0.1])
def test_a_zbv_job_is_planned_for_the_servers_delay(
    settings: Settings,
    make_client: Callable[[Settings], TestClient],
    example_rows: ProfileRows,
    delay: float,
) -> None:
    client = make_client(settings.model_copy(update={"clock_change_delay_s": delay}))
    job = create_job(
        client, schedule="zbv", stages=2, microbatches=4, virtual_stages=2, data_parallel=1
    )
    job.register_all(clocks_of(example_rows))
    job.report_all({0: example_rows[0], 1: example_rows[1]})
    assert job.wait_plan().status_code == 200
    view = client.get(FRONTIER_PATH.format(job_id=job.job_id), headers=job.auth).json()
    assert view["clock_change_delay_s"] == delay
    timeline = client.get(TIMELINE_PATH.format(job_id=job.job_id), headers=job.auth).json()
    assert timeline["clock_change_delay_s"] == delay
    short = _runs_too_short(
        timeline["gpus"], timeline["time_s"], timeline["clock_change_margin_s"], 0.1
    )
    if delay:
        assert short == 0
    else:
        assert short > 0  # the case needs the merge: without a delay, its plan changes faster
