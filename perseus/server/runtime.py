"""The server's asynchronous machinery: cached job state, telemetry batches, planning.

:class:`JobHeads` keeps each job's row in memory so that plan fetches need no database
round trip. Changes made by this process are written through at once and wake long polls;
changes made by other server processes (several workers, several hosts) are picked up when
a cached row is older than ``cache_ttl_s``.

:class:`TelemetryBuffer` writes iteration reports in batches.

:class:`PlanningRunner` computes frontiers in a process pool, never on the event loop,
keeps a reference to every background task, renews a heartbeat for the jobs it computes
and takes over jobs whose owner stopped (a crashed or restarted server).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from perseus.errors import JobNotFound, JobStateError, PerseusError
from perseus.schemas import IterationReport
from perseus.server.jobs import JobService
from perseus.server.metrics import Metrics
from perseus.server.planning import init_worker, plan_frontier, warm_up
from perseus.server.store import JobRow

__all__ = ["Coalescer", "JobHeads", "PlanningRunner", "TelemetryBuffer"]

log = logging.getLogger("perseus.server")

T = TypeVar("T")

# Planning runs at this lower CPU priority than the server (see planning.init_worker).
_WORKER_NICENESS = 19


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

    Must be used from the event loop thread only.

    Args:
        service: the job service (its methods run in the thread pool).
        ttl_s: how long a cached row is trusted without re-reading the database.
    """

    def __init__(self, service: JobService, ttl_s: float) -> None:
        self._service = service
        self._ttl_s = ttl_s
        self._rows: dict[str, tuple[float, JobRow]] = {}
        self._layouts: dict[str, tuple[float, dict[int, tuple[int, int]]]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._loads = Coalescer()

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
                row = await run_in_threadpool(self._service.get_job, job_id)
            except JobNotFound:
                self.forget(job_id)
                raise
            self.put(row)
            return row

        return await self._loads.run(("job", job_id), load)

    def put(self, row: JobRow) -> None:
        """Record a row this process read or wrote; wakes waiters if the plan changed."""
        old = self._rows.get(row.id)
        self._rows[row.id] = (time.monotonic(), row)
        if old is None or (old[1].version, old[1].state) != (row.version, row.state):
            self._wake(row.id)

    def forget(self, job_id: str) -> None:
        """Drop a deleted job; its waiters wake and find it gone."""
        self._rows.pop(job_id, None)
        self._layouts.pop(job_id, None)
        self._wake(job_id)

    def add_rank(self, job_id: str, rank: int, stage: int, data_parallel_rank: int) -> None:
        entry = self._layouts.get(job_id)
        if entry is not None:
            entry[1][rank] = (stage, data_parallel_rank)

    async def rank_position(self, job_id: str, rank: int) -> tuple[int, int]:
        """``(stage, data_parallel_rank)`` of a registered rank.

        Raises:
            JobStateError: the rank has not registered.
        """
        entry = self._layouts.get(job_id)
        if entry is not None and rank in entry[1]:
            return entry[1][rank]
        if entry is None or time.monotonic() - entry[0] > self._ttl_s:

            async def load() -> dict[int, tuple[int, int]]:
                layout = await run_in_threadpool(self._service.rank_layout, job_id)
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
        process is seen within ``ttl_s`` (the row is re-read that often while waiting).
        """
        deadline = time.monotonic() + timeout_s
        poll_s = max(self._ttl_s, 0.05)
        while True:
            row = await self.get(job_id)
            remaining = deadline - time.monotonic()
            if done(row) or remaining <= 0:
                return row
            event = self._changed.setdefault(job_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(remaining, poll_s))

    def _wake(self, job_id: str) -> None:
        event = self._changed.pop(job_id, None)
        if event is not None:
            event.set()


class PlanningRunner:
    """Computes frontiers in worker processes and stores them.

    Args:
        service: the job service.
        heads: the row cache to update when a job's planning ends.
        metrics: where planning durations go.
        workers: worker processes.
        lease_s: a job whose planning heartbeat is older than this is taken over.
        warm: start a worker process (and import the solver) right away.
        polish_s: seconds each frontier may spend improving its no-slowdown point.
    """

    def __init__(
        self,
        service: JobService,
        heads: JobHeads,
        metrics: Metrics,
        *,
        workers: int,
        lease_s: float,
        warm: bool,
        polish_s: float = 0.0,
    ) -> None:
        self._service = service
        self._heads = heads
        self._metrics = metrics
        self._workers = workers
        self._lease_s = lease_s
        self._polish_s = polish_s
        self._executor = self._new_executor()
        self._tasks: set[asyncio.Task[None]] = set()
        self._computing: set[str] = set()
        self._maintenance: asyncio.Task[None] | None = None
        if warm:
            self._executor.submit(warm_up)

    def _new_executor(self) -> ProcessPoolExecutor:
        # spawn: a fresh interpreter, no copy of the server's threads, sockets or locks.
        return ProcessPoolExecutor(
            self._workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=init_worker,
            initargs=(_WORKER_NICENESS,),
        )

    @property
    def computing(self) -> frozenset[str]:
        """Ids of the jobs this process is computing."""
        return frozenset(self._computing)

    def start(self, job_id: str) -> None:
        """Compute the frontier of a job this process claimed, in the background."""
        self._computing.add(job_id)
        self._spawn(self._run(job_id), f"planning {job_id}")

    def start_maintenance(self) -> None:
        """Heartbeats for our jobs and takeover of abandoned ones, every ``lease_s / 3``."""
        self._maintenance = asyncio.create_task(self._maintain(), name="planning maintenance")

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def _run(self, job_id: str) -> None:
        started_s = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            planning = await run_in_threadpool(self._service.planning_input, job_id)
            planning = dataclasses.replace(planning, polish_s=self._polish_s)
            result = await loop.run_in_executor(self._executor, plan_frontier, planning)
            planning_s = time.perf_counter() - started_s
            row = await run_in_threadpool(
                self._service.finish_planning,
                job_id,
                result.frontier_json,
                planning_s,
                result.frontier,
            )
            self._metrics.observe_planning(planning_s, ok=True)
            log.info("job %s: frontier computed in %.2f s", job_id, planning_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, BrokenProcessPool):
                log.error("planning worker died; starting a new pool")
                old, self._executor = self._executor, self._new_executor()
                old.shutdown(wait=False, cancel_futures=True)
                reason = "the planning worker process died (out of memory?)"
            elif isinstance(exc, PerseusError):
                reason = f"{type(exc).__name__}: {exc}"
            else:
                log.error("job %s: planning failed", job_id, exc_info=exc)
                reason = f"internal error while planning: {type(exc).__name__}: {exc}"
            self._metrics.observe_planning(time.perf_counter() - started_s, ok=False)
            log.warning("job %s: planning failed: %s", job_id, reason)
            row = await run_in_threadpool(self._service.fail_planning, job_id, reason)
        finally:
            self._computing.discard(job_id)
        if row is not None:
            self._heads.put(row)

    async def _maintain(self) -> None:
        period_s = self._lease_s / 3
        while True:
            await asyncio.sleep(period_s)
            try:
                if self._computing:
                    await run_in_threadpool(self._service.heartbeat, sorted(self._computing))
                for row in await run_in_threadpool(self._service.reclaim_stale, self._lease_s):
                    log.warning("job %s: taking over planning from a silent server", row.id)
                    self._heads.put(row)
                    self.start(row.id)
            except Exception:
                # A database hiccup must not end the heartbeats for good.
                log.exception("planning maintenance failed; retrying")

    async def close(self) -> None:
        """Stop background work and the worker processes.

        Jobs being computed stay ``planning``; with no heartbeat, the next server to run
        (or another one sharing the database) takes them over after ``lease_s``.
        """
        tasks = list(self._tasks)
        if self._maintenance is not None:
            tasks.append(self._maintenance)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        processes = list(getattr(self._executor, "_processes", {}).values())
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            # A frontier can take minutes; do not make shutdown wait for it.
            process.terminate()


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
        self, service: JobService, heads: JobHeads, flush_s: float, check_period_s: float = 1.0
    ) -> None:
        self._service = service
        self._heads = heads
        self._flush_s = flush_s
        self._check_period_s = check_period_s
        self._pending: dict[str, list[IterationReport]] = {}
        self._jobs: dict[str, JobRow] = {}
        self._checked_s: dict[str, float] = {}
        self._flushing = asyncio.Lock()  # keeps each rank's reports in order
        self._task: asyncio.Task[None] | None = None

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
                if not job.spec.get("auto_straggler"):
                    continue
                if now_s - self._checked_s.get(job.id, 0.0) < self._check_period_s:
                    continue
                self._checked_s[job.id] = now_s
                try:
                    moved = await run_in_threadpool(self._service.detect_straggler, job.id)
                except PerseusError:
                    continue  # the job changed or went away meanwhile; checked next time
                if moved is not None:
                    self._heads.put(moved)

    def _write(self, batch: dict[str, list[IterationReport]], jobs: dict[str, JobRow]) -> None:
        for job_id, reports in batch.items():
            window = int(jobs[job_id].spec["straggler_window"])
            try:
                self._service.record_iterations(job_id, reports, window)
            except Exception:
                log.exception("job %s: writing %d iteration reports failed", job_id, len(reports))

    async def close(self) -> None:
        """Stop the timer and write what is left."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()
