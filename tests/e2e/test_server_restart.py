"""Stopping the server mid-job and starting it again on the same database loses nothing.

The server is stopped gracefully (SIGTERM) while profiles are still arriving, killed
(SIGKILL) once plans are out, and killed while a frontier is being computed; each time a
new server process on the same SQLite file carries on: counts, tokens, plan versions and
ETags survive, and an interrupted computation is taken over once its lease runs out.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import httpx

from .conftest import LiveServer
from .test_server_e2e import _stage_rows

STAGES = 4
REPLICAS = 2


def test_restarts_lose_nothing_and_ranks_continue(live_server: Callable[..., LiveServer]) -> None:
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        rows = _stage_rows(path)
    clocks = sorted({r["frequency_mhz"] for r in rows[0]})
    server = live_server(planning_lease_s="2")

    def client() -> httpx.Client:
        return httpx.Client(base_url=server.url, timeout=60)

    with client() as c:
        r = c.post(
            "/v1/jobs",
            json={
                "schedule": "1f1b",
                "stages": STAGES,
                "microbatches": 8,
                "data_parallel": REPLICAS,
                "tensor_parallel": 1,
                "p_block_w": 100.0,
            },
        )
        job_id, token = r.json()["job_id"], r.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        job = f"/v1/jobs/{job_id}"
        ranks = [(d * STAGES + s, s, d) for d in range(REPLICAS) for s in range(STAGES)]
        for rank, stage, dp in ranks:
            body = {
                "rank": rank,
                "stage": stage,
                "data_parallel_rank": dp,
                "tensor_parallel_rank": 0,
                "gpu_name": "NVIDIA H200",
                "supported_clocks_mhz": clocks,
            }
            assert c.post(f"{job}/ranks", json=body, headers=auth).status_code == 200
        for rank, stage, _ in ranks[:5]:
            body = {"rank": rank, "stage": stage, "rows": rows[stage]}
            assert c.post(f"{job}/profiles", json=body, headers=auth).status_code == 200

    server.restart(signal.SIGTERM)

    def view(c: httpx.Client) -> dict[str, Any]:
        r = c.get(job, headers=auth)
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()
        return result

    def plan(c: httpx.Client, rank: int, etag: str | None = None) -> httpx.Response:
        headers = {**auth, **({"If-None-Match": etag} if etag else {})}
        return c.get(f"{job}/plan", params={"rank": rank, "wait_s": 30}, headers=headers)

    with client() as c:
        before = view(c)
        assert before["state"] == "profiling"
        assert before["counts"]["ranks_registered"] == 8
        assert before["counts"]["profiles_reported"] == 5
        # A restarted rank registers again: same coordinates, nothing changes.
        again = {
            "rank": 0,
            "stage": 0,
            "data_parallel_rank": 0,
            "tensor_parallel_rank": 0,
            "gpu_name": "NVIDIA H200",
            "supported_clocks_mhz": clocks,
        }
        assert c.post(f"{job}/ranks", json=again, headers=auth).json()["ranks_registered"] == 8
        for rank, stage, _ in ranks[5:]:
            body = {"rank": rank, "stage": stage, "rows": rows[stage]}
            assert c.post(f"{job}/profiles", json=body, headers=auth).status_code == 200
        first = {rank: plan(c, rank) for rank, _, _ in ranks}
        assert {r.headers["etag"] for r in first.values()} == {'"1"'}

    server.restart(signal.SIGKILL)

    with client() as c:
        after = view(c)
        assert after["state"] == "ready"
        assert after["version"] == 1
        assert after["chosen"] == view(c)["chosen"]
        for rank, _, _ in ranks:
            r = c.get(
                f"{job}/plan", params={"rank": rank}, headers={**auth, "If-None-Match": '"1"'}
            )
            assert r.status_code == 304
            assert plan(c, rank).json() == first[rank].json()
        assert (
            c.put(f"{job}/policy", json={"kind": "min-energy"}, headers=auth).json()["version"] == 2
        )
        assert plan(c, 0, '"1"').headers["etag"] == '"2"'
        r = c.post(f"{job}/plan:compute", headers=auth)
        assert r.status_code == 202

    # Killed while computing: the job stays "planning" with a silent owner until the lease
    # (2 s here) runs out; then the new server takes it over and plans move on.
    server.restart(signal.SIGKILL)

    with client() as c:
        started = time.monotonic()
        # The claim was stored before the 202; the kill came before any frontier could.
        assert view(c)["state"] == "planning"
        r = plan(c, 3, '"2"')
        assert r.status_code == 200, r.text
        assert r.headers["etag"] == '"3"'
        assert time.monotonic() - started < 30
        final = view(c)
        assert final["state"] == "ready"
        assert final["policy"] == {"kind": "min-energy"}
        assert final["counts"]["profiles_reported"] == 8
    assert "taking over planning" in server.log_path.read_text()
