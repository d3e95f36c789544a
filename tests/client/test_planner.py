"""The planner client: against the real app (TestClient) and scripted answers (MockTransport);
the retry pieces have test_retry.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from perseus.client.planner import (
    DEFAULT_TIMEOUT,
    LONG_POLL_MARGIN_S,
    PlannerClient,
    PlanTooLarge,
    create_job,
)
from perseus.client.retry import retryable
from perseus.errors import (
    AuthError,
    InfeasibleDeadline,
    JobNotFound,
    JobStateError,
    PerseusError,
    PlannerUnavailable,
    PlanNotReady,
    ProfileError,
    RequestRejected,
    SolverTimeout,
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
from perseus.server.jobs import RequestFieldError
from perseus.server.routes import error_response, error_status
from perseus.server.settings import Settings
from perseus.server.storage import StorageFault
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


def _subclasses(cls: type[PerseusError]) -> list[type[PerseusError]]:
    """Every subclass of ``cls``, depth first."""
    found: list[type[PerseusError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_status_the_server_maps_comes_back_as_its_class() -> None:
    examples: dict[type[PerseusError], PerseusError] = {
        PlanNotReady: PlanNotReady("not ready yet", "planning"),
        RequestFieldError: RequestFieldError(("body", "rows", 3, "time_s"), "too slow"),
    }
    expected: dict[type[PerseusError], type[PerseusError]] = {
        RequestFieldError: RequestRejected,
        SolverTimeout: PlannerUnavailable,  # any 5xx
        PlanTooLarge: RequestRejected,  # the rank's own refusal: no server sends it
        StorageFault: PlannerUnavailable,  # a 503
    }
    mapped: set[str] = set()
    for cls in _subclasses(PerseusError):
        if issubclass(cls, AuthError):
            continue  # its status is its own, below
        exc = examples.get(cls) or cls(f"a {cls.__name__}")
        code = error_status(exc)
        if code == 400:
            continue  # not in the server's table
        mapped.add(cls.__name__)
        answer = error_response(exc)
        body = json.loads(bytes(answer.body))
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-length"}
        with pytest.raises(PerseusError) as raised:
            _answer(code, body, **headers).job()
        assert type(raised.value) is expected.get(cls, cls), cls
    assert mapped >= {  # the server's table, at least
        "JobNotFound", "PlanNotReady", "JobStateError", "PlanError", "RequestFieldError",
        "ProfileError", "ScheduleError", "PolicyError", "InfeasibleDeadline",
        "PlanningTooLarge", "SolverTimeout",
    }  # fmt: skip
    for code in (401, 403):
        answer = error_response(AuthError("no", code))
        with pytest.raises(AuthError) as auth:
            _answer(code, json.loads(bytes(answer.body))).job()
        assert auth.value.status_code == code


# ----------------------------------------------------------------------------- scripted answers


def test_not_ready_carries_state_and_retry_after() -> None:
    client = _answer(
        409,
        {
            "detail": "not ready yet: job x is planning",
            "error": "PlanNotReady",
            "state": "planning",
        },
        **{"Retry-After": "2"},
    )
    with pytest.raises(PlanNotReady) as raised:
        client.plan(0)
    assert raised.value.state == "planning"
    assert raised.value.retry_after_s == 2.0
    assert retryable(raised.value)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (503, {"detail": "the exact solve ran out of time", "error": "SolverTimeout"}),
        (500, b"Internal Server Error"),
        (502, b"<html>bad gateway</html>"),
    ],
)
def test_5xx_is_unavailable(status: int, body: Any) -> None:
    with pytest.raises(PlannerUnavailable, match=f"HTTP {status}") as raised:
        _answer(status, body).frontier()
    assert retryable(raised.value)


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
        httpx.RemoteProtocolError("server disconnected"),
    ],
)
def test_transport_errors_are_unavailable_from_the_original(error: httpx.TransportError) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    with pytest.raises(PlannerUnavailable, match="unreachable") as raised:
        _scripted(handler).job()
    assert raised.value.__cause__ is error
    assert "http://planner:7787" in str(raised.value)
    assert "the-token" not in str(raised.value)


@pytest.mark.parametrize(
    ("status", "body", "what"),
    [
        (200, b"<html>hello</html>", "not a JobView"),
        (200, {"job_id": JOB_ID}, "not a JobView"),
        (404, b"<html>not found</html>", "not a planner error"),
        (400, {"message": "who knows"}, "not a planner error"),
        (422, {"detail": [{"where": 1}], "error": "ValidationError"}, "not a planner error"),
    ],
)
def test_garbage_is_unavailable(status: int, body: Any, what: str) -> None:
    with pytest.raises(PlannerUnavailable, match="garbage") as raised:
        _answer(status, body).job()
    assert what in str(raised.value)


def test_an_answer_that_cannot_be_decoded_is_unavailable_not_a_foreign_error() -> None:
    # A proxy that says gzip and sends HTML: httpx raises DecodingError, which is no
    # TransportError; it must still reach the rank's threads as a retryable PlannerUnavailable.
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"Content-Encoding": "gzip"}, stream=httpx.ByteStream(b"<html>")
        )

    client = _scripted(handler)
    report = IterationReport(rank=0, iteration=0, time_s=1.0, energy_j=1.0)
    for call in (client.job, lambda: client.report_iteration(report)):
        with pytest.raises(PlannerUnavailable, match="garbage") as raised:
            call()
        assert isinstance(raised.value.__cause__, httpx.DecodingError)
        assert retryable(raised.value)


def test_auth_and_unknown_job() -> None:
    for status in (401, 403):
        with pytest.raises(AuthError) as raised:
            _answer(status, {"detail": "the token", "error": "AuthError"}).job()
        assert raised.value.status_code == status
        assert not retryable(raised.value)
    with pytest.raises(JobNotFound, match="no job"):
        _answer(404, {"detail": "no job 'x'", "error": "JobNotFound"}).job()


def test_validation_errors_name_their_fields() -> None:
    detail = [
        {
            "loc": ["body", "rows", 3, "time_s"],
            "msg": "Input should be greater than 0",
            "type": "x",
        },
        {"loc": ["body", "stage"], "msg": "Field required", "type": "missing"},
    ]
    client = _answer(422, {"detail": detail, "error": "ValidationError"})
    with pytest.raises(RequestRejected) as raised:
        client.report_profile(ProfileReport(rank=0, stage=0, rows=[_row(1410), _row(1395)]))
    assert str(raised.value) == (
        "body.rows.3.time_s: Input should be greater than 0; body.stage: Field required"
    )
    assert not retryable(raised.value)
    with pytest.raises(RequestRejected, match="exceeds") as too_large:
        _answer(
            413, {"detail": "request body exceeds 1024 bytes", "error": "PayloadTooLarge"}
        ).job()
    assert too_large.value.status_code == 413


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
