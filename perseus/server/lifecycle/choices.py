"""Policy and stragglers: which frontier point the plans follow, and moving it.

Every change of what the ranks should run (a policy, a declared or detected straggler)
chooses the point again (:func:`perseus.server.lifecycle.decisions.choose`) and, once the job has a
frontier, makes a new plan version; ranks fetch their plan by version (the ETag).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from perseus.core.jobs import JobState, transition
from perseus.schemas import PlanVersion, PolicyModel, StragglerSpec, StragglerView
from perseus.server.lifecycle.decisions import (
    choose,
    detect_straggler,
    policy_to_solver,
    replica_measurements,
    robust_time_s,
)
from perseus.server.lifecycle.jobs import JobPart, existing
from perseus.server.planning.plans import choice_of
from perseus.server.store.job_store import JobRow

__all__ = ["PlanChoices"]


class PlanChoices(JobPart):
    """Changes of policy and straggler, manual and automatic (``plans`` renders the reply's
    chosen point)."""

    def set_policy(self, job_id: str, spec: PolicyModel) -> tuple[PlanVersion, JobRow]:
        """Change the policy; with a frontier, plans move at once (a new version).

        Raises:
            JobNotFound: no such job.
            PolicyError: the policy is invalid.
            InfeasibleDeadline: the deadline is shorter than the fastest plan.
        """
        policy_to_solver(spec)
        return self._update(job_id, lambda job: dataclasses.replace(job, policy=spec))

    def set_straggler(self, job_id: str, spec: StragglerSpec) -> tuple[PlanVersion, JobRow]:
        """Declare a straggler: plans move to the least energy within its iteration time."""
        straggler = StragglerView(iteration_time_s=spec.iteration_time_s, slowdown=spec.slowdown)
        return self._update(job_id, lambda job: dataclasses.replace(job, straggler=straggler))

    def clear_straggler(self, job_id: str) -> tuple[PlanVersion, JobRow]:
        """Forget any straggler (declared or detected)."""
        return self._update(job_id, lambda job: dataclasses.replace(job, straggler=None))

    def _update(
        self, job_id: str, change: Callable[[JobRow], JobRow]
    ) -> tuple[PlanVersion, JobRow]:
        with self._store.read() as tx:
            self._frontiers.of(existing(tx, job_id))  # parse outside the row lock
        with self._store.write() as tx:
            job = dataclasses.replace(change(existing(tx, job_id)), updated_at_s=self._clock())
            frontier = self._frontiers.of(job)
            if frontier is not None:
                choice = choose(frontier, job.policy, job.straggler, job.budget_index)
                job = dataclasses.replace(
                    job,
                    policy_index=choice.policy_index,
                    chosen_index=choice.chosen_index,
                    budget_index=choice.budget_index,
                    version=job.version + 1,
                )
                if job.state == JobState.FAILED:
                    job = dataclasses.replace(
                        job, state=transition(job.state, JobState.READY), reason=None
                    )
            tx.save_job(job)
        return self._plans.version(job), job

    def detect_straggler(self, job_id: str) -> JobRow | None:
        """With ``auto_straggler`` on, move plans when one replica is consistently slower.

        See :func:`perseus.server.lifecycle.decisions.detect_straggler` for the rule.

        Returns:
            The job when the plans moved (a new version), else None.

        Raises:
            JobNotFound: no such job.
            PlanError: the frontier was replaced meanwhile.
        """
        with self._store.read() as tx:
            job = existing(tx, job_id)
            choice = choice_of(job)
            if not job.spec.auto_straggler or choice is None:
                return None
            windows = tx.windows(job_id, job.version)
        spec = job.spec
        frontier = self._frontiers.get(job.id, job.frontier_rev)
        change = detect_straggler(
            frontier,
            choice,
            job.straggler,
            replica_measurements(
                windows,
                spec.stages * spec.tensor_parallel,
                spec.straggler_window,
                center=robust_time_s,
            ),
            data_parallel=spec.data_parallel,
            threshold=spec.straggler_threshold,
        )
        if change is None:
            return None
        with self._store.write() as tx:
            locked = existing(tx, job_id)
            if locked.version != job.version or locked.straggler != job.straggler:
                return None  # someone else moved the plans meanwhile
            choice = choose(frontier, locked.policy, change.straggler, locked.budget_index)
            job = dataclasses.replace(
                locked,
                straggler=change.straggler,
                policy_index=choice.policy_index,
                chosen_index=choice.chosen_index,
                budget_index=choice.budget_index,
                version=locked.version + 1,
                updated_at_s=self._clock(),
            )
            tx.save_job(job)
        return job
