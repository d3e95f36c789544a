"""End to end: a real planner server on loopback and simulated ranks of an 8-stage job.

32 ranks (8 stages x 4 data-parallel replicas) register, report the real profile of their
stage (each replica with its own measurement noise), long-poll for their plan, then follow
the plan versions as the policy and a straggler change.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from perseus.solver import load_profile, profile_to_json

from .conftest import SHARED, LiveServer

PROFILE = Path(os.environ.get("PERSEUS_TEST_PROFILES") or SHARED / "data" / "profiles") / (
    "bloom+a100_sxm_bf16.csv"
)
P_BLOCK_W = 83.64
STAGES = 8
REPLICAS = 4
MICROBATCHES = 12


def _stage_rows(path: Path) -> dict[int, list[dict[str, Any]]]:
    rows: dict[int, list[dict[str, Any]]] = {}
    for row in profile_to_json(load_profile(path))["rows"]:
        rows.setdefault(row.pop("stage"), []).append(row)
    return rows


def _noisy(rows: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            **r,
            "time_s": r["time_s"] * rng.uniform(0.99, 1.01),
            "energy_j": r["energy_j"] * rng.uniform(0.99, 1.01),
        }
        for r in rows
    ]


class Rank:
    """One simulated rank: registers, reports its profile, follows its plan's versions."""

    def __init__(
        self, client: httpx.AsyncClient, job_id: str, token: str, stage: int, dp: int
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.headers = {"Authorization": f"Bearer {token}"}
        self.stage = stage
        self.dp = dp
        self.rank = dp * STAGES + stage
        self.plans: list[dict[str, Any]] = []

    async def register(self, clocks: list[int]) -> None:
        r = await self.client.post(
            f"/v1/jobs/{self.job_id}/ranks",
            json={
                "rank": self.rank,
                "stage": self.stage,
                "data_parallel_rank": self.dp,
                "tensor_parallel_rank": 0,
                "gpu_name": "NVIDIA A100-SXM4-40GB",
                "supported_clocks_mhz": clocks,
            },
            headers=self.headers,
        )
        assert r.status_code == 200, r.text

    async def report(self, rows: list[dict[str, Any]]) -> None:
        r = await self.client.post(
            f"/v1/jobs/{self.job_id}/profiles",
            json={"rank": self.rank, "stage": self.stage, "rows": rows},
            headers=self.headers,
        )
        assert r.status_code == 200, r.text

    async def next_plan(self) -> dict[str, Any]:
        """Long-poll until a plan newer than the last one arrives."""
        headers = dict(self.headers)
        if self.plans:
            headers["If-None-Match"] = f'"{self.plans[-1]["version"]}"'
        while True:
            r = await self.client.get(
                f"/v1/jobs/{self.job_id}/plan",
                params={"rank": self.rank, "wait_s": 20},
                headers=headers,
            )
            if r.status_code == 200:
                plan: dict[str, Any] = r.json()
                assert r.headers["etag"] == f'"{plan["version"]}"'
                self.plans.append(plan)
                return plan
            assert r.status_code in (304, 409), r.text
            if r.status_code == 409:
                assert r.json()["state"] in ("registering", "profiling", "planning"), r.text
                await asyncio.sleep(0.2)

    async def iterate(self, iteration: int, slowdown: float) -> None:
        plan = self.plans[-1]
        r = await self.client.post(
            f"/v1/jobs/{self.job_id}/iterations",
            json={
                "rank": self.rank,
                "iteration": iteration,
                "time_s": plan["time_s"] * slowdown,
                "energy_j": plan["energy_j"] / STAGES,
                "plan_version": plan["version"],
            },
            headers=self.headers,
        )
        assert r.status_code == 200, r.text


async def _drive(url: str) -> None:
    rows = _stage_rows(PROFILE)
    clocks = sorted({r["frequency_mhz"] for r in rows[0]})
    rng = random.Random(7)
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        r = await client.post(
            "/v1/jobs",
            json={
                "name": "bloom e2e",
                "schedule": "1f1b",
                "stages": STAGES,
                "microbatches": MICROBATCHES,
                "data_parallel": REPLICAS,
                "tensor_parallel": 1,
                "p_block_w": P_BLOCK_W,
            },
        )
        assert r.status_code == 201, r.text
        job_id, token = r.json()["job_id"], r.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        ranks = [Rank(client, job_id, token, s, d) for d in range(REPLICAS) for s in range(STAGES)]

        async def gather(make: Callable[[Rank], Any]) -> list[Any]:
            return list(await asyncio.gather(*(make(rank) for rank in ranks)))

        await gather(lambda rank: rank.register(clocks))
        # Ranks wait for their first plan while the others still report.
        first = [asyncio.ensure_future(rank.next_plan()) for rank in ranks]
        await gather(lambda rank: rank.report(_noisy(rows[rank.stage], rng)))
        plans = await asyncio.gather(*first)
        assert {p["version"] for p in plans} == {1}
        for rank, plan in zip(ranks, plans, strict=True):
            assert plan["stage"] == rank.stage
            assert len(plan["instructions"]) == 2 * MICROBATCHES
            assert {i["frequency_mhz"] for i in plan["instructions"]} <= set(clocks)
        view = (await client.get(f"/v1/jobs/{job_id}", headers=auth)).json()
        assert view["state"] == "ready"
        assert view["counts"] == {
            "ranks_expected": 32,
            "ranks_registered": 32,
            "profiles_reported": 32,
            "stages_profiled": 8,
            "iterations_reported": 0,
            "iterations": 0,
        }
        baseline = view["chosen"]

        for it in range(3):
            await gather(lambda rank, it=it: rank.iterate(it, 1.0))
        view = (await client.get(f"/v1/jobs/{job_id}", headers=auth)).json()
        assert view["telemetry"]["measured_time_s"] == pytest.approx(baseline["time_s"])
        assert view["telemetry"]["predicted_time_s"] == pytest.approx(baseline["time_s"])

        async def change(method: str, path: str, body: Any, version: int) -> list[dict[str, Any]]:
            waiting = [asyncio.ensure_future(rank.next_plan()) for rank in ranks]
            await asyncio.sleep(0.2)
            r = await client.request(method, f"/v1/jobs/{job_id}{path}", json=body, headers=auth)
            assert r.status_code == 200, r.text
            assert r.json()["version"] == version
            seen = await asyncio.gather(*waiting)
            assert {p["version"] for p in seen} == {version}
            return seen

        slower = await change("PUT", "/policy", {"kind": "max-slowdown", "factor": 1.1}, 2)
        # the factor is of the default plan's time, which the no-slowdown plan may beat
        reference = (await client.get(f"/v1/jobs/{job_id}/frontier", headers=auth)).json()[
            "baselines"
        ]["default"]["time_s"]
        assert baseline["time_s"] <= reference * (1 + 1e-9)
        assert baseline["time_s"] < slower[0]["time_s"] <= 1.1 * reference * (1 + 1e-9)
        assert slower[0]["energy_j"] < baseline["energy_j"]
        straggling = await change("PUT", "/straggler", {"slowdown": 1.2}, 3)
        assert straggling[0]["time_s"] > slower[0]["time_s"]
        assert straggling[0]["energy_j"] < slower[0]["energy_j"]
        back = await change("DELETE", "/straggler", None, 4)
        assert back[0]["time_s"] == pytest.approx(slower[0]["time_s"])
        for rank in ranks:
            assert [p["version"] for p in rank.plans] == [1, 2, 3, 4]

        frontier = (await client.get(f"/v1/jobs/{job_id}/frontier", headers=auth)).json()
        assert len(frontier["points"]) > 10
        assert frontier["baselines"]["all_fastest"]["energy_j"] >= frontier["points"][0]["energy_j"]
        metrics = (await client.get("/metrics")).text
        assert 'route="/v1/jobs/{job_id}/plan",status="200"} ' in metrics
        assert 'perseus_jobs{state="ready"} 1' in metrics


@pytest.mark.skipif(not PROFILE.is_file(), reason="shared profiles not present")
def test_simulated_ranks_follow_policy_and_straggler(
    live_server: Callable[..., LiveServer],
) -> None:
    server = live_server()
    asyncio.run(_drive(server.url))


@pytest.mark.skipif(not PROFILE.is_file(), reason="shared profiles not present")
@pytest.mark.skipif(
    not os.environ.get("PERSEUS_TEST_POSTGRES_URL"), reason="PERSEUS_TEST_POSTGRES_URL is not set"
)
def test_two_workers_share_postgresql(live_server: Callable[..., LiveServer]) -> None:
    from perseus.server.store.job_store import Store

    url = os.environ["PERSEUS_TEST_POSTGRES_URL"]
    store = Store(url)
    store.drop_schema()
    store.close()
    server = live_server(database=url, workers="2", cache_ttl_s="0.2")
    asyncio.run(_drive(server.url))
