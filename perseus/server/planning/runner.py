"""Planning runs: frontiers computed in processes of their own, within limits, fairly.

:class:`PlanningRunner` computes frontiers in processes of their own (one per run, within
a time and a memory limit), never on the event loop, keeps a reference to every background
task, renews a heartbeat for the jobs it computes and takes over jobs whose owner stopped
(a crashed or restarted server). A job deleted while it waits or runs stops at once: its
place in the queue or its planning process goes (deleted through another server process:
at the next heartbeat, within ``lease_s / 3``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool

from perseus.core.errors import PerseusError
from perseus.server.api.metrics import Metrics
from perseus.server.lifecycle.lease import PlanningLease
from perseus.server.planning.worker import (
    PlanningFailure,
    PlanningInput,
    PlanningResult,
    PlanningWork,
    planning_process,
    sample_planning_work,
)
from perseus.server.runtime import JobHeads
from perseus.server.store.job_store import JobRow
from perseus.server.store.storage import StorageFault
from perseus.solver.deadlines import MAX_CELLS

__all__ = ["PlanningProcess", "PlanningRunner"]

log = logging.getLogger("perseus.server")

# The database cannot be written now: the store's own fault (SQLite: a full disk, a read-only
# file) or the driver's (PostgreSQL: a full disk, a lost connection). Temporary, never the
# planning's verdict on a job.
_STORAGE_ERRORS = (StorageFault, OperationalError)

# Planning runs at this lower CPU priority than the server (see planning.init_worker).
_WORKER_NICENESS = 19
# Jobs estimated at most this share of the work limit may use the extra small-job turn.
_SMALL_SHARE = 16
# A planning process whose peak memory passed this exits after its run (memory back to the
# host); smaller ones serve the next run (no start, ~0.7 s of CPU, per job).
_RETIRE_BYTES = 1 << 30
# How long a planning process that closed its pipe may take to be reaped. A SIGKILLed one
# still runs its own exit (unmapping its memory) at its niceness, 19, on cores kept busy at
# normal priority. (The "over 30 s" once seen was most likely the two-thread reap below.)
_REAP_S = 90.0
# multiprocessing reaps a child from whichever thread asks first: ``Process.start`` polls
# every earlier child, and so do ``is_alive`` and ``join``. When two threads reap one child
# at once, the loser's ``waitpid`` fails and it sees no exit code (the planning process
# then read as "still not gone" at once). Every call that may reap ours holds this lock.
_REAPING = threading.Lock()
# A process whose sentinel closed is exiting: the kernel reaps it within this.
_EXITING_S = 5.0


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
        clock_change_delay_s: the clock-change delay a job is planned for while none of its
            ranks reported a measured latency (0: plan without).
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
        clock_change_delay_s: float = 0.0,
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
        self._delay_s = clock_change_delay_s
        self._small_cells = (max_cells or MAX_CELLS) // _SMALL_SHARE
        # spawn: a fresh interpreter, no copy of the server's threads, sockets or locks.
        self._context = multiprocessing.get_context("spawn")
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs: dict[str, asyncio.Task[None]] = {}  # each job's planning task
        self._computing: set[str] = set()
        self._running: dict[str, PlanningProcess] = {}
        self._queue: list[_Queued] = []
        self._arrivals = itertools.count()
        self._busy = 0
        self._small_busy = False
        self._idle: list[PlanningProcess] = []  # started, solver imported, waiting
        self._starting = False
        self._closing = False
        self._maintenance: asyncio.Task[None] | None = None
        self.after_plan: Callable[[], Awaitable[object]] | None = None
        """Awaited once a planning run stored its frontier or failed (the cluster budget
        re-balances then)."""
        if warm:
            self._idle.append(self._new_process())

    @property
    def computing(self) -> frozenset[str]:
        """Ids of the jobs this process is computing (queued or running)."""
        return frozenset(self._computing)

    @property
    def processes(self) -> dict[str, int]:
        """Process id of every running planning run, by job id (readable from any thread: the
        copy is taken at once, while the event loop may change the runs)."""
        running = dict(self._running)
        return {job_id: p.pid for job_id, p in running.items()}

    def start(self, job_id: str) -> None:
        """Compute the frontier of a job this process claimed, in the background."""
        self._computing.add(job_id)
        task = self._spawn(self._run(job_id), f"planning {job_id}")
        self._runs[job_id] = task
        task.add_done_callback(lambda t: self._forget_run(job_id, t))

    def cancel(self, job_id: str) -> bool:
        """Stop a job's planning, queued or running (its process is killed): the job was
        deleted, and nothing would store what the run computes.

        Returns:
            Whether this process was planning the job.
        """
        task = self._runs.pop(job_id, None)
        self._computing.discard(job_id)
        if task is None or task.done():
            return False
        task.cancel()
        log.info("job %s: deleted; its planning stopped", job_id)
        return True

    def _forget_run(self, job_id: str, task: asyncio.Task[None]) -> None:
        if self._runs.get(job_id) is task:
            del self._runs[job_id]

    def start_maintenance(self) -> None:
        """Heartbeats for our jobs and takeover of abandoned ones, every ``lease_s / 3``."""
        self._maintenance = asyncio.create_task(self._maintain(), name="planning maintenance")

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def _run(self, job_id: str) -> None:
        started_s = time.perf_counter()
        try:
            planning = await run_in_threadpool(self._service.planning_input, job_id)
            planning = dataclasses.replace(
                planning,
                polish_s=self._polish_s,
                max_cells=self._max_cells,
                # The largest latency the ranks measured, else the server's setting.
                clock_change_delay_s=(
                    self._delay_s if planning.measured_delay is None else planning.measured_delay[1]
                ),
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
                row = await self._store_frontier(
                    job_id,
                    lambda: self._service.finish_planning(
                        job_id, outcome.frontier_json, planning_s, outcome.frontier, planning
                    ),
                )
                self._metrics.observe_planning(planning_s, ok=True)
                log.info("job %s: frontier computed in %.2f s", job_id, planning_s)
                reason = None
        except asyncio.CancelledError:
            raise
        except _STORAGE_ERRORS as exc:
            # Reading the input failed: the job stays planning, its lease lapses (no more
            # heartbeats) and it is planned again.
            log.warning(
                "job %s: planning could not read the database (%s); left to the planning lease",
                job_id,
                _first_line(exc),
            )
            reason, row = None, None
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
            try:
                row = await run_in_threadpool(self._service.fail_planning, job_id, reason)
            except _STORAGE_ERRORS as exc:
                # Not a verdict on the job: it stays planning, and once its lease lapses it
                # is planned again (and fails again, then stored) when the storage is back.
                log.warning(
                    "job %s: could not store the failure (%s); left to the planning lease",
                    job_id,
                    _first_line(exc),
                )
                return
        if row is not None:
            self._heads.put(row)
            if self.after_plan is not None:
                await self.after_plan()
        if reason is None and row is not None:
            await self._replan_if_outgrown(job_id)

    async def _replan_if_outgrown(self, job_id: str) -> None:
        """Plan again at once if a rank reported, while this run computed, a clock-change
        latency materially above the delay it planned for (a report that arrives while
        the job is planning claims nothing: the job is not ready)."""
        try:
            row = await run_in_threadpool(self._service.claim_outgrown_delay, job_id)
        except Exception as exc:  # the frontier stands; the next report tries again
            log.warning("job %s: could not check the clock-change delay: %s", job_id, exc)
            return
        if row is not None:
            self._heads.put(row)
            self.start(job_id)

    async def _store_frontier(
        self, job_id: str, store: Callable[[], JobRow | None]
    ) -> JobRow | None:
        """``store()``, retried while the database cannot be written (a full disk, a lost
        connection): a storage fault is temporary, never the job's failure. The job stays
        among those this process computes meanwhile, so heartbeats keep its lease where
        they can; retries stop once ``store()`` says the job is no longer this process's
        (None: deleted, or taken over after missed heartbeats).
        """
        delay_s = 0.5
        while True:
            try:
                return await run_in_threadpool(store)
            except _STORAGE_ERRORS as exc:
                log.warning(
                    "job %s: storing the frontier failed (%s); retrying in %.1f s",
                    job_id,
                    _first_line(exc),
                    delay_s,
                )
            await asyncio.sleep(delay_s)
            delay_s = min(2 * delay_s, max(self._lease_s / 3, 0.5))

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

    def _new_process(self) -> PlanningProcess:
        return PlanningProcess(self._context, self._memory_bytes)

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
                    computing = sorted(self._computing)
                    await run_in_threadpool(self._service.heartbeat, computing)
                    # Deleted through another server process, or taken over: stop.
                    for job_id in await run_in_threadpool(self._service.lost, computing):
                        self.cancel(job_id)
                for row in await run_in_threadpool(self._service.reclaim_stale, self._lease_s):
                    self._heads.put(row)
                    if row.id in self._computing:
                        continue  # its run here still stores its result (heartbeats failed)
                    log.warning("job %s: taking over planning from a silent server", row.id)
                    self.start(row.id)
            except _STORAGE_ERRORS as exc:
                log.warning("planning maintenance: %s; retrying", _first_line(exc))
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


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _kill_started(starting: asyncio.Future[PlanningProcess]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        starting.result().kill()


@dataclasses.dataclass(eq=False)
class _Queued:
    """A planning run waiting for its turn."""

    due_s: float  # arrival + estimated seconds: shortest first, and none waits forever
    arrival: int
    small: bool
    turn: asyncio.Future[bool]  # set when it may run: True for the small-job turn


class PlanningProcess:
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
        with _REAPING:
            self._process.start()
        child.close()  # ours closed: the process's death ends our recv with EOFError

    @property
    def pid(self) -> int:
        return int(self._process.pid or 0)

    def alive(self) -> bool:
        with _REAPING:
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
        with _REAPING:
            if self._process.is_alive():
                self._process.kill()

    def _reap(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the process to end (blocks).

        Returns:
            Its exit code (negative: the signal that killed it); None while it runs.
        """
        # The wait is outside the lock: other processes start meanwhile.
        if not multiprocessing.connection.wait([self._process.sentinel], timeout_s):
            return None
        with _REAPING:
            self._process.join(_EXITING_S)
            code: int | None = self._process.exitcode
            return code

    def death(self) -> str:
        """Why the process ended, for people (after it did; blocks until it is reaped)."""
        code = self._reap(_REAP_S)
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
        self._reap(_EXITING_S)
        self._conn.close()
