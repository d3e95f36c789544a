"""Schema migrations: a database made before migrations is adopted with its data, a new one
is created at head, the revisions end at the tables ``store.py`` uses, errors name the
database. SQLite always, PostgreSQL when ``PERSEUS_TEST_POSTGRES_URL`` is set."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect

from perseus.core.errors import StoreError
from perseus.server.settings import Settings
from perseus.server.store.alembic import VERSION_TABLE
from perseus.server.store.job_store import Store, metadata, normalize_database_url
from perseus.server.store.migrations import current_revision, head_revision, upgrade_database

DATA = Path(__file__).parent / "data"
ROWS = DATA / "pre_alembic_rows.sql"
# The job in pre_alembic_rows.sql and its token (from the file's header).
JOB_ID, TOKEN = re.findall(r"^-- job (\w+), token (\S+)$", ROWS.read_text(), re.M)[0]


def _statements(path: Path) -> list[str]:
    body = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("--"))
    return [s.strip() for s in re.split(r";\s*$", body, flags=re.M) if s.strip()]


def _make_pre_migration_database(url: str, *, without_host: bool = False) -> None:
    """The tables and a planned job exactly as perseus wrote them before migrations."""
    engine = create_engine(normalize_database_url(url))
    schema = DATA / f"pre_alembic_{engine.dialect.name}.sql"
    with engine.begin() as connection:
        for statement in _statements(schema) + _statements(ROWS):
            connection.exec_driver_sql(statement)
        if without_host:  # as the first release made them
            connection.exec_driver_sql("ALTER TABLE perseus_ranks DROP COLUMN host")
    engine.dispose()


def test_a_new_database_is_created_at_head(database_url: str) -> None:
    engine = create_engine(normalize_database_url(database_url))
    engine.connect().close()  # an empty SQLite file exists now
    engine.dispose()
    assert current_revision(database_url) is None
    assert upgrade_database(database_url) == head_revision()
    assert current_revision(database_url) == head_revision()
    assert upgrade_database(database_url) == head_revision()  # again: nothing to do


@pytest.mark.parametrize("without_host", [False, True], ids=["latest", "first-release"])
def test_a_pre_migration_database_keeps_its_data(database_url: str, without_host: bool) -> None:
    _make_pre_migration_database(database_url, without_host=without_host)
    assert current_revision(database_url) is None
    store = Store(database_url)
    try:
        assert store.create_schema() == head_revision()  # what perseus serve does at start
        assert current_revision(database_url) == head_revision()
        with store.read() as tx:
            job = tx.job(JOB_ID)
            assert job is not None
            assert (job.name, job.state, job.version) == ("before alembic", "ready", 1)
            assert job.ranks_registered == 4
            ranks = tx.ranks(JOB_ID)
            assert [r.rank for r in ranks] == [0, 1, 2, 3]
            assert ranks[0].supported_clocks_mhz == (1005, 1500, 1980)
            assert ranks[0].recent_times_s == (1.25,)
            assert ranks[0].host == (None if without_host else "testclient")
            # 0005: no rank reported a clock-change latency, no frontier was planned for one.
            assert tx.clock_latency(JOB_ID) is None and job.clock_delay_rank is None
            profiles = tx.profiles(JOB_ID)
            assert len(profiles) == 4
            assert profiles[0].rows[0] == ("forward", 1980, 0.0540296, 28.8431)
            frontier = tx.frontier(JOB_ID)
            assert frontier is not None
            assert frontier.data.startswith('{"format":"perseus.frontier/1"')
    finally:
        store.close()


def test_the_server_serves_a_pre_migration_database(
    sqlite_url: str, make_client: Callable[[Settings], TestClient]
) -> None:
    _make_pre_migration_database(sqlite_url)
    client = make_client(Settings(database=sqlite_url, warm_planner=False))
    r = client.get(f"/v1/jobs/{JOB_ID}/plan", params={"rank": 2},
                   headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 1
    assert current_revision(sqlite_url) == head_revision()


def test_the_revisions_end_at_the_store_tables(database_url: str) -> None:
    upgrade_database(database_url)
    engine = create_engine(normalize_database_url(database_url))
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        assert compare_metadata(context, metadata) == []
    engine.dispose()


def test_a_database_from_a_newer_perseus_is_refused(database_url: str) -> None:
    upgrade_database(database_url)
    engine = create_engine(normalize_database_url(database_url))
    with engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    engine.dispose()
    with pytest.raises(StoreError, match=r"revision 9999.*newer perseus"):
        upgrade_database(database_url)
    assert current_revision(database_url) == "9999"


def test_a_database_with_part_of_the_tables_is_refused(database_url: str) -> None:
    engine = create_engine(normalize_database_url(database_url))
    with engine.begin() as connection:
        metadata.tables["perseus_jobs"].create(connection)
    engine.dispose()
    with pytest.raises(StoreError, match="not perseus_frontiers"):
        upgrade_database(database_url)
    with engine.connect() as connection:  # nothing was changed
        assert set(inspect(connection).get_table_names()) == {"perseus_jobs"}
    engine.dispose()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "not a database URL"),
        ("mysql://host/db", "unsupported database mysql://host/db"),
        ("postgresql://perseus:secret@127.0.0.1:1/x", r"cannot reach or write .*:\*\*\*@127"),
    ],
)
def test_bad_urls_and_unreachable_databases_are_store_errors(url: str, message: str) -> None:
    for call in (upgrade_database, current_revision):
        with pytest.raises(StoreError, match=message):
            call(url)


def test_asking_for_the_revision_creates_no_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    with pytest.raises(StoreError, match="no SQLite database at"):
        current_revision(f"sqlite:///{path}")
    assert not path.exists()


def test_a_database_at_0001_with_data_upgrades_to_the_head(
    sqlite_url: str, make_client: Callable[[Settings], TestClient]
) -> None:
    from alembic import command

    from perseus.server.store.alembic import config

    _make_pre_migration_database(sqlite_url)
    engine = create_engine(sqlite_url)
    with engine.begin() as connection:
        command.stamp(config(connection), "0001")
    engine.dispose()
    assert current_revision(sqlite_url) == "0001"
    client = make_client(Settings(database=sqlite_url, warm_planner=False))
    assert current_revision(sqlite_url) == "0005" == head_revision()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.get(f"/v1/jobs/{JOB_ID}/plan", params={"rank": 2}, headers=auth)
    assert r.status_code == 200, r.text
    # A frontier stored before 0002 has no profile beside it: plans carry no times.
    assert all("time_s" not in ins for ins in r.json()["instructions"])
    r = client.post(f"/v1/jobs/{JOB_ID}/iterations", headers=auth,
                    json={"rank": 2, "iteration": 99, "time_s": 1.0, "energy_j": 3.0})  # fmt: skip
    assert r.status_code == 200, r.text
    view = client.get(f"/v1/jobs/{JOB_ID}", headers=auth).json()
    savings = view["savings"]
    assert savings["plan"]["iterations"] == 1 and savings["energy_j"] == 3.0
    # 0004: jobs made before weigh 1 under a budget, and no budget holds them anywhere.
    assert view.get("priority", 1.0) == 1.0 and view.get("budget") is None
    r = client.get("/v1/cluster/budget")
    assert r.status_code == 200 and r.json()["budget_w"] is None, r.text
    # 0005: the old frontier was planned for no clock-change delay, from no rank's
    # latency; a rank's measured latency plans the job again for it.
    r = client.get(f"/v1/jobs/{JOB_ID}/frontier", headers=auth)
    assert r.status_code == 200, r.text
    assert (r.json()["clock_change_delay_s"], r.json()["clock_change_delay_rank"]) == (0.0, None)
    r = client.post(f"/v1/jobs/{JOB_ID}/ranks:clock-latency", headers=auth,
                    json={"rank": 2, "clock_change_latency_s": 0.05})  # fmt: skip
    assert r.status_code == 200 and r.json()["planning"] is True, r.text
    r = client.get(f"/v1/jobs/{JOB_ID}/plan", params={"rank": 2, "wait_s": 60},
                   headers={**auth, "If-None-Match": '"1"'})  # fmt: skip
    assert r.status_code == 200 and r.json()["version"] == 2, r.text
    r = client.get(f"/v1/jobs/{JOB_ID}/frontier", headers=auth)
    assert (r.json()["clock_change_delay_s"], r.json()["clock_change_delay_rank"]) == (0.05, 2)
