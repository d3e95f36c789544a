"""The server's asynchronous machinery (perseus.server.runtime): job rows, coalesced loads."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from perseus.server.settings import Settings

from .conftest import create_job


def test_cached_jobs_are_evicted(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"cached_jobs": 16}))
    jobs = [create_job(client) for _ in range(40)]
    heads = client.app.state.perseus.heads  # type: ignore[attr-defined]
    assert heads.cached <= 16
    assert jobs[0].view()["state"] == "registering"  # read again from the database
