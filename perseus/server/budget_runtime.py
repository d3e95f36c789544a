"""The cluster budget's asynchronous side: re-balancing off the event loop, and the timer
that makes a budget window start and end on time.

Every server process runs a :class:`BudgetKeeper`. Re-balances are serialized here within
the process and by the budget row's lock across processes
(:class:`perseus.server.lifecycle.budget.ClusterBudget`); the jobs that moved go into the
process's :class:`~perseus.server.runtime.JobHeads`, which wakes their ranks' long polls
(other processes see the new versions through their change watch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool

from perseus.server.lifecycle.budget import ClusterBudget
from perseus.server.runtime import JobHeads
from perseus.server.store.job_store import JobRow

__all__ = ["BUDGET_CHECK_S", "BudgetKeeper"]

log = logging.getLogger("perseus.server")

BUDGET_CHECK_S = 1.0
"""How often the timer checks whether the budget in force changed (a window set by another
process); a known window boundary is waited for exactly."""


class BudgetKeeper:
    """Re-balances the cluster budget when asked, and at a window's start and end.

    Args:
        budget: the budget's logic (its methods run in the thread pool).
        heads: the process's job rows, to which moved jobs are written through.
        check_s: the timer's longest sleep.
    """

    def __init__(
        self, budget: ClusterBudget, heads: JobHeads, check_s: float = BUDGET_CHECK_S
    ) -> None:
        self._budget = budget
        self._heads = heads
        self._check_s = check_s
        self._lock = asyncio.Lock()  # one re-balance at a time in this process
        self._task: asyncio.Task[None] | None = None

    async def change(self, change: Callable[[], list[JobRow]]) -> list[JobRow]:
        """Run a budget change (set, lift) that re-balances in its own transaction.

        Raises:
            PerseusError: the change was refused (nothing changed).
        """
        async with self._lock:
            moved = await run_in_threadpool(change)
        self._publish(moved)
        return moved

    async def rebalance(self) -> dict[str, JobRow]:
        """Choose the jobs' points again (after a job changed); never raises: a failure is
        logged, and the next change or window boundary tries again.

        Returns:
            The jobs that moved, by id.
        """
        try:
            async with self._lock:
                moved = await run_in_threadpool(self._budget.rebalance)
        except Exception:
            log.exception("re-balancing the cluster power budget failed")
            return {}
        self._publish(moved)
        return {row.id: row for row in moved}

    def _publish(self, moved: list[JobRow]) -> None:
        for row in moved:
            self._heads.put(row)

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="cluster budget timer")
        self._task.add_done_callback(_log_end)

    async def _watch(self) -> None:
        while True:
            try:
                due, boundary_s = await run_in_threadpool(self._budget.timer)
                if due:
                    await self.rebalance()
            except Exception:
                # A database hiccup must not stop windows for good: try again shortly.
                log.exception("checking the cluster power budget's window failed")
                boundary_s = None
            sleep_s = self._check_s
            if boundary_s is not None:
                sleep_s = min(sleep_s, max(0.0, boundary_s - time.time()))
            await asyncio.sleep(sleep_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _log_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the cluster budget timer stopped", exc_info=task.exception())
