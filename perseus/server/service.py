"""The server's business logic, one part per lifecycle step (no web framework here).

=========================  ============================================================
:class:`~.jobs.Jobs`        jobs and ranks: create, list, delete, view, register
:class:`~.lease.PlanningLease`  profiles and the planning lease: claim, heartbeat, store
:class:`~.choices.PlanChoices`  policy and stragglers: which point the plans follow
:class:`~.telemetry.IterationLog`  ranks' measured iterations
:class:`~.plans.Plans`      plans rendered by their wire model, cached per version
:class:`~.budget.ClusterBudget`  the cluster's power budget: each planned job's point
=========================  ============================================================

Pure rules (choosing a point, detecting a straggler) are functions in
:mod:`~perseus.server.lifecycle.decisions`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from perseus.server.lifecycle.budget import DEFAULT_GPU_W, ClusterBudget
from perseus.server.lifecycle.choices import PlanChoices
from perseus.server.lifecycle.jobs import Jobs
from perseus.server.lifecycle.lease import PlanningLease
from perseus.server.lifecycle.quotas import Quotas
from perseus.server.lifecycle.telemetry import IterationLog
from perseus.server.planning.plans import FrontierCache, Plans
from perseus.server.store.job_store import Store

__all__ = ["JobService"]


class JobService:
    """One of each part over one store, sharing this process's caches.

    Args:
        store: the job store.
        owner: this process's identity in planning claims.
        clock: wall clock in seconds (tests pass a fake one).
        frontier_cache_size: parsed frontiers kept.
        plan_cache_size: rendered plans kept.
        max_cells: the most planning work a job may imply (None: no limit).
        quotas: what one job, and all of them, may hold (none by default).
        default_gpu_w: what a GPU of a job without plan or telemetry is counted at under
            a cluster power budget.
    """

    def __init__(
        self,
        store: Store,
        *,
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
        frontier_cache_size: int = 16,
        plan_cache_size: int = 4096,
        max_cells: int | None = None,
        quotas: Quotas | None = None,
        default_gpu_w: float = DEFAULT_GPU_W,
    ) -> None:
        quotas = quotas or Quotas()
        self.store = store
        self.frontiers = FrontierCache(store, frontier_cache_size)
        self.plans = Plans(self.frontiers, plan_cache_size)
        self.jobs = Jobs(store, self.frontiers, self.plans, clock=clock, quotas=quotas)
        self.lease = PlanningLease(
            store, self.frontiers, owner=owner, clock=clock, max_cells=max_cells, quotas=quotas
        )
        self.choices = PlanChoices(store, self.frontiers, self.plans, clock=clock)
        self.iterations = IterationLog(store)
        self.budget = ClusterBudget(store, self.frontiers, clock=clock, default_gpu_w=default_gpu_w)

    @property
    def owner(self) -> str:
        """This process's identity in planning claims."""
        return self.lease.owner
