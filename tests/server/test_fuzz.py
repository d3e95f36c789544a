"""Fuzzing: schemathesis against the OpenAPI spec of a live server, with all its checks.

Every answer must be documented: its status among the operation's responses, its body
the documented schema ({detail, error} on every 4xx), 405s with ``Allow``; no 5xx.

Operations under a job get the id and token of a real, planned job (so the generated
bodies reach the job logic, not just the 404 path); deleting uses generated ids.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings

from perseus.server.app import create_app
from perseus.server.settings import Settings

from .conftest import clocks_of, loopback_socket, read_profile_rows

# A schema-valid request may still break a rule no schema can state (a rank outside the
# job's layout, an infeasible deadline): the documented 422, not a contract breach.
_CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "3xx", "401", "403", "404", "409", "422"]
            }
        }
    }
)
schema = schemathesis.openapi.from_dict(
    create_app(Settings(database="sqlite://")).openapi(), config=_CONFIG
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server in a thread with one planned job: ``{url, job_id, token}``."""
    database = tmp_path_factory.mktemp("fuzz") / "perseus.db"
    app = create_app(Settings(database=f"sqlite:///{database}", warm_planner=False, max_wait_s=0.2))
    sock = loopback_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        rows = read_profile_rows(Path(path))
    with httpx.Client(base_url=url, timeout=60) as c:
        body = {"schedule": "1f1b", "stages": 4, "microbatches": 4, "data_parallel": 1,
                "tensor_parallel": 1, "p_block_w": 100.0}  # fmt: skip
        created = c.post("/v1/jobs", json=body).json()
        job_id, token = created["job_id"], created["token"]
        auth = {"Authorization": f"Bearer {token}"}
        for stage in range(4):
            reg = {"rank": stage, "stage": stage, "data_parallel_rank": 0,
                   "tensor_parallel_rank": 0, "gpu_name": "H200",
                   "supported_clocks_mhz": clocks_of(rows)}  # fmt: skip
            assert c.post(f"/v1/jobs/{job_id}/ranks", json=reg, headers=auth).status_code == 200
            prof = {"rank": stage, "stage": stage, "rows": rows[stage]}
            assert c.post(f"/v1/jobs/{job_id}/profiles", json=prof, headers=auth).status_code == 200
        # Planning runs in a process at the lowest CPU priority: slow on a busy host.
        deadline = time.monotonic() + 120
        r = c.get(f"/v1/jobs/{job_id}/plan", params={"rank": 0, "wait_s": 0.2}, headers=auth)
        while r.status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
            r = c.get(f"/v1/jobs/{job_id}/plan", params={"rank": 0}, headers=auth)
        assert r.status_code == 200, r.text
    yield {"url": url, "job_id": job_id, "token": token}
    server.should_exit = True
    thread.join(30)


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_answers_follow_the_contract(case: schemathesis.Case, live: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {live['token']}"}
    if "job_id" in (case.path_parameters or {}) and not (
        case.method == "DELETE" and case.path == "/v1/jobs/{job_id}"
    ):
        case.path_parameters = {**case.path_parameters, "job_id": live["job_id"]}
    response = case.call(base_url=live["url"], headers=headers, timeout=30)
    case.validate_response(response)
