"""Routes that show the server and its jobs (perseus.server.api.view_routes): every job's view,
a job's live activity. (/healthz: test_app, its 503 test_storage; /metrics: test_metrics;
/timeline: test_timeline.)"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from pydantic import SecretStr

from perseus.schemas import ACTIVITY_PATH, OVERVIEW_PATH, ActivityView, JobViews
from perseus.server.settings import Settings

from .conftest import ProfileRows, clocks_of, create_job


def test_the_overview_shows_every_jobs_view_oldest_first(client: TestClient) -> None:
    names = ["a", "b", "c"]
    jobs = [create_job(client, name=name) for name in names]
    views = JobViews.model_validate(client.get(OVERVIEW_PATH).json()).jobs
    assert [v.name for v in views] == names
    assert [v.job_id for v in views] == [j.job_id for j in jobs]
    assert views[0].model_dump(mode="json") == jobs[0].view()
    paged = client.get(OVERVIEW_PATH, params={"limit": 1, "offset": 1}).json()["jobs"]
    assert [v["name"] for v in paged] == ["b"]
    assert client.get(OVERVIEW_PATH, params={"limit": 0}).status_code == 422


def test_the_overview_pages_newest_first_and_counts_every_job(client: TestClient) -> None:
    ids = [create_job(client, name=f"j{i}").job_id for i in range(5)]
    page = client.get(OVERVIEW_PATH, params={"limit": 2, "order": "newest"}).json()
    assert [v["job_id"] for v in page["jobs"]] == ids[::-1][:2]
    assert page["total"] == 5
    page = client.get(OVERVIEW_PATH, params={"limit": 2, "offset": 4, "order": "newest"})
    assert [v["job_id"] for v in page.json()["jobs"]] == [ids[0]]
    oldest = client.get(OVERVIEW_PATH, params={"limit": 2, "order": "oldest"}).json()
    assert [v["job_id"] for v in oldest["jobs"]] == ids[:2]
    assert oldest["total"] == 5
    r = client.get(OVERVIEW_PATH, params={"order": "random"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "order"]


def test_the_overview_needs_the_admin_token_when_one_is_set(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"admin_token": SecretStr("s3cret")}))
    job = create_job(client, headers={"Authorization": "Bearer s3cret"})
    assert client.get(OVERVIEW_PATH).status_code == 401
    assert client.get(OVERVIEW_PATH, headers=job.auth).status_code == 403
    r = client.get(OVERVIEW_PATH, headers={"Authorization": "Bearer s3cret"})
    assert [v["job_id"] for v in r.json()["jobs"]] == [job.job_id]


def test_activity_shows_the_ranks_and_the_iterations_they_reported(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    url = ACTIVITY_PATH.format(job_id=job.job_id)
    quiet = ActivityView.model_validate(client.get(url, headers=job.auth).json())
    assert [r.rank for r in quiet.ranks] == [0, 1, 2, 3] and quiet.iterations == []
    for rank in (0, 1, 2):
        r = client.post(
            job.url("/iterations"),
            json={
                "rank": rank,
                "iteration": 5,
                "time_s": 1.0 + rank,
                "energy_j": 10.0,
                "phase": "baseline",
            },
            headers=job.auth,
        )
        assert r.status_code == 200, r.text
    activity = ActivityView.model_validate(client.get(url, headers=job.auth).json())
    (point,) = activity.iterations
    assert (point.iteration, point.time_s, point.energy_j, point.ranks) == (5, 2.0, 30.0, 3)
    assert [r.phase for r in activity.ranks] == ["baseline", "baseline", "baseline", None]
    assert activity.ranks[3].last_report_age_s is None
    assert client.get(url).status_code == 401
    other = create_job(client)
    assert client.get(url, headers=other.auth).status_code == 403
