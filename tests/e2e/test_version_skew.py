"""Ranks and planners of different versions: an earlier commit's rank against this tree's
server, and this tree's rank against that commit's server, both follow their plans.

The earlier commit is unpacked from the repository's git (``git archive``) and run in
processes of its own, its folder first on ``PYTHONPATH``; the test skips where git or the
commit is not at hand. Each run is one rank of a one-stage 1F1B job with a saved profile (no
sweep), on the fake GPU, against a real server (uvicorn) on loopback.

:data:`EARLIER` is the last commit whose rank refuses answers with fields it does not know
(later ranks ignore them): this tree's server must not add a field to an answer such a rank
reads (``JobView``, ``RankRegistered``, ``ProfileAccepted``, ``PlanResponse``,
``IterationAccepted``, ``GaveUpAccepted``) for as long as those ranks are to be served.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import REPO, LiveServer
from .pipelines import create_job, plan_of

pytestmark = pytest.mark.slow

EARLIER = "6c57201"
"""The earlier version: the commit before the folder regroup, the last strict rank."""

PLANNED_ITERATIONS = 6
EXAMPLE_PROFILE = Path(str(resources.files("perseus") / "data" / "example_profile.csv"))
RANK_SCRIPT = Path(__file__).with_name("skew_rank.py")


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The earlier commit's ``perseus`` package, unpacked; skips without git or the commit."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    found = subprocess.run(
        [git, "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{EARLIER}^{{commit}}"],
        capture_output=True,
    )
    if found.returncode != 0:
        pytest.skip(f"commit {EARLIER} is not in this clone's history")
    archive = subprocess.run(
        [git, "-C", str(REPO), "archive", EARLIER, "perseus"], capture_output=True, check=True
    )
    root = tmp_path_factory.mktemp(f"perseus-{EARLIER}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[LiveServer]]:
    started: list[LiveServer] = []
    yield started
    for server in started:
        server.stop()


def _server(root: Path, tmp_path: Path, servers: list[LiveServer]) -> LiveServer:
    server = LiveServer(
        f"sqlite:///{tmp_path / 'perseus.db'}",
        tmp_path / "server.log",
        {"PERSEUS_WARM_PLANNER": "false", "PYTHONPATH": str(root)},
        root=root,
    )
    server.start()
    servers.append(server)
    return server


def _forward_backward_profile(path: Path) -> Path:
    """Stage 0's forward and backward rows of the example profile: a profile every version
    uploads (ranks before the split-backward fix sent the halves as more backwards)."""
    with EXAMPLE_PROFILE.open() as file:
        rows = [
            row
            for row in csv.DictReader(file)
            if row["stage"] == "0" and row["instruction"] in ("forward", "backward")
        ]
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _run_rank(root: Path, server: LiveServer, job: str, token: str, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env.update(
        PYTHONPATH=str(root),
        PERSEUS_SERVER=server.url,
        PERSEUS_JOB=job,
        PERSEUS_TOKEN=token,
        PERSEUS_GPU="fake",
        PERSEUS_PROFILE=str(_forward_backward_profile(tmp_path / "profile.csv")),
        PERSEUS_CLOCK_LOG=str(tmp_path / "clocks"),
        PERSEUS_POLL_WAIT_S="2",
    )
    done = subprocess.run(
        [sys.executable, str(RANK_SCRIPT), str(PLANNED_ITERATIONS), "150"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def _planned_iterations(tmp_path: Path, version: int) -> list[list[tuple[Any, ...]]]:
    by_iteration: dict[int, list[tuple[Any, ...]]] = {}
    for line in (tmp_path / "clocks" / "rank0.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["plan_version"] == version:
            by_iteration.setdefault(entry["iteration"], []).append(
                (entry["instruction"], entry["microbatch"], entry["frequency_mhz"])
            )
    return list(by_iteration.values())


@pytest.mark.parametrize(
    ("rank_side", "server_side"),
    [("earlier", "today"), ("today", "earlier")],
    ids=[f"{EARLIER}-rank-today-server", f"today-rank-{EARLIER}-server"],
)
def test_a_rank_and_a_planner_of_different_versions_follow_plans(
    rank_side: str,
    server_side: str,
    earlier: Path,
    servers: list[LiveServer],
    tmp_path: Path,
) -> None:
    roots = {"earlier": earlier, "today": REPO}
    server = _server(roots[server_side], tmp_path, servers)
    job, token = create_job(
        server, schedule="1f1b", stages=1, microbatches=2, p_block_w=80.0, name="skew"
    )
    output = _run_rank(roots[rank_side], server, job, token, tmp_path)

    assert f"planned={PLANNED_ITERATIONS} failure=None" in output, output[-4000:]
    plan = plan_of(server, job, token, 0)
    expected = [
        (i["instruction"], i["microbatch"], i["frequency_mhz"]) for i in plan["instructions"]
    ]
    ran = _planned_iterations(tmp_path, plan["version"])
    assert len(ran) >= PLANNED_ITERATIONS - 1  # the last may be cut short by close()
    assert all(iteration == expected for iteration in ran[:-1]), (ran, expected)
    view = httpx.get(
        f"{server.url}/v1/jobs/{job}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).json()
    assert view["state"] == "ready" and view.get("gave_up", []) == [], view
