"""The plan fetch (perseus.server.api.plan_fetch): ETags, long polls, the query's memo."""

from __future__ import annotations

import asyncio
import gc
import shutil
import sqlite3
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from perseus.schemas import PLAN_PATH
from perseus.server.api.plan_fetch import PlanFastPath
from perseus.server.app import create_app
from perseus.server.settings import Settings

from .conftest import Job, ProfileRows, clocks_of, create_job


def test_plan_etag_gives_304_and_policy_makes_a_new_version(ready_job: Job) -> None:
    r = ready_job.wait_plan(etag='"1"', wait_s=0)
    assert r.status_code == 304
    assert r.headers["etag"] == '"1"'
    put = ready_job.client.put(
        ready_job.url("/policy"), json={"kind": "min-energy"}, headers=ready_job.auth
    )
    assert put.status_code == 200, put.text
    assert put.json()["version"] == 2
    r = ready_job.wait_plan(etag='"1"', wait_s=0)
    assert r.status_code == 200
    assert r.headers["etag"] == '"2"'
    frontier = ready_job.client.get(ready_job.url("/frontier"), headers=ready_job.auth).json()
    assert frontier["chosen_index"] == len(frontier["points"]) - 1
    assert ready_job.view()["policy"] == {"kind": "min-energy"}


def test_long_poll_wakes_on_a_new_version(ready_job: Job) -> None:
    result: dict[str, Any] = {}

    def poll() -> None:
        r = ready_job.wait_plan(etag='"1"', wait_s=30)
        result["status"] = r.status_code
        result["etag"] = r.headers.get("etag")

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)
    ready_job.client.put(
        ready_job.url("/policy"),
        json={"kind": "max-slowdown", "factor": 1.1},
        headers=ready_job.auth,
    )
    thread.join(60)
    assert result["status"] == 200
    assert result["etag"] == '"2"'


def test_long_poll_times_out_with_304(ready_job: Job) -> None:
    r = ready_job.wait_plan(etag='"1"', wait_s=0.3)
    assert r.status_code == 304
    assert r.headers["etag"] == '"1"'


def test_if_none_match_names_the_versions_the_rank_has(ready_job: Job) -> None:
    for if_none_match, status in (
        ('"1"', 304),
        ('W/"1"', 304),  # a proxy may weaken the tag
        ('"0", "1"', 304),
        ("*", 304),
        ('"0"', 200),
        ('"x1"', 200),  # names no version: the plan
    ):
        headers = {**ready_job.auth, "If-None-Match": if_none_match}
        r = ready_job.client.get(ready_job.url("/plan"), params={"rank": 0}, headers=headers)
        assert r.status_code == status, if_none_match
        assert r.headers["etag"] == '"1"'


def test_a_restored_backup_sends_its_plan_to_ranks_on_a_version_it_never_issued(
    settings: Settings, example_rows: ProfileRows, tmp_path: Path
) -> None:
    """Back up at plan v1 while the ranks run v3, restore: the ranks' "3" names no plan of
    the restored database. They once got 304 for ever (the restored job's v2 and v3 too)."""
    database = Path(settings.database.removeprefix("sqlite:///"))
    backup = tmp_path / "backup.db"
    with TestClient(create_app(settings)) as client:
        job = create_job(client)
        job.register_all(clocks_of(example_rows))
        job.report_all(example_rows)
        assert job.wait_plan().headers["etag"] == '"1"'
        with sqlite3.connect(database) as source, sqlite3.connect(backup) as copy:
            source.backup(copy)
        for factor in (1.05, 1.1):
            put = client.put(job.url("/policy"), json=_slowdown(factor), headers=job.auth)
            assert put.status_code == 200, put.text
        assert job.wait_plan(etag='"3"', wait_s=0).status_code == 304
    for suffix in ("", "-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, database)

    with TestClient(create_app(settings)) as client:
        job.client = client
        r = job.wait_plan(etag='"3"', wait_s=0)
        assert (r.status_code, r.headers["etag"]) == (200, '"1"')
        put = client.put(job.url("/policy"), json=_slowdown(1.2), headers=job.auth)
        assert put.json()["version"] == 2
        for etag, wait_s in (('"3"', 0.0), ('"3"', 5.0), ('"1", "3"', 0.0)):
            r = job.wait_plan(etag=etag, wait_s=wait_s)
            assert (r.status_code, r.headers["etag"]) == (200, '"2"'), etag
            assert r.json()["version"] == 2
        assert job.wait_plan(etag='"2", "3"', wait_s=0).status_code == 304


def _slowdown(factor: float) -> dict[str, Any]:
    return {"kind": "max-slowdown", "factor": factor}


def test_bad_plan_query_is_422(ready_job: Job) -> None:
    for params in (
        {"rank": -1},
        {"rank": 0, "wait_s": -1},
        {},
        {"rank": 0, "wait_s": "inf"},
        {"rank": 0, "wait": 30},
    ):
        r = ready_job.client.get(ready_job.url("/plan"), params=params, headers=ready_job.auth)
        assert r.status_code == 422, params


def test_long_plan_queries_are_not_remembered() -> None:
    # Issue 24: the fast path's memo of query strings held 16,384 of any length (~15 KB
    # each from an unauthenticated client: 240 MB). A query the model rejects goes on to the
    # FastAPI route (which answers 422) and, when long, is not remembered.
    passed_on: list[int] = []

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        passed_on.append(len(scope["query_string"]))

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        raise AssertionError(f"the fast path answered {message}")

    fast = PlanFastPath(route)
    path = PLAN_PATH.replace("{job_id}", "0" * 32)

    async def fetch_many() -> None:
        for i in range(100):
            query = b"rank=0&wait_s=1&pad=" + b"%d" % i + b"x" * 15_000
            scope = {"type": "http", "method": "GET", "path": path, "query_string": query}
            await fast({**scope, "headers": []}, receive, send)

    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        asyncio.run(fetch_many())
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(passed_on) == 100
    assert after - before < 300_000  # 100 remembered queries would hold 1.5 MB
