"""The server's asynchronous machinery: cached job state, telemetry batches, planning.

:class:`JobHeads` keeps each job's row in memory so that plan fetches need no database
round trip. Changes made by this process are written through at once and wake long polls;
changes made by other server processes (several workers, several hosts) are picked up when
a cached row is older than ``cache_ttl_s``.

:class:`TelemetryBuffer` writes iteration reports in batches.

:class:`PlanningRunner` computes frontiers in processes of their own (one per run, within
a time and a memory limit), never on the event loop, keeps a reference to every background
task, renews a heartbeat for the jobs it computes and takes over jobs whose owner stopped
(a crashed or restarted server).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from perseus.errors import JobNotFound, JobStateError, PerseusError
from perseus.schemas import IterationReport
from perseus.server.choices import PlanChoices
from perseus.server.jobs import Jobs
from perseus.server.lease import PlanningLease
from perseus.server.metrics import Metrics
from perseus.server.planning import (
    PlanningFailure,
    PlanningInput,
    PlanningResult,
    PlanningWork,
    planning_process,
    sample_planning_work,
)
from perseus.server.store import JobRow
from perseus.server.telemetry import IterationLog
from perseus.solver.deadlines import MAX_CELLS

__all__ = ["Coalescer", "JobHeads", "PlanningRunner", "TelemetryBuffer"]

log = logging.getLogger("perseus.server")

T = TypeVar("T")

RankPlace = tuple[int, int, str | None]
"""A registered rank's ``(stage, data_parallel_rank, host)``."""

# Planning runs at this lower CPU priority than the server (see planning.init_worker).
_WORKER_NICENESS = 19
# Jobs estimated at most this share of the work limit may use the extra small-job turn.
_SMALL_SHARE = 16
# A planning process whose peak memory passed this exits after its run (memory back to the
# host); smaller ones serve the next run (no start, ~0.7 s of CPU, per job).
_RETIRE_BYTES = 1 << 30
# How long a planning process that closed its pipe may take to be reaped (a SIGKILLed one is
# reaped at once; a loaded host can take seconds).
_REAP_S = 30.0


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
    (:meth:`perseus.server.store.Store.listen`) wakes the wait at once.

    Args:
        jobs: the jobs (their methods run in the thread pool).
        ttl_s: how long a cached row is trusted without re-reading the database.
        poll_s: how often waited-for jobs are checked for changes made elsewhere.
    """

    def __init__(self, jobs: Jobs, ttl_s: float, poll_s: float = 0.1) -> None:
        self._jobs = jobs
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
        self._rows[row.id] = (time.monotonic(), row)
        if old is None or (old[1].version, old[1].state) != (row.version, row.state):
            self._wake(row.id)

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


class PlanningRunner:
    """Computes frontiers in worker processes, within limits, fairly, and stores them.

    Each planning run has a process to itself (no pool): a run that passes ``timeout_s``
    is stopped by killing its process; one that needs more than ``memory_mb`` fails with a
    MemoryError inside it (``RLIMIT_DATA``); either way, and when a process dies of anything
    else, only that job fails, with a reason that names the limit and what to change, and
    no other job notices. A process that ended its run normally serves the next one (it
    exits instead once it has used over 1 GiB), and with ``warm`` one more waits, solver
    imported, so that a job rarely pays for a start (about 0.7 s of CPU).

    Fairness: ``workers`` runs at a time, taken from the queue by ``arrival + estimated
    seconds`` (short jobs first, and no job waits forever). When every worker is busy, one
    more process runs a small job (at most 1/16 of ``max_cells``): a small job waits for
    another small one at most, never for a large one's ``timeout_s``.

    Args:
        service: the planning lease (inputs, results, heartbeats).
        heads: the row cache to update when a job's planning ends.
        metrics: where planning durations go.
        workers: planning runs at a time (besides the one for small jobs).
        lease_s: a job whose planning heartbeat is older than this is taken over.
        warm: keep a planning process started (and the solver imported) ahead of jobs.
        polish_s: seconds each frontier may spend improving its no-slowdown point.
        timeout_s: wall-clock limit of one planning run (None: none).
        memory_mb: memory (data segment) limit of one planning process (None: none).
        max_cells: jobs whose estimated work is over this fail at once (None: none).
    """

    def __init__(
        self,
        service: PlanningLease,
        heads: JobHeads,
        metrics: Metrics,
        *,
        workers: int,
        lease_s: float,
        warm: bool,
        polish_s: float = 0.0,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        max_cells: int | None = None,
    ) -> None:
        self._service = service
        self._heads = heads
        self._metrics = metrics
        self._workers = workers
        self._lease_s = lease_s
        self._warm = warm
        self._polish_s = polish_s
        self._timeout_s = timeout_s
        self._memory_bytes = None if memory_mb is None else memory_mb * 2**20
        self._max_cells = max_cells
        self._small_cells = (max_cells or MAX_CELLS) // _SMALL_SHARE
        # spawn: a fresh interpreter, no copy of the server's threads, sockets or locks.
        self._context = multiprocessing.get_context("spawn")
        self._tasks: set[asyncio.Task[None]] = set()
        self._computing: set[str] = set()
        self._running: dict[str, _PlanningProcess] = {}
        self._queue: list[_Queued] = []
        self._arrivals = itertools.count()
        self._busy = 0
        self._small_busy = False
        self._idle: list[_PlanningProcess] = []  # started, solver imported, waiting
        self._starting = False
        self._closing = False
        self._maintenance: asyncio.Task[None] | None = None
        if warm:
            self._idle.append(self._new_process())

    @property
    def computing(self) -> frozenset[str]:
        """Ids of the jobs this process is computing (queued or running)."""
        return frozenset(self._computing)

    @property
    def processes(self) -> dict[str, int]:
        """Process id of every running planning run, by job id."""
        return {job_id: p.pid for job_id, p in self._running.items()}

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
        try:
            planning = await run_in_threadpool(self._service.planning_input, job_id)
            planning = dataclasses.replace(
                planning, polish_s=self._polish_s, max_cells=self._max_cells
            )
            work = await run_in_threadpool(sample_planning_work, planning)
            small = await self._slot(work)
            try:
                outcome = await self._compute(job_id, planning)
            finally:
                self._release(small)
            if isinstance(outcome, PlanningFailure):
                if outcome.internal:
                    log.error("job %s: %s\n%s", job_id, outcome.reason, outcome.details)
                reason = outcome.reason
            else:
                planning_s = time.perf_counter() - started_s
                row = await run_in_threadpool(
                    self._service.finish_planning,
                    job_id,
                    outcome.frontier_json,
                    planning_s,
                    outcome.frontier,
                )
                self._metrics.observe_planning(planning_s, ok=True)
                log.info("job %s: frontier computed in %.2f s", job_id, planning_s)
                reason = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, PerseusError):
                reason = f"{type(exc).__name__}: {exc}"
            else:
                log.error("job %s: planning failed", job_id, exc_info=exc)
                reason = f"internal error while planning: {type(exc).__name__}: {exc}"
        finally:
            self._computing.discard(job_id)
        if reason is not None:
            self._metrics.observe_planning(time.perf_counter() - started_s, ok=False)
            log.warning("job %s: planning failed: %s", job_id, reason)
            row = await run_in_threadpool(self._service.fail_planning, job_id, reason)
        if row is not None:
            self._heads.put(row)

    async def _slot(self, work: PlanningWork) -> bool:
        """Wait for a turn to run; True when it is the extra turn for small jobs."""
        entry = _Queued(
            due_s=time.monotonic() + work.seconds,
            arrival=next(self._arrivals),
            small=work.cells <= self._small_cells,
            turn=asyncio.get_running_loop().create_future(),
        )
        self._queue.append(entry)
        self._dispatch()
        try:
            return await entry.turn
        except asyncio.CancelledError:
            if entry in self._queue:
                self._queue.remove(entry)
            elif entry.turn.done() and not entry.turn.cancelled():
                self._release(entry.turn.result())
            raise

    def _dispatch(self) -> None:
        self._queue.sort(key=lambda e: (e.due_s, e.arrival))
        while self._queue:
            if self._busy < self._workers:
                self._busy += 1
                self._queue.pop(0).turn.set_result(False)
            elif not self._small_busy and (
                entry := next((e for e in self._queue if e.small), None)
            ):
                self._small_busy = True
                self._queue.remove(entry)
                entry.turn.set_result(True)
            else:
                return

    def _release(self, small: bool) -> None:
        if small:
            self._small_busy = False
        else:
            self._busy -= 1
        self._dispatch()

    async def _compute(
        self, job_id: str, planning: PlanningInput
    ) -> PlanningResult | PlanningFailure:
        """Run one job in a planning process, within its time limit."""
        worker = None
        while self._idle and worker is None:
            worker = self._idle.pop()
            if not worker.alive():
                await asyncio.to_thread(worker.close)
                worker = None
        if worker is None:
            worker = await asyncio.to_thread(self._new_process)
        if self._warm and not self._idle:
            self._spawn(self._add_spare(), "planning spare")  # ready for the next job
        self._running[job_id] = worker
        call = asyncio.ensure_future(asyncio.to_thread(worker.run, planning))
        reuse = False
        try:
            done, _ = await asyncio.wait({call}, timeout=self._timeout_s)
            if not done:
                return PlanningFailure(
                    f"planning took longer than its limit of {self._timeout_s:g} s "
                    "(setting planning_timeout_s) and was stopped; use fewer microbatches "
                    "or a coarser resolution_s"
                )
            try:
                outcome, peak_bytes = call.result()
            except (EOFError, OSError):
                # Reaping the dead process can take a moment: not on the event loop.
                return PlanningFailure(await asyncio.to_thread(worker.death))
            # A process that grew large gives its memory back to the host by exiting.
            reuse = peak_bytes <= _RETIRE_BYTES
            return outcome
        finally:
            del self._running[job_id]
            if reuse and not self._closing and len(self._idle) <= self._workers:
                self._idle.append(worker)
            else:
                worker.kill()
                await asyncio.wait({call})  # the thread ends once the process is gone
                if not call.cancelled():
                    call.exception()  # retrieved; a death is reported above
                await asyncio.to_thread(worker.close)

    def _new_process(self) -> _PlanningProcess:
        return _PlanningProcess(self._context, self._memory_bytes)

    async def _add_spare(self) -> None:
        if self._starting:
            return
        self._starting = True
        starting = asyncio.ensure_future(asyncio.to_thread(self._new_process))
        try:
            worker = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(_kill_started)  # closing: no process left behind
            raise
        finally:
            self._starting = False
        if self._closing or self._idle:
            worker.kill()
            await asyncio.to_thread(worker.close)
        else:
            self._idle.append(worker)

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
        """Stop background work and the planning processes.

        Jobs being computed stay ``planning``; with no heartbeat, the next server to run
        (or another one sharing the database) takes them over after ``lease_s``.
        """
        self._closing = True
        tasks = list(self._tasks)
        if self._maintenance is not None:
            tasks.append(self._maintenance)
        # A frontier can take minutes; do not make shutdown wait for it.
        for worker in self._running.values():
            worker.kill()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()
            await asyncio.to_thread(worker.close)


def _kill_started(starting: asyncio.Future[_PlanningProcess]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        starting.result().kill()


@dataclasses.dataclass(eq=False)
class _Queued:
    """A planning run waiting for its turn."""

    due_s: float  # arrival + estimated seconds: shortest first, and none waits forever
    arrival: int
    small: bool
    turn: asyncio.Future[bool]  # set when it may run: True for the small-job turn


class _PlanningProcess:
    """One planning process: started ahead, given one job at a time; killed when it must stop.

    Args:
        context: the multiprocessing context (spawn).
        memory_bytes: the process's data-segment limit.
    """

    def __init__(self, context: Any, memory_bytes: int | None) -> None:
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=planning_process,
            args=(child, _WORKER_NICENESS, memory_bytes),
            name="perseus planning",
            daemon=True,
        )
        self._process.start()
        child.close()  # ours closed: the process's death ends our recv with EOFError

    @property
    def pid(self) -> int:
        return int(self._process.pid or 0)

    def alive(self) -> bool:
        return bool(self._process.is_alive())

    def run(self, planning: PlanningInput) -> tuple[PlanningResult | PlanningFailure, int]:
        """Hand the job over and wait (blocks: run it in a thread).

        Returns:
            The outcome and the process's peak memory so far, in bytes.

        Raises:
            EOFError, OSError: the process died.
        """
        self._conn.send(planning)
        answer: tuple[PlanningResult | PlanningFailure, int] = self._conn.recv()
        return answer

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()

    def death(self) -> str:
        """Why the process ended, for people (after it did; blocks until it is reaped)."""
        self._process.join(_REAP_S)
        code = self._process.exitcode
        if code == -signal.SIGKILL:
            # Not our memory limit (that is a MemoryError, reported by the process itself).
            how = "killed by SIGKILL: the host ran out of memory, or someone stopped it"
        elif code is not None and code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        elif code is None:
            how = f"it closed its pipe and was still not gone after {_REAP_S:g} s"
        else:
            how = f"exit code {code}"
        return f"the planning process died ({how}); no other job was affected"

    def close(self) -> None:
        """Reap the (killed) process and close the pipe; blocks briefly."""
        self._process.join(5.0)
        self._conn.close()


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
