"""Prometheus text metrics and the two ASGI middlewares (request metrics, body size cap).

Job energy comes from the store (every process sees the same totals); request counters are
per server process: with several workers, each scrape sees the process that
answered it (label ``instance`` per process in Prometheus, or scrape each worker).
"""

from __future__ import annotations

import json
import threading
import time
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from perseus.schemas import JOB_STATES, ClusterBudgetView

__all__ = [
    "BodyLimitMiddleware",
    "JobGauges",
    "Metrics",
    "MetricsMiddleware",
    "method_label",
    "render_cluster",
]


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay_receive() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay_receive


_LATENCY_BUCKETS_S = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
_PLANNING_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class _Histogram:
    __slots__ = ("buckets", "count", "counts", "total")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.count += 1
        self.total += value

    def render(self, name: str, labels: str, out: list[str]) -> None:
        cumulative = 0
        sep = "," if labels else ""
        for bound, n in zip(self.buckets, self.counts, strict=False):
            cumulative += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {cumulative}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{suffix} {self.total}")
        out.append(f"{name}_count{suffix} {self.count}")


# Label values taken from a request come from closed sets: an unknown method counts as
# "other" (a client may send any token as the method, each of kilobytes, and every distinct
# label value is a series kept and rendered forever); routes are templates or "unmatched".
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    """The ``method`` label of a request: the method when the API knows it, else ``other``."""
    return method if method in _METHODS else "other"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Request counts and latencies per route, planning durations; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = {}
        self._latency: dict[tuple[str, str], _Histogram] = {}
        self._planning: dict[str, _Histogram] = {}

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            key = (method, route, status)
            self._requests[key] = self._requests.get(key, 0) + 1
            histogram = self._latency.get((method, route))
            if histogram is None:
                histogram = self._latency[(method, route)] = _Histogram(_LATENCY_BUCKETS_S)
            histogram.observe(seconds)

    def observe_planning(self, seconds: float, *, ok: bool) -> None:
        outcome = "ok" if ok else "failed"
        with self._lock:
            histogram = self._planning.get(outcome)
            if histogram is None:
                histogram = self._planning[outcome] = _Histogram(_PLANNING_BUCKETS_S)
            histogram.observe(seconds)

    def render(
        self,
        jobs_by_state: Mapping[str, int],
        job_energy: Mapping[str, tuple[float, float]] | None = None,
        job_gauges: Mapping[str, JobGauges] | None = None,
    ) -> str:
        """Prometheus text exposition format 0.0.4.

        Args:
            jobs_by_state: job counts by state.
            job_energy: ``job id -> (energy reported, energy saved)`` in joules, from the
                store: job labels come from stored job ids only, never from a request.
            job_gauges: per planned job, predicted against measured and the ranks.
        """
        out: list[str] = [
            "# HELP perseus_http_requests_total HTTP requests by method, route and status.",
            "# TYPE perseus_http_requests_total counter",
        ]
        with self._lock:
            for (method, route, status), n in sorted(self._requests.items()):
                out.append(
                    f'perseus_http_requests_total{{method="{method}",route="{_label(route)}",'
                    f'status="{status}"}} {n}'
                )
            out += [
                "# HELP perseus_http_request_duration_seconds HTTP request latency.",
                "# TYPE perseus_http_request_duration_seconds histogram",
            ]
            for (method, route), histogram in sorted(self._latency.items()):
                histogram.render(
                    "perseus_http_request_duration_seconds",
                    f'method="{method}",route="{_label(route)}"',
                    out,
                )
            out += [
                "# HELP perseus_planning_seconds Frontier computations by outcome.",
                "# TYPE perseus_planning_seconds histogram",
            ]
            for outcome, histogram in sorted(self._planning.items()):
                histogram.render("perseus_planning_seconds", f'outcome="{outcome}"', out)
        out += ["# HELP perseus_jobs Jobs by state.", "# TYPE perseus_jobs gauge"]
        for state in JOB_STATES:
            out.append(f'perseus_jobs{{state="{state}"}} {jobs_by_state.get(state, 0)}')
        energy = sorted((job_energy or {}).items())
        out += [
            "# HELP perseus_job_energy_joules_total Energy of the iterations ranks reported, "
            "every phase.",
            "# TYPE perseus_job_energy_joules_total counter",
        ]
        out += [
            f'perseus_job_energy_joules_total{{job="{_label(j)}"}} {e!r}' for j, (e, _) in energy
        ]
        # A gauge although named as the issue asks: each plan iteration adds its rank's
        # baseline median minus its energy, which is negative when a plan costs more.
        out += [
            "# HELP perseus_job_energy_saved_joules_total Energy saved by the plans against "
            "each rank's default-clock baseline (negative when a plan costs more).",
            "# TYPE perseus_job_energy_saved_joules_total gauge",
        ]
        out += [
            f'perseus_job_energy_saved_joules_total{{job="{_label(j)}"}} {s!r}'
            for j, (_, s) in energy
        ]
        gauges = sorted((job_gauges or {}).items())
        for name, field, help_text in _JOB_GAUGES:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            for j, g in gauges:
                value = getattr(g, field)
                if value is not None:
                    out.append(f'{name}{{job="{_label(j)}"}} {float(value)!r}')
        return "\n".join(out) + "\n"


@dataclass(frozen=True, slots=True)
class JobGauges:
    """One planned job's gauges: what the plan predicts, what the ranks measure."""

    predicted_time_s: float | None
    predicted_energy_j: float | None
    measured_time_s: float | None
    measured_energy_j: float | None
    plan_version: int
    ranks: int
    ranks_following: int


_JOB_GAUGES = (
    ("perseus_job_predicted_iteration_seconds", "predicted_time_s",
     "Iteration time the chosen plan predicts (a straggler's pace included)."),
    ("perseus_job_measured_iteration_seconds", "measured_time_s",
     "Measured iteration time, mean over replicas of the recent window."),
    ("perseus_job_predicted_iteration_energy_joules", "predicted_energy_j",
     "Energy of one pipeline per iteration the chosen plan predicts."),
    ("perseus_job_measured_iteration_energy_joules", "measured_energy_j",
     "Measured energy of one pipeline per iteration, mean over replicas."),
    ("perseus_job_plan_version", "plan_version", "The job's plan version."),
    ("perseus_job_ranks", "ranks", "Ranks registered."),
    ("perseus_job_ranks_following_plan", "ranks_following",
     "Ranks whose last report (to this server process) ran the current plan version."),
)  # fmt: skip


class MetricsMiddleware:
    """Counts and times every HTTP request by its route template (pure ASGI: cheap)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_s = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.observe_request(
                method_label(scope["method"]), template, status, time.perf_counter() - started_s
            )


class BodyLimitMiddleware:
    """Answers 413 to request bodies over ``max_bytes``.

    A declared ``Content-Length`` is checked up front (the HTTP server holds the body to
    it); a chunked body is read here, up to the cap, and replayed to the app.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.max_bytes + 1
        if declared is not None:
            if declared > self.max_bytes:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away; let the app see the disconnect.
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _reject(self, send: Send) -> None:
        body: dict[str, Any] = {
            "detail": f"request body exceeds {self.max_bytes} bytes",
            "error": "PayloadTooLarge",
        }
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


# ----------------------------------------------------------------------------- cluster budget

_CLUSTER_GAUGES = (
    ("perseus_cluster_power_budget_watts", "budget_w",
     "The cluster power budget in force (absent while none is)."),
    ("perseus_cluster_power_predicted_watts", "predicted_w",
     "Every job's predicted power at its current point, summed."),
    ("perseus_cluster_power_measured_watts", "measured_w",
     "Every job's power from its ranks' recent iterations, summed."),
    ("perseus_cluster_power_policy_watts", "policy_w",
     "What the jobs would draw at their own policies."),
    ("perseus_cluster_power_least_watts", "least_w", "The least the jobs can draw."),
    ("perseus_cluster_budget_met", "met",
     "1 while the predicted power is within the budget, 0 while it is not (absent: no budget)."),
    ("perseus_cluster_budget_meetable", "meetable",
     "1 while the jobs can meet the budget at all, 0 while they cannot (absent: no budget)."),
    ("perseus_cluster_budget_shortfall_watts", "shortfall_w",
     "How far the predicted power exceeds the budget."),
    ("perseus_cluster_budget_weighted_slowdown_ratio", "weighted_slowdown",
     "Sum over jobs of priority times slowdown against their policies."),
)  # fmt: skip

_JOB_POWER_GAUGES = (
    ("perseus_job_power_predicted_watts", "predicted_w", "The job's predicted power."),
    ("perseus_job_power_measured_watts", "measured_w",
     "The job's power from its ranks' recent iterations."),
    ("perseus_job_power_share_ratio", "share", "The job's share of the cluster's predicted power."),
    ("perseus_job_budget_slowdown_ratio", "slowdown",
     "How much slower than its policy the cluster budget runs the job (0.018: 1.8 %)."),
    ("perseus_job_priority", "priority", "The weight of the job's slowdown under a budget."),
)  # fmt: skip


def render_cluster(view: ClusterBudgetView) -> str:
    """The cluster budget's gauges (Prometheus text), appended to :meth:`Metrics.render`'s."""
    out: list[str] = []
    for name, field, help_text in _CLUSTER_GAUGES:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        value = getattr(view, field)
        if value is not None:
            out.append(f"{name} {float(value)!r}")
    for name, field, help_text in _JOB_POWER_GAUGES:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for job in view.jobs:
            value = getattr(job, field)
            if value is not None:
                out.append(f'{name}{{job="{_label(job.job_id)}"}} {float(value)!r}')
    return "\n".join(out) + "\n"
