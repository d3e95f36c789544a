"""The Grafana dashboard in dashboards/ queries only metrics the planner's /metrics serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import Job

DASHBOARD = Path(__file__).parents[2] / "dashboards" / "perseus.json"
_METRIC = re.compile(r"\bperseus_[a-z_]+\b")
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def _queried(dashboard: dict[str, object]) -> set[str]:
    """Every perseus_* metric name in the dashboard's queries and variables."""
    return set(_METRIC.findall(json.dumps(dashboard)))


def _served(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name)
            if kind == "histogram":
                names.update(name + part for part in _HISTOGRAM_PARTS)
    return names


def test_every_metric_the_dashboard_queries_exists(ready_job: Job) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queried = _queried(dashboard)
    assert "perseus_job_ranks_following_plan" in queried
    served = _served(ready_job.client.get("/metrics").text)
    assert queried <= served, f"not in /metrics: {sorted(queried - served)}"


def test_a_planned_job_has_its_gauges(ready_job: Job) -> None:
    for rank in range(ready_job.stages * ready_job.data_parallel):
        body = {"rank": rank, "iteration": 0, "time_s": 1.0, "energy_j": 50.0,
                "phase": "plan", "plan_version": 1}  # fmt: skip
        r = ready_job.client.post(
            f"/v1/jobs/{ready_job.job_id}/iterations", json=body, headers=ready_job.auth
        )
        assert r.status_code == 200, r.text
    text = ready_job.client.get("/metrics").text
    view = ready_job.client.get(f"/v1/jobs/{ready_job.job_id}", headers=ready_job.auth).json()
    label = f'{{job="{ready_job.job_id}"}}'
    chosen = view["chosen"]
    assert (
        f"perseus_job_predicted_iteration_seconds{label} {chosen['expected_iteration_time_s']!r}"
        in text
    )
    assert (
        f"perseus_job_predicted_iteration_energy_joules{label} {chosen['expected_energy_j']!r}"
        in text
    )
    assert f"perseus_job_measured_iteration_seconds{label} 1.0" in text
    assert f"perseus_job_ranks{label} 8.0" in text
    assert f"perseus_job_ranks_following_plan{label} 8.0" in text
    assert f"perseus_job_plan_version{label} 1.0" in text
