"""The server's asynchronous machinery: cached job state, telemetry batches.

:class:`JobHeads` keeps each job's row in memory so that plan fetches need no database
round trip. Changes made by this process are written through at once and wake long polls;
changes made by other server processes (several workers, several hosts) are picked up when
a cached row is older than ``cache_ttl_s``.

:class:`TelemetryBuffer` writes iteration reports in batches.

Planning runs (worker processes, their limits and fairness) are
:class:`perseus.server.planning.runner.PlanningRunner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from perseus.core.errors import JobNotFound, JobStateError, PerseusError
from perseus.schemas import IterationReport
from perseus.server.lifecycle.choices import PlanChoices
from perseus.server.lifecycle.jobs import Jobs
from perseus.server.lifecycle.telemetry import IterationLog
from perseus.server.store.job_store import JobRow

__all__ = ["Coalescer", "JobHeads", "RankPlace", "TelemetryBuffer"]

log = logging.getLogger("perseus.server")

T = TypeVar("T")

RankPlace = tuple[int, int, str | None]
"""A registered rank's ``(stage, data_parallel_rank, host)``."""


class Coalescer:
    """Runs at most one load per key at a time; concurrent callers share its result."""

    def __init__(self) -> None:
        self._inflight: dict[Any, asyncio.Future[Any]] = {}

    async def run(self, key: Any, load: Callable[[], Awaitable[T]]) -> T:
        future = self._inflight.get(key)
        if future is None:
            future = asyncio.ensure_future(load())
            self._inflight[key] = future
            future.add_done_callback(lambda _: self._inflight.pop(key, None))
        # shield: one caller giving up (a client that disconnects) must not cancel the load.
        result: T = await asyncio.shield(future)
        return result


class JobHeads:
    """Per-process cache of job rows and rank layouts, with change notification.

    Must be used from the event loop thread only, except :meth:`changed_threadsafe`.

    A cached row never goes back to an older version. While ranks wait for a job's next
    version, changes made by other server processes are watched for: every ``poll_s`` one
    query reads the versions of every waited-for job, and on PostgreSQL a notification
    (:meth:`perseus.server.store.job_store.Store.listen`) wakes the wait at once.

    Args:
        jobs: the jobs (their methods run in the thread pool).
        ttl_s: how long a cached row is trusted without re-reading the database.
        poll_s: how often waited-for jobs are checked for changes made elsewhere.
        max_jobs: job rows (and rank layouts) kept; past it the oldest-stored not waited
            for are dropped (read again when asked for).
    """

    def __init__(
        self, jobs: Jobs, ttl_s: float, poll_s: float = 0.1, *, max_jobs: int = 4096
    ) -> None:
        self._jobs = jobs
        self._max_jobs = max_jobs
        self._ttl_s = ttl_s
        self._poll_s = poll_s
        self._rows: dict[str, tuple[float, JobRow]] = {}
        self._layouts: dict[str, tuple[float, dict[int, RankPlace]]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._loads = Coalescer()
        self._waiting: dict[str, int] = {}  # job id -> ranks waiting for its next version
        self._watch: asyncio.Task[None] | None = None
        self._refreshes: set[asyncio.Future[JobRow]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def cached(self) -> int:
        """Job rows held in memory now."""
        return len(self._rows)

    async def get(self, job_id: str) -> JobRow:
        """The job, from the cache when fresh enough.

        Raises:
            JobNotFound: no such job.
        """
        entry = self._rows.get(job_id)
        if entry is not None and time.monotonic() - entry[0] <= self._ttl_s:
            return entry[1]
        return await self.refresh(job_id)

    async def refresh(self, job_id: str) -> JobRow:
        """Re-read the job from the database (one read however many callers wait)."""

        async def load() -> JobRow:
            try:
                row = await run_in_threadpool(self._jobs.get, job_id)
            except JobNotFound:
                self.forget(job_id)
                raise
            self.put(row)
            return row

        return await self._loads.run(("job", job_id), load)

    def put(self, row: JobRow) -> None:
        """Record a row this process read or wrote; wakes waiters if the plan changed.

        A row older than the cached one (a read that raced a write) is ignored.
        """
        old = self._rows.get(row.id)
        if old is not None and (old[1].version, old[1].updated_at_s) > (
            row.version,
            row.updated_at_s,
        ):
            return
        self._rows.pop(row.id, None)  # to the end: dicts keep insertion order
        self._rows[row.id] = (time.monotonic(), row)
        if old is None or (old[1].version, old[1].state) != (row.version, row.state):
            self._wake(row.id)
        if len(self._rows) > self._max_jobs:
            self._evict()

    def _evict(self) -> None:
        """Drop the rows stored longest ago (and their layouts), but those waited for."""
        excess = len(self._rows) - self._max_jobs
        for job_id in [j for j in self._rows if j not in self._waiting][:excess]:
            del self._rows[job_id]
            self._layouts.pop(job_id, None)

    def forget(self, job_id: str) -> None:
        """Drop a deleted job; its waiters wake and find it gone."""
        self._rows.pop(job_id, None)
        self._layouts.pop(job_id, None)
        self._wake(job_id)

    def add_rank(self, job_id: str, rank: int, place: RankPlace) -> None:
        entry = self._layouts.get(job_id)
        if entry is not None:
            entry[1][rank] = place

    async def rank_position(self, job_id: str, rank: int) -> RankPlace:
        """``(stage, data_parallel_rank, host)`` of a registered rank.

        Raises:
            JobStateError: the rank has not registered.
        """
        entry = self._layouts.get(job_id)
        if entry is not None and rank in entry[1]:
            return entry[1][rank]

        # Ranks are never unregistered, so only a miss needs the database: the rank may
        # have registered through another server process, or while this one read the layout.
        async def load() -> dict[int, RankPlace]:
            layout = await run_in_threadpool(self._jobs.rank_layout, job_id)
            if len(self._layouts) >= self._max_jobs:
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[job_id] = (time.monotonic(), layout)
            return layout

        layout = await self._loads.run(("layout", job_id), load)
        if rank in layout:
            return layout[rank]
        raise JobStateError(f"rank {rank} has not registered")

    async def wait_until(
        self, job_id: str, done: Callable[[JobRow], bool], timeout_s: float
    ) -> JobRow:
        """Wait until ``done(row)`` or the timeout; returns the latest row either way.

        A change made here wakes the wait at once; a change made by another server
        process within ``poll_s`` (at once on PostgreSQL).
        """
        deadline = time.monotonic() + timeout_s
        self._waiting[job_id] = self._waiting.get(job_id, 0) + 1
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_changes(), name="job change watch")
        try:
            while True:
                row = await self.get(job_id)
                remaining = deadline - time.monotonic()
                if done(row) or remaining <= 0:
                    return row
                event = self._changed.setdefault(job_id, asyncio.Event())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(remaining, max(self._ttl_s, 0.05)))
        finally:
            left = self._waiting.pop(job_id) - 1
            if left:
                self._waiting[job_id] = left

    async def _watch_changes(self) -> None:
        """While ranks wait: re-read the jobs whose version or state changed elsewhere."""
        try:
            while self._waiting:
                await asyncio.sleep(self._poll_s)
                job_ids = sorted(self._waiting)
                try:
                    heads = await run_in_threadpool(self._jobs.heads, job_ids)
                except Exception:
                    # A database hiccup: waits still end by their timeout; try again.
                    log.exception("checking jobs for changes failed")
                    continue
                for job_id in job_ids:
                    self._check(job_id, heads.get(job_id))
        finally:
            self._watch = None

    def _check(self, job_id: str, head: tuple[int, str] | None) -> None:
        """React to a job's stored ``(version, state)`` (None: deleted)."""
        entry = self._rows.get(job_id)
        if head is None:
            if entry is not None:
                self.forget(job_id)
            return
        if entry is not None and (entry[1].version, entry[1].state) == head:
            return
        if job_id in self._waiting:
            task = asyncio.ensure_future(self.refresh(job_id))
            self._refreshes.add(task)
            task.add_done_callback(self._refreshed)
        else:
            self._rows.pop(job_id, None)  # the next read fetches it

    def _refreshed(self, task: asyncio.Future[JobRow]) -> None:
        self._refreshes.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, JobNotFound):  # deleted: waiters see it
            log.error("re-reading a changed job failed", exc_info=exc)

    def changed_threadsafe(self, job_id: str, version: int, state: str) -> None:
        """A change made by some server process (a PostgreSQL notification's thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._check, job_id, (version, state))

    async def close(self) -> None:
        """Stop watching for changes (at shutdown)."""
        tasks: list[asyncio.Future[Any]] = [*self._refreshes]
        if self._watch is not None:
            tasks.append(self._watch)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def bind_loop(self) -> None:
        """Remember the running event loop, for :meth:`changed_threadsafe`."""
        self._loop = asyncio.get_running_loop()

    def _wake(self, job_id: str) -> None:
        event = self._changed.pop(job_id, None)
        if event is not None:
            event.set()


class TelemetryBuffer:
    """Iteration reports, checked on arrival and written to the store in batches.

    Every rank reports every iteration (1,024 ranks at a 3 s iteration: 340 reports a
    second); a transaction for each would make the database the server's bottleneck. A
    report is checked when it arrives (job, token, registered rank, fields), kept here, and
    written every ``flush_s`` in one transaction per job. Reading a job flushes it first,
    so a job's view shows every report this process accepted; a crash loses at most
    ``flush_s`` of telemetry. After writing, jobs with ``auto_straggler`` are checked for a
    straggler, at most once per ``check_period_s`` each.
    """

    def __init__(
        self,
        iterations: IterationLog,
        choices: PlanChoices,
        heads: JobHeads,
        flush_s: float,
        check_period_s: float = 1.0,
    ) -> None:
        self._iterations = iterations
        self._choices = choices
        self._heads = heads
        self._flush_s = flush_s
        self._check_period_s = check_period_s
        self._pending: dict[str, list[IterationReport]] = {}
        self._jobs: dict[str, JobRow] = {}
        self._checked_s: dict[str, float] = {}
        self._flushing = asyncio.Lock()  # keeps each rank's reports in order
        self._task: asyncio.Task[None] | None = None
        self.after_straggler: Callable[[], Awaitable[object]] | None = None
        """Awaited after a detected straggler moved a job's plans (the cluster budget
        re-balances then)."""

    def add(self, job: JobRow, report: IterationReport) -> None:
        """Keep a checked report of ``job`` for the next batch."""
        self._pending.setdefault(job.id, []).append(report)
        self._jobs[job.id] = job

    def forget(self, job_id: str) -> None:
        """Drop what a deleted job still had pending."""
        self._pending.pop(job_id, None)
        self._jobs.pop(job_id, None)
        self._checked_s.pop(job_id, None)

    def start(self) -> None:
        self._task = asyncio.create_task(self._flush_periodically(), name="telemetry flush")

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._flush_s)
            try:
                await self.flush()
            except Exception:
                # A database hiccup must not end telemetry for good; the reports are lost.
                log.exception("writing iteration reports failed")

    async def flush(self, job_id: str | None = None) -> None:
        """Write what is pending (for one job, or for all) and check for stragglers."""
        async with self._flushing:
            if job_id is None:
                batch, self._pending = self._pending, {}
            elif job_id in self._pending:
                batch = {job_id: self._pending.pop(job_id)}
            else:
                return
            if not batch:
                return
            jobs = {job_id: self._jobs[job_id] for job_id in batch}
            await run_in_threadpool(self._write, batch, jobs)
            now_s = time.monotonic()
            for job in jobs.values():
                if not job.spec.auto_straggler:
                    continue
                if now_s - self._checked_s.get(job.id, 0.0) < self._check_period_s:
                    continue
                self._checked_s[job.id] = now_s
                try:
                    moved = await run_in_threadpool(self._choices.detect_straggler, job.id)
                except PerseusError:
                    continue  # the job changed or went away meanwhile; checked next time
                if moved is not None:
                    self._heads.put(moved)
                    if self.after_straggler is not None:
                        await self.after_straggler()

    def _write(self, batch: dict[str, list[IterationReport]], jobs: dict[str, JobRow]) -> None:
        for job_id, reports in batch.items():
            try:
                self._iterations.record(job_id, reports, jobs[job_id].spec.straggler_window)
            except Exception:
                log.exception("job %s: writing %d iteration reports failed", job_id, len(reports))

    async def close(self) -> None:
        """Stop the timer and write what is left."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()
