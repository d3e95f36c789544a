"""The planner client: against the real app (TestClient) and scripted answers (MockTransport);
one request's error mapping and bounded reads have test_planner_http.py, the retry pieces
test_retry.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from perseus.client.api.client import (
    DEFAULT_TIMEOUT,
    LONG_POLL_MARGIN_S,
    PlannerClient,
    create_job,
)
from perseus.client.api.retry import retryable
from perseus.core.errors import (
    AuthError,
    InfeasibleDeadline,
    JobNotFound,
    JobStateError,
    PlannerUnavailable,
    PlanNotReady,
    ProfileError,
    RequestRejected,
)
from perseus.schemas import (
    DeadlinePolicy,
    IterationReport,
    JobCreate,
    MinEnergyPolicy,
    ProfileReport,
    ProfileRow,
    RankRegistration,
    StragglerSpec,
)
from perseus.server.app import create_app
from perseus.server.settings import Settings
from perseus.solver import load_profile, profile_to_json

# The TestClient ignores timeouts and says so; a long poll sets its read timeout on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument")

JOB_ID = "0123456789abcdef0123456789abcdef"
STAGES = 4


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def example_rows() -> dict[int, list[ProfileRow]]:
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        rows: dict[int, list[ProfileRow]] = {}
        for row in profile_to_json(load_profile(path))["rows"]:
            rows.setdefault(row.pop("stage"), []).append(ProfileRow.model_validate(row))
        return rows


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database=f"sqlite:///{tmp_path / 'perseus.db'}",
        admin_token=None,
        warm_planner=False,
        planning_lease_s=3.0,
        cache_ttl_s=1.0,
        polish_s=0.0,
    )
    with TestClient(create_app(settings)) as client:
        yield client


def _spec(**fields: Any) -> JobCreate:
    base: dict[str, Any] = {
        "schedule": "1f1b",
        "stages": STAGES,
        "microbatches": 4,
        "data_parallel": 1,
        "tensor_parallel": 1,
        "p_block_w": 100.0,
    }
    return JobCreate.model_validate(base | fields)


def _registration(rank: int, clocks: list[int]) -> RankRegistration:
    return RankRegistration(
        rank=rank,
        stage=rank,
        data_parallel_rank=0,
        tensor_parallel_rank=0,
        gpu_name="NVIDIA H200",
        supported_clocks_mhz=clocks,
    )


def _clocks(rows: dict[int, list[ProfileRow]]) -> list[int]:
    return sorted({r.frequency_mhz for stage in rows.values() for r in stage})


def _scripted(
    handler: Callable[[httpx.Request], httpx.Response], job_id: str = JOB_ID
) -> PlannerClient:
    http = httpx.Client(base_url="http://planner:7787", transport=httpx.MockTransport(handler))
    return PlannerClient(http, job_id, "the-token")


def _answer(status: int, body: Any = None, **headers: str) -> PlannerClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.Response(status, content=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return _scripted(handler)


# ----------------------------------------------------------------------------- the real app


def test_a_job_from_creation_to_deletion(
    app_client: TestClient, example_rows: dict[int, list[ProfileRow]]
) -> None:
    created = create_job(app_client, _spec(name="client"), None)
    client = PlannerClient(app_client, created.job_id, created.token)
    assert client.job().state == "registering"
    with pytest.raises(PlanNotReady) as not_ready:
        client.frontier()
    assert not_ready.value.state == "registering"
    assert not_ready.value.retry_after_s == 1.0

    clocks = _clocks(example_rows)
    for rank in range(STAGES):
        assert client.register(_registration(rank, clocks)).rank == rank
    accepted = [
        client.report_profile(ProfileReport(rank=r, stage=r, rows=example_rows[r]))
        for r in range(STAGES)
    ]
    assert [a.planning for a in accepted] == [False] * (STAGES - 1) + [True]

    plan = client.plan(1, wait_s=30)
    assert plan is not None
    assert (plan.version, plan.stage, len(plan.instructions)) == (1, 1, 2 * 4)
    assert client.plan(1, version=1) is None  # 304: still current

    frontier = client.frontier()
    assert frontier.version == 1
    assert len(frontier.points) > 1
    assert frontier.points[0].time_s == pytest.approx(plan.time_s)

    moved = client.set_policy(MinEnergyPolicy(kind="min-energy"))
    assert moved.version == 2
    assert moved.chosen is not None and moved.chosen.index == len(frontier.points) - 1
    newer = client.plan(1, version=1, wait_s=5)
    assert newer is not None and newer.version == 2

    with pytest.raises(InfeasibleDeadline):
        client.set_policy(DeadlinePolicy(kind="deadline", seconds=1e-6))
    assert client.set_straggler(StragglerSpec(slowdown=1.2)).version == 3
    assert client.clear_straggler().version == 4
    reply = client.report_iteration(
        IterationReport(rank=0, iteration=0, time_s=plan.time_s, energy_j=10.0)
    )
    assert reply.iteration == 0

    text = client.profile_csv()
    assert text.startswith("stage,instruction,frequency,time,energy,p_block_w\n")

    view = client.job()
    assert (view.state, view.version, view.name) == ("ready", 4, "client")
    client.delete()
    with pytest.raises(JobNotFound):
        client.job()


def test_a_gave_up_reason_of_any_text_reaches_the_job(app_client: TestClient) -> None:
    # An exception's text may hold NULs or lone surrogates (a file name): the report is
    # sent all the same, cleaned, never refused on the rank.
    created = create_job(app_client, _spec(), None)
    client = PlannerClient(app_client, created.job_id, created.token)
    client.report_gave_up(0, "no /dev/nvidia\udcff:\x00 denied")
    client.report_gave_up(1, "\x00" * 3000)
    assert [(g.rank, g.reason) for g in client.job().gave_up] == [
        (0, "no /dev/nvidia\ufffd: denied"),
        (1, "unknown"),
    ]


def test_server_errors_become_the_same_classes(
    app_client: TestClient, example_rows: dict[int, list[ProfileRow]]
) -> None:
    created = create_job(app_client, _spec(), None)
    client = PlannerClient(app_client, created.job_id, created.token)
    with pytest.raises(AuthError) as wrong:
        PlannerClient(app_client, created.job_id, "not-the-token").job()
    assert wrong.value.status_code == 403
    with pytest.raises(JobNotFound):
        PlannerClient(app_client, JOB_ID, created.token).job()
    # A rank that never registered: the job's state refuses it, and it is not "not ready".
    with pytest.raises(JobStateError) as unregistered:
        client.report_profile(ProfileReport(rank=0, stage=0, rows=example_rows[0]))
    assert not isinstance(unregistered.value, PlanNotReady)
    assert not retryable(unregistered.value)
    client.register(_registration(0, _clocks(example_rows)))
    # Rows the schema allows but the solver refuses (a clock measured twice).
    twice = [example_rows[0][0], example_rows[0][0], *example_rows[0][1:]]
    with pytest.raises(ProfileError, match="duplicate"):
        client.report_profile(ProfileReport(rank=0, stage=0, rows=twice))
    # A field out of range for this job: the path names it.
    bad = _registration(9, [1410]).model_copy(update={"stage": 9})
    with pytest.raises(RequestRejected, match=r"body\.") as rejected:
        client.register(bad)
    assert rejected.value.status_code == 422


# ----------------------------------------------------------------------------- scripted answers


def _row(clock: int) -> ProfileRow:
    return ProfileRow(instruction="forward", frequency_mhz=clock, time_s=0.1, energy_j=1.0)


def test_requests_carry_token_version_and_long_poll_timeout() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(304, headers={"ETag": '"3"'})

    client = _scripted(handler, job_id="../jobs")
    assert client.plan(5, version=3, wait_s=20) is None
    assert client.plan(5) is None
    long_poll, plain = seen
    assert long_poll.headers["Authorization"] == "Bearer the-token"
    assert long_poll.headers["If-None-Match"] == '"3"'
    # The id cannot leave its path segment.
    assert long_poll.url.raw_path.split(b"?")[0] == b"/v1/jobs/..%2Fjobs/plan"
    assert dict(long_poll.url.params) == {"rank": "5", "wait_s": "20"}
    assert long_poll.extensions["timeout"]["read"] == 20 + LONG_POLL_MARGIN_S
    assert "If-None-Match" not in plain.headers
    assert dict(plain.url.params) == {"rank": "5"}
    assert plain.extensions["timeout"]["read"] == httpx.Timeout(5.0).read
    with pytest.raises(ValueError):
        client.plan(5, wait_s=-1)


def test_profile_csv_must_be_csv() -> None:
    with pytest.raises(PlannerUnavailable, match="not CSV"):
        _answer(200, {"not": "csv"}).profile_csv()


def test_open_uses_explicit_timeouts_and_maps_a_refused_connection() -> None:
    with PlannerClient.open("http://127.0.0.1:1", JOB_ID, "t") as client:
        assert client.http.timeout == DEFAULT_TIMEOUT
        with pytest.raises(PlannerUnavailable, match="unreachable") as raised:
            client.job()
        assert isinstance(raised.value.__cause__, httpx.ConnectError)
    assert client.http.is_closed
