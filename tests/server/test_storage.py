"""Storage faults of the SQLite store (issue 24 item 5): the process survives, writes and
/healthz answer 503 naming the file, and all recovers once the storage does.

Tests run as root here, and root ignores file modes; a read-only filesystem it does not
ignore. So the end-to-end test makes one file read-only with a read-only bind mount of it
(a tmpfs holds the database), as a filesystem remounted read-only would; it is skipped
where mounting is not allowed. The store's own test injects the check instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from perseus.server.app import create_app
from perseus.server.settings import Settings
from perseus.server.store.job_store import Store
from perseus.server.store.storage import StorageFault, StorageProblem, storage_problem

from .conftest import ProfileRows, clocks_of, create_job

BODY = {
    "schedule": "1f1b",
    "stages": 1,
    "microbatches": 2,
    "data_parallel": 1,
    "tensor_parallel": 1,
}


def _sh(command: str) -> bool:
    return subprocess.run(command, shell=True, capture_output=True).returncode == 0


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "fs"
    where.mkdir()
    if shutil.which("mount") is None or not _sh(f"mount -t tmpfs none {where}"):
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        yield where
    finally:
        _sh(f"umount -l {where}")


@pytest.mark.parametrize("suffix", ["-shm", "-wal", ""], ids=["shm", "wal", "main"])
def test_a_read_only_database_file_answers_503_and_recovers(tmpfs: Path, suffix: str) -> None:
    db = tmpfs / "perseus.db"
    settings = Settings(database=f"sqlite:///{db}", warm_planner=False)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/jobs", json=BODY).status_code == 201
        target = f"{db}{suffix}"
        assert _sh(f"mount --bind {target} {target} && mount -o remount,ro,bind {target}")
        try:
            refused = client.post("/v1/jobs", json=BODY)
            assert refused.status_code == 503
            assert refused.json()["error"] == "StorageFault"
            assert f"{target} is read-only" in refused.json()["detail"]
            assert refused.headers["Retry-After"] == "5"
            health = client.get("/healthz")
            assert health.status_code == 503
            assert health.json() == {
                "status": "storage-fault",
                "storage": f"{target} is read-only (file mode or read-only filesystem)",
            }
        finally:
            assert _sh(f"umount {target}")
        deadline = time.monotonic() + 10
        while client.get("/healthz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert client.post("/v1/jobs", json=BODY).status_code == 201
        assert len(client.get("/v1/jobs").json()["jobs"]) == 2


def test_the_store_refuses_writes_while_its_check_finds_a_fault(tmp_path: Path) -> None:
    db = tmp_path / "perseus.db"
    problem: list[StorageProblem] = []
    store = Store(
        f"sqlite:///{db}",
        storage_check=lambda path: problem[0] if problem else storage_problem(path),
    )
    try:
        store.create_schema()
        assert store.fault is None
        problem.append(StorageProblem(f"{db}-shm is read-only", maps=True))
        with pytest.raises(StorageFault, match="-shm is read-only"), store.write():
            pass
        assert store.fault == f"{db}-shm is read-only"
        assert store.probe_storage() is not None
        problem.clear()
        assert store.probe_storage() is None and store.fault is None
        with store.write() as tx:
            assert tx.count_jobs() == 0
    finally:
        store.close()


def test_the_check_names_an_unwritable_directory(tmp_path: Path) -> None:
    db = tmp_path / "perseus.db"
    assert storage_problem(str(db)) is None
    said = storage_problem(str(db), writable=lambda p: p != str(tmp_path))
    assert said is not None and "directory" in said.message and said.maps
    db.write_bytes(b"")
    said = storage_problem(str(db), writable=lambda p: p != str(db))
    assert said is not None and not said.maps


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    if shutil.which("mount") is None or not _sh(f"mount -t tmpfs -o size=8m none {where}"):
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        yield where
    finally:
        _sh(f"umount -l {where}")


def test_a_full_disk_while_a_frontier_is_stored_is_temporary(
    small_tmpfs: Path, example_rows: ProfileRows, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills while the job plans: storing its frontier (~260 KB of WAL) fails with
    "database or disk is full", while smaller writes (a heartbeat, marking the job failed)
    still fit. That once failed the job for good; now the frontier is stored once there is
    room again, and the job is ready with its first plan."""
    db = small_tmpfs / "perseus.db"
    filler = small_tmpfs / "filler"
    # A long lease: few heartbeats while the disk is full (each takes a few KB of the room).
    settings = Settings(database=f"sqlite:///{db}", warm_planner=False, planning_lease_s=30.0)
    with (
        TestClient(create_app(settings)) as client,
        caplog.at_level(logging.WARNING, logger="perseus.server"),
    ):
        job = create_job(client)
        job.register_all(clocks_of(example_rows))
        job.report_all(example_rows)  # the last profile claims the job's planning
        room = os.statvfs(small_tmpfs)
        filler.write_bytes(bytes(room.f_bavail * room.f_frsize - 96 * 1024))
        deadline = time.monotonic() + 300
        while "storing the frontier failed" not in caplog.text:
            assert job.view()["state"] == "planning", job.view()["reason"]
            assert time.monotonic() < deadline, "the frontier was never stored"
            time.sleep(0.2)
        assert "database or disk is full" in caplog.text
        filler.unlink()
        r = job.wait_plan(wait_s=60)
        assert r.status_code == 200, r.text
        assert r.headers["etag"] == '"1"'
        view = job.view()
        assert (view["state"], view["reason"], view["version"]) == ("ready", None, 1)
