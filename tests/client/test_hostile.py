"""The rank against a hostile or broken world (issue 24): no NVML, a server that answers too
fast, plans that are too big or wrong. Training always goes on."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

import perseus.client
from perseus.cli.job_views import format_job
from perseus.client.api.client import PlannerClient, PlanTooLarge
from perseus.client.api.retry import Backoff
from perseus.client.gpu.control import NvmlGpu
from perseus.client.gpu.fake import FakeGpu, default_work
from perseus.client.rank import Rank
from perseus.client.session import POLL_FLOOR_S, Outage, Session
from perseus.client.settings import ClientSettings, load_settings
from perseus.client.state import RankState
from perseus.core.errors import GpuControlError
from perseus.schemas import (
    IterationAccepted,
    IterationReport,
    JobView,
    PlanInstruction,
    PlanResponse,
)
from perseus.server.app import create_app
from perseus.server.settings import Settings

from .scripted import EXAMPLE_PROFILE, JOB, SERVER, ScriptedPlanner

NOWHERE = {"server": "http://127.0.0.1:9", "job": "j", "token": "t"}


def _nvml_missing() -> bool:
    try:
        NvmlGpu(0).close()
    except GpuControlError:
        return True
    return False


needs_no_nvml = pytest.mark.skipif(not _nvml_missing(), reason="this machine has NVML")


@needs_no_nvml
def test_without_nvml_training_goes_on_with_one_error_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="perseus")
    ranks = [
        perseus.client.connect(gpu="nvml", rank=r, install_signal_handlers=False, **NOWHERE)
        for r in range(2)
    ]
    for rank in ranks:
        assert not rank.active
        assert rank.failure is not None and "NVML" in rank.failure
        with rank.iteration(), rank.instruction("forward", 0):
            pass
        rank.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2  # one line per rank
    assert all(r.exc_info is None for r in errors)  # no traceback
    assert "rank 0" in errors[0].getMessage() and "PERSEUS_STRICT" in errors[0].getMessage()


@needs_no_nvml
def test_strict_fails_fast_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERSEUS_STRICT", "1")
    with pytest.raises(GpuControlError, match="NVML"):
        perseus.client.connect(gpu="nvml", install_signal_handlers=False, **NOWHERE)


def test_the_strict_setting_is_a_flag() -> None:
    from perseus.client.settings import SettingsError, load_settings

    assert not load_settings({}).strict
    assert load_settings({"PERSEUS_STRICT": "1"}).strict
    assert load_settings({"PERSEUS_STRICT": "0"}, strict=True).strict
    with pytest.raises(SettingsError, match="PERSEUS_STRICT"):
        load_settings({"PERSEUS_STRICT": "maybe"})


class _RecordingStop(threading.Event):
    """A stop event that records how long the session waits, without waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


class _InstantNotModified:
    """A planner whose plan long poll answers 304 at once (a proxy cutting long polls)."""

    def __init__(self, stop: threading.Event, polls: int) -> None:
        self.stop = stop
        self.polls = polls
        self.calls = 0

    def plan(
        self,
        rank: int,
        *,
        version: int | None = None,
        wait_s: float = 0.0,
        max_bytes: int | None = None,
    ) -> None:
        self.calls += 1
        if self.calls >= self.polls:
            self.stop.set()


def test_a_304_that_comes_back_at_once_does_not_make_a_tight_loop() -> None:
    stop = _RecordingStop()
    planner = _InstantNotModified(stop, polls=20)
    state = RankState(ClientSettings(stage=0))
    session = Session(state, planner, FakeGpu(), None, stop, None)  # type: ignore[arg-type]
    session._poll_plans(random.Random(0), Backoff(), Outage())
    assert planner.calls == 20
    # every poll after the first waited out (nearly) the whole floor first
    assert len(stop.waits) >= 19
    assert sum(stop.waits) >= 19 * POLL_FLOOR_S * 0.9


def test_the_server_refuses_a_max_wait_of_zero() -> None:
    with pytest.raises(ValidationError, match="PERSEUS_MAX_WAIT_S must be more than 0"):
        Settings(max_wait_s=0)
    assert Settings(max_wait_s=0.2).max_wait_s == 0.2


ORDER = [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)]


def _plan(version: int, keys: list[tuple[str, int]], mhz: int) -> bytes:
    return (
        PlanResponse(
            job_id=JOB,
            version=version,
            stage=0,
            time_s=1.0,
            energy_j=1.0,
            instructions=[
                PlanInstruction(instruction=kind, microbatch=j, frequency_mhz=mhz, time_s=0.01)
                for kind, j in keys
            ],
        )
        .model_dump_json()
        .encode()
    )


class PlanSequence(ScriptedPlanner):
    """Serves ``plans[current]`` as version ``current + 1``; the test moves ``current`` on."""

    def __init__(self, plans: list[bytes]) -> None:
        super().__init__(PlanResponse.model_validate_json(plans[-1]), microbatches=2)
        self.plans = plans
        self.current = 0
        self.served: list[int] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix(f"/v1/jobs/{JOB}")
        if request.method == "GET" and path == "/plan":
            version = self.current + 1
            if request.headers.get("If-None-Match") == f'"{version}"':
                time.sleep(0.05)
                return httpx.Response(304)
            self.served.append(version)
            return httpx.Response(
                200, content=self.plans[self.current], headers={"ETag": f'"{version}"'}
            )
        if request.method == "POST" and path == "/iterations":
            report = IterationReport.model_validate_json(request.content)
            self.reports.append(report)
            accepted = IterationAccepted(rank=0, iteration=report.iteration, version=1)
            return httpx.Response(200, text=accepted.model_dump_json())
        return super().handle(request)


def test_bad_plans_are_refused_one_by_one_and_a_good_one_is_followed(tmp_path: Path) -> None:
    huge = _plan(3, ORDER * 1000, 1500)  # ~300 KB: past the ~66 KB a 4-instruction rank takes
    planner = PlanSequence(
        [
            _plan(1, ORDER, 1234),  # a clock this GPU does not have
            _plan(2, ORDER[:3], 1500),  # the wrong count
            huge,
            _plan(4, ORDER, 1500),
        ]
    )
    settings = load_settings(
        {"PERSEUS_BASELINE_ITERATIONS": "0"},
        server=SERVER,
        job=JOB,
        token="t",
        stage=0,
        gpu="fake",
        profile_path=str(EXAMPLE_PROFILE),
        clock_log_dir=str(tmp_path),
    )
    # the job's one stage's work from the start: a bare fake learns it only once the session
    # has fetched the job, and an instruction begun before that fails as unknown work
    gpu = FakeGpu(work=default_work(0, 1))
    rank = Rank(settings, gpu=gpu, planner=planner.client())
    expected = ["1234 MHz", "has 3 instructions", "bytes", None]
    deadline = time.monotonic() + 60
    try:
        while planner.current < 3 or rank.plan_version != 4 or rank.iteration_index < 40:
            assert time.monotonic() < deadline, (planner.current, rank.failure)
            with rank.iteration():
                for kind, j in ORDER:
                    with rank.instruction(kind, j):
                        time.sleep(0.001)
            want = expected[planner.current]
            if want is not None and want in (rank.failure or ""):
                assert rank.plan_version is None  # refused: not followed
                assert rank.controller is not None and rank.controller.enabled
                planner.current += 1
    finally:
        planner.released.set()
        rank.close()
    assert rank.failure is None
    # telemetry never says the rank followed a plan it refused
    assert {r.plan_version for r in planner.reports} <= {None, 4}
    # the clock log records only clocks that were applied: v4's
    entries = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert {e["frequency_mhz"] for e in entries} <= {None, 1500}
    assert any(e["frequency_mhz"] == 1500 for e in entries)


def test_a_plan_past_the_byte_bound_is_refused_unparsed() -> None:
    body = _plan(7, ORDER * 1000, 1500)
    http = httpx.Client(
        base_url=SERVER,
        transport=httpx.MockTransport(
            lambda request: httpx.Response(200, content=body, headers={"ETag": '"7"'})
        ),
    )
    client = PlannerClient(http, JOB, "t")
    with pytest.raises(PlanTooLarge) as raised:
        client.plan(0, max_bytes=65536)
    assert raised.value.version == 7
    assert client.plan(0, max_bytes=len(body)) is not None


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database=f"sqlite:///{tmp_path / 'perseus.db'}",
        admin_token=None,
        warm_planner=False,
        cache_ttl_s=1.0,
        polish_s=0.0,
    )
    with TestClient(create_app(settings)) as client:
        yield client


def test_a_rank_that_rejects_its_job_shows_in_the_job_view(app: TestClient, tmp_path: Path) -> None:
    body = {
        "schedule": "1f1b",
        "stages": 1,
        "microbatches": 8,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    created = app.post("/v1/jobs", json=body).json()
    job, token = created["job_id"], created["token"]
    auth = {"Authorization": f"Bearer {token}"}
    settings = ClientSettings(
        server="http://testserver", job=job, token=token, stage=0, gpu="fake", poll_wait_s=0.5
    )
    rank = Rank(settings, gpu=FakeGpu(), planner=PlannerClient(app, job, token))
    rank.bind(schedule="1f1b", microbatches=4)
    deadline = time.monotonic() + 30
    try:
        while not app.get(f"/v1/jobs/{job}", headers=auth).json()["gave_up"]:
            assert time.monotonic() < deadline, rank.failure
            time.sleep(0.05)
    finally:
        rank.close()
    view = JobView.model_validate(app.get(f"/v1/jobs/{job}", headers=auth).json())
    (gave_up,) = view.gave_up
    assert gave_up.rank == 0
    assert "4 microbatches run, the job has 8" in gave_up.reason
    assert abs(gave_up.at_s - time.time()) < 60
    text = format_job(view)
    assert "1 of 1 ranks gave up" in text
    assert "rank 0" in text and "4 microbatches run, the job has 8" in text
    # the /ui page's source, too
    overview = app.get("/v1/overview").json()
    assert overview["jobs"][0]["gave_up"][0]["rank"] == 0


def test_a_gave_up_report_is_bounded_and_checked(app: TestClient) -> None:
    body = {
        "schedule": "1f1b",
        "stages": 1,
        "microbatches": 2,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    created = app.post("/v1/jobs", json=body).json()
    path = f"/v1/jobs/{created['job_id']}/ranks:gave-up"
    auth = {"Authorization": f"Bearer {created['token']}"}
    assert app.post(path, json={"rank": 1, "reason": "x"}, headers=auth).status_code == 422
    too_long = {"rank": 0, "reason": "x" * 5000}
    assert app.post(path, json=too_long, headers=auth).status_code == 422
    assert app.post(path, json={"rank": 0, "reason": "x"}, headers={}).status_code == 401
    assert app.post(path, json={"rank": 0, "reason": "a\x1b[2J"}, headers=auth).status_code == 200
    view = JobView.model_validate(app.get(f"/v1/jobs/{created['job_id']}", headers=auth).json())
    assert "\x1b" not in format_job(view)


@needs_no_nvml
def test_a_rank_without_nvml_shows_in_the_job_view(app: TestClient) -> None:
    body = {"schedule": "1f1b", "stages": 1, "microbatches": 2, "data_parallel": 1}
    created = app.post("/v1/jobs", json=body | {"tensor_parallel": 1}).json()
    job, token = created["job_id"], created["token"]
    rank = perseus.client.connect(
        gpu="nvml",
        server="http://testserver",
        job=job,
        token=token,
        planner=PlannerClient(app, job, token),
        install_signal_handlers=False,
    )
    assert not rank.active
    auth = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 30  # reported from a thread of its own
    while not app.get(f"/v1/jobs/{job}", headers=auth).json()["gave_up"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (gave_up,) = app.get(f"/v1/jobs/{job}", headers=auth).json()["gave_up"]
    assert "the GPU cannot be controlled" in gave_up["reason"] and "NVML" in gave_up["reason"]
