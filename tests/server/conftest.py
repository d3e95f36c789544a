"""Fixtures of the server tests: settings on a temporary database, a TestClient, profiles,
jobs driven through the API (:class:`Job`, :func:`create_job`, ``ready_job``), and a store
with helpers that drive a :class:`JobService` directly (``store``, :class:`Clock`,
:func:`register_ranks`, :func:`report_profiles`). Shared by every test module here, one per
server module.

Store tests run on SQLite always and on PostgreSQL when ``PERSEUS_TEST_POSTGRES_URL`` is set
(``.ci/postgres.sh`` prints it); without it the PostgreSQL parameter skips.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.core import jobs as job_states
from perseus.core.jobs import TRANSITIONS, JobState
from perseus.schemas import JobCreate, ProfileReport, ProfileRow, RankRegistration
from perseus.server.app import create_app
from perseus.server.service import JobService
from perseus.server.settings import Settings
from perseus.server.store.job_store import Store
from perseus.solver import load_profile, profile_to_json
from perseus.solver.synthetic import synthetic_profile

# The real profiles: $PERSEUS_TEST_PROFILES, else ../shared/data/profiles beside the checkout.
REAL_PROFILES = Path(
    os.environ.get("PERSEUS_TEST_PROFILES")
    or Path(__file__).parents[2] / ".." / "shared" / "data" / "profiles"
)
REAL_PROFILE = REAL_PROFILES / "bloom+a100_sxm_bf16.csv"
REAL_P_BLOCK_W = 83.64
POSTGRES_ENV = "PERSEUS_TEST_POSTGRES_URL"

ProfileRows = dict[int, list[dict[str, Any]]]


def read_profile_rows(path: Path) -> ProfileRows:
    """Zeus CSV -> stage -> wire rows ``{instruction, frequency_mhz, time_s, energy_j}``."""
    rows: ProfileRows = {}
    for row in profile_to_json(load_profile(path))["rows"]:
        rows.setdefault(row.pop("stage"), []).append(row)
    return rows


@pytest.fixture(scope="session")
def example_rows() -> ProfileRows:
    """The project's shipped example profile (4 stages), always present."""
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        return read_profile_rows(path)


@pytest.fixture(scope="session")
def real_rows() -> ProfileRows:
    """A real 8-stage profile; skips when it is absent (see REAL_PROFILES)."""
    if not REAL_PROFILE.is_file():
        pytest.skip(
            f"real profile {REAL_PROFILE} not present; set PERSEUS_TEST_PROFILES to its directory"
        )
    return read_profile_rows(REAL_PROFILE)


def synthetic_rows(stages: int, scale: float = 1.0) -> ProfileRows:
    """The synthetic H200-like profile as wire rows, times and energies times ``scale``."""
    rows: ProfileRows = {}
    for stage, kind, clock, time_s, energy_j in synthetic_profile(stages):
        rows.setdefault(stage, []).append(
            {
                "instruction": kind,
                "frequency_mhz": clock,
                "time_s": time_s * scale,
                "energy_j": energy_j * scale,
            }
        )
    return rows


def clocks_of(rows: ProfileRows) -> list[int]:
    return sorted({r["frequency_mhz"] for stage_rows in rows.values() for r in stage_rows})


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: an SQLite file, or the test PostgreSQL (tables dropped first)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'perseus.db'}"
        return
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set")
    store = Store(url)
    store.drop_schema()
    store.close()
    yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'perseus.db'}"


@pytest.fixture
def settings(sqlite_url: str) -> Settings:
    """Test settings: no admin token, no warm-up process, a short planning lease."""
    return Settings(database=sqlite_url, warm_planner=False, planning_lease_s=3.0, cache_ttl_s=1.0)


@pytest.fixture
def make_client() -> Iterator[Callable[[Settings], TestClient]]:
    """Build TestClients (lifespan entered) for given settings; closed at teardown."""
    clients: list[TestClient] = []

    def make(settings: Settings) -> TestClient:
        client = TestClient(create_app(settings))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in reversed(clients):
        client.__exit__(None, None, None)


@pytest.fixture
def client(settings: Settings, make_client: Callable[[Settings], TestClient]) -> TestClient:
    return make_client(settings)


@dataclass
class Job:
    """A created job and helpers to drive it through the API."""

    client: TestClient
    job_id: str
    token: str
    stages: int
    data_parallel: int
    tensor_parallel: int

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def url(self, suffix: str = "") -> str:
        return f"/v1/jobs/{self.job_id}{suffix}"

    def rank_of(self, stage: int, dp: int, tp: int = 0) -> int:
        return (dp * self.stages + stage) * self.tensor_parallel + tp

    def register_all(self, clocks: list[int]) -> None:
        for dp in range(self.data_parallel):
            for stage in range(self.stages):
                for tp in range(self.tensor_parallel):
                    r = self.client.post(
                        self.url("/ranks"),
                        json={
                            "rank": self.rank_of(stage, dp, tp),
                            "stage": stage,
                            "data_parallel_rank": dp,
                            "tensor_parallel_rank": tp,
                            "gpu_name": "NVIDIA H200",
                            "supported_clocks_mhz": clocks,
                        },
                        headers=self.auth,
                    )
                    assert r.status_code == 200, r.text

    def report_all(self, rows: ProfileRows, replicas: range | None = None) -> dict[str, Any]:
        last: dict[str, Any] = {}
        for dp in replicas if replicas is not None else range(self.data_parallel):
            for stage in range(self.stages):
                for tp in range(self.tensor_parallel):
                    r = self.client.post(
                        self.url("/profiles"),
                        json={
                            "rank": self.rank_of(stage, dp, tp),
                            "stage": stage,
                            "rows": rows[stage],
                        },
                        headers=self.auth,
                    )
                    assert r.status_code == 200, r.text
                    last = r.json()
        return last

    def wait_plan(self, rank: int = 0, etag: str | None = None, wait_s: float = 60.0) -> Any:
        headers = dict(self.auth)
        if etag is not None:
            headers["If-None-Match"] = etag
        return self.client.get(
            self.url("/plan"), params={"rank": rank, "wait_s": wait_s}, headers=headers
        )

    def view(self) -> dict[str, Any]:
        r = self.client.get(self.url(), headers=self.auth)
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()
        return result


# The job the tests create unless they say otherwise (4 stages x 2 replicas).
JOB_SPEC: dict[str, Any] = {
    "schedule": "1f1b",
    "stages": 4,
    "microbatches": 4,
    "data_parallel": 2,
    "tensor_parallel": 1,
    "p_block_w": 100.0,
}


def create_job(client: TestClient, headers: dict[str, str] | None = None, **spec: Any) -> Job:
    body: dict[str, Any] = {**JOB_SPEC, **spec}
    r = client.post("/v1/jobs", json=body, headers=headers or {})
    assert r.status_code == 201, r.text
    return Job(
        client,
        r.json()["job_id"],
        r.json()["token"],
        body["stages"],
        body["data_parallel"],
        body["tensor_parallel"],
    )


@pytest.fixture
def ready_job(client: TestClient, example_rows: ProfileRows) -> Job:
    """A 4-stage x 2-replica job planned on the example profile (version 1)."""
    job = create_job(client)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    r = job.wait_plan()
    assert r.status_code == 200, r.text
    return job


def loopback_socket() -> socket.socket:
    """A TCP socket bound to a free port on loopback, for ``uvicorn.Server.run(sockets=...)``.

    The server gets the socket itself, not its port number: a port looked up free and bound
    by the server later may be taken in between (by any connection's ephemeral port).
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def snapshot(job: Job) -> dict[str, Any]:
    """The job's view without its telemetry: what a refused request must leave unchanged."""
    view = job.view()
    view.pop("telemetry")
    return view


def rank_body(rank: int = 0, **change: Any) -> dict[str, Any]:
    """A registration of ``rank`` at stage 0 of replica 0 (``change`` replaces fields)."""
    body: dict[str, Any] = {
        "rank": rank,
        "stage": 0,
        "data_parallel_rank": 0,
        "tensor_parallel_rank": 0,
        "gpu_name": "NVIDIA H200",
        "supported_clocks_mhz": [1980, 1000],
    }
    body.update(change)
    return body


def small_profile_rows(**change: Any) -> list[dict[str, Any]]:
    """Four wire rows at the clocks of :func:`rank_body`; ``change`` replaces fields of the
    second row."""
    rows = [
        {"instruction": "forward", "frequency_mhz": 1980, "time_s": 0.01, "energy_j": 5.0},
        {"instruction": "backward", "frequency_mhz": 1980, "time_s": 0.02, "energy_j": 10.0},
        {"instruction": "forward", "frequency_mhz": 1000, "time_s": 0.015, "energy_j": 4.0},
        {"instruction": "backward", "frequency_mhz": 1000, "time_s": 0.03, "energy_j": 8.0},
    ]
    rows[1] = {**rows[1], **change}
    return rows


def report_iterations(
    job: Job, iterations: range, time_of: Callable[[int], float], version: int | None = None
) -> None:
    """Every rank of every replica reports each iteration, replica ``dp`` at ``time_of(dp)``."""
    for it in iterations:
        for dp in range(job.data_parallel):
            for stage in range(job.stages):
                r = job.client.post(
                    job.url("/iterations"),
                    json={
                        "rank": job.rank_of(stage, dp),
                        "iteration": it,
                        "time_s": time_of(dp),
                        "energy_j": 100.0,
                        "plan_version": version,
                    },
                    headers=job.auth,
                )
                assert r.status_code == 200, r.text


# ----------------------------------------------------------------------------- job states

# Every module that moves a job's state, through perseus.core.jobs.transition.
MOVERS = (
    "perseus.server.lifecycle.jobs",
    "perseus.server.lifecycle.lease",
    "perseus.server.lifecycle.choices",
    "perseus.server.store.transaction",
)

Moves = list[tuple[str, JobState]]


@pytest.fixture(autouse=True)
def state_moves(monkeypatch: pytest.MonkeyPatch) -> Iterator[Moves]:
    """Every job state move a server test makes, each checked against the table.

    An illegal move raises JobStateError inside the server, which answers it as a 409: a test
    that expects a 409 for another reason would pass over it. Recorded here, it fails the
    test whatever the server answered.
    """
    moves: Moves = []

    def recorded(current: str, to: JobState) -> JobState:
        moves.append((current, to))
        return job_states.transition(current, to)

    for module in MOVERS:
        monkeypatch.setattr(f"{module}.transition", recorded)
    yield moves
    illegal = [move for move in moves if move[1] not in TRANSITIONS.get(JobState(move[0]), ())]
    assert not illegal, f"job state moves the table does not hold: {illegal}"


# ----------------------------------------------------------------------------- the store


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    """A store with its schema on an empty database (SQLite, and PostgreSQL when set)."""
    store = Store(database_url)
    store.create_schema()
    yield store
    store.close()


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def job_spec(**change: object) -> JobCreate:
    """:data:`JOB_SPEC` as the model, ``change`` replacing fields."""
    return JobCreate.model_validate({**JOB_SPEC, **change})


def register_ranks(service: JobService, job_id: str, spec: JobCreate, clocks: list[int]) -> None:
    """Register every rank of a job without tensor parallelism, straight on the service."""
    for dp in range(spec.data_parallel):
        for stage in range(spec.stages):
            service.jobs.register_rank(
                job_id,
                RankRegistration(
                    rank=dp * spec.stages + stage,
                    stage=stage,
                    data_parallel_rank=dp,
                    tensor_parallel_rank=0,
                    gpu_name="H200",
                    supported_clocks_mhz=clocks,
                ),
            )


def report_profiles(service: JobService, job_id: str, spec: JobCreate, rows: ProfileRows) -> bool:
    """Every rank reports its stage's rows; whether the last report claimed planning."""
    claimed = False
    for dp in range(spec.data_parallel):
        for stage in range(spec.stages):
            report = ProfileReport(
                rank=dp * spec.stages + stage,
                stage=stage,
                rows=[ProfileRow.model_validate(r) for r in rows[stage]],
            )
            _, _, claimed = service.lease.add_profile(job_id, report)
    return claimed
