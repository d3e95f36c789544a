"""What a planning worker process runs: plain data in, frontier JSON out.

The server hands :func:`compute_frontier_json` a :class:`PlanningInput` (every rank's
profile rows and the schedule) through a process pool, so the frontier never runs on the
event loop and a crash in the solver cannot take the server down.

How a stage's profile combines its ranks is in :mod:`perseus.server.planning.stage_profiles`, the
estimate of a run's work and the planner's limit on it in :mod:`perseus.server.planning.work`;
their names are re-exported here.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import resource
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S
from perseus.core.errors import PerseusError, ProfileError
from perseus.server.planning.stage_profiles import (
    NO_P_BLOCK,
    PlanningInput,
    RankProfile,
    StoredProfile,
    combine_profiles,
    merged_profile,
    stage_p_block_w,
    unprofiled_stages,
)
from perseus.server.planning.work import (
    DEFAULT_MAX_CELLS,
    InstructionTimes,
    PlanningWork,
    check_planning_work,
    estimate_planning_work,
    instruction_times,
    size_text,
)

if TYPE_CHECKING:
    from perseus.solver import Frontier

log = logging.getLogger("perseus.server")

__all__ = [
    "DEFAULT_MAX_CELLS",
    "InstructionTimes",
    "PlanningFailure",
    "PlanningInput",
    "PlanningResult",
    "PlanningWork",
    "RankProfile",
    "StoredProfile",
    "check_planning_work",
    "combine_profiles",
    "estimate_planning_work",
    "failure_reason",
    "init_worker",
    "instruction_times",
    "merged_profile",
    "plan_frontier",
    "planning_process",
    "sample_planning_work",
    "stage_p_block_w",
    "unprofiled_stages",
    "warm_up",
]


@dataclass(frozen=True)
class PlanningResult:
    """The frontier, as JSON text (stored) and as an object (cached; numpy pickles fast)."""

    frontier_json: str
    frontier: Frontier


def plan_frontier(inp: PlanningInput) -> PlanningResult:
    """Compute the job's time-energy frontier; runs in a worker process.

    Returns:
        The frontier and its ``perseus.frontier/1`` text
        (``perseus.formats.plan_files.frontier_to_json``).

    Raises:
        ProfileError, ScheduleError: the profiles or schedule are unusable.
        PlanningTooLarge: the work estimate is over ``inp.max_cells``.
    """
    from perseus.solver import compute_frontier, make_schedule

    profile = merged_profile(inp)
    p_block_w = profile.p_block_w
    if p_block_w is None:
        raise ProfileError(NO_P_BLOCK)
    if inp.max_cells is not None:
        # Again here, on every rank's rows combined: the job may have been admitted by
        # another server, or planned on request (plan:compute) with the profiles in so far.
        check_planning_work(
            stages=inp.stages,
            microbatches=inp.microbatches,
            virtual_stages=inp.virtual_stages,
            times=[
                InstructionTimes(
                    stage,
                    name,
                    min(o.time_s for o in options),
                    max(o.time_s for o in options),
                    len(options),
                )
                for stage, by_name in enumerate(profile.stages)
                for name, options in by_name.items()
                if options
            ],
            resolution_s=inp.resolution_s,
            max_cells=inp.max_cells,
            schedule=inp.schedule,
        )
    schedule = make_schedule(inp.schedule, inp.stages, inp.microbatches, inp.virtual_stages)
    frontier = compute_frontier(
        profile,
        schedule,
        p_block_w=p_block_w,
        resolution_s=inp.resolution_s,  # None: the solver's default, following the job
        polish_s=inp.polish_s,
        max_cells=inp.max_cells,  # the server's own limit (checked above), or none
        # ranks aim every clock change this far ahead of its boundary: plan with its tails
        clock_change_margin_s=CLOCK_CHANGE_MARGIN_S,
        # and every run of one clock long enough for its changes to land in turn
        clock_change_delay_s=inp.clock_change_delay_s,
    )
    from perseus.formats.plan_files import frontier_to_json

    return PlanningResult(frontier_to_json(frontier), frontier)


def sample_planning_work(inp: PlanningInput) -> PlanningWork:
    """A quick estimate from one profile per stage, for ordering the planning queue.

    Decodes ``stages`` profiles rather than every rank's: cheap enough for the server
    process. Ranks of one stage measure alike, so this is close to the full estimate
    (:func:`plan_frontier` checks the limit on all of them).

    Complexity: O(stages x rows of one profile).
    """
    first: dict[int, StoredProfile] = {}
    for stored in inp.profiles:
        first.setdefault(stored.stage, stored)
    return estimate_planning_work(
        stages=inp.stages,
        microbatches=inp.microbatches,
        virtual_stages=inp.virtual_stages,
        times=[
            t
            for stored in first.values()
            for t in instruction_times(stored.stage, stored.decode().rows)
        ],
        resolution_s=inp.resolution_s,
        polish_s=inp.polish_s,
        schedule=inp.schedule,
    )


@dataclass(frozen=True, slots=True)
class PlanningFailure:
    """Why a planning run failed, as the job's ``reason`` says it.

    Attributes:
        reason: one line for people: what failed and what to change.
        internal: a bug (not the job's inputs): the server logs it as an error.
        details: for an internal error, the traceback (logged, never shown to callers).
    """

    reason: str
    internal: bool = False
    details: str = ""


def failure_reason(exc: BaseException, memory_limit_bytes: int | None) -> PlanningFailure:
    """The readable reason for an exception a planning run raised (never numpy's text)."""
    if isinstance(exc, MemoryError):
        limit = (
            f"its memory limit of {size_text(memory_limit_bytes)} (setting planning_memory_mb)"
            if memory_limit_bytes is not None
            else "the memory available"
        )
        return PlanningFailure(
            f"planning ran out of memory: it needed more than {limit}; use fewer "
            "microbatches or a coarser resolution_s"
        )
    if isinstance(exc, PerseusError):
        return PlanningFailure(f"{type(exc).__name__}: {exc}")
    return PlanningFailure(
        f"internal error while planning: {type(exc).__name__}: {str(exc)[:200]}",
        internal=True,
        details="".join(traceback.format_exception(exc)),
    )


def planning_process(conn: Connection, niceness: int, memory_limit_bytes: int | None) -> None:
    """Body of a planning process: set up, then plan each job that arrives on ``conn``.

    Answers each job with ``(PlanningResult or PlanningFailure, peak memory in bytes)``;
    exits when the server closes the connection (or dies). The server kills the process to
    stop a run. ``memory_limit_bytes`` caps its data segment (``RLIMIT_DATA``: heap and
    anonymous mappings, what numpy allocates), so a run over it gets a MemoryError,
    reported as such, rather than the host's OOM killer.
    """
    init_worker(niceness)
    warm_up()
    if memory_limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit_bytes, memory_limit_bytes))
    while True:
        try:
            inp = conn.recv()
        except EOFError:  # the server stopped, or retired this process
            return
        outcome: PlanningResult | PlanningFailure
        try:
            outcome = plan_frontier(inp)
        except Exception as exc:  # reported to the server, which logs it
            outcome = failure_reason(exc, memory_limit_bytes)
            del exc  # free what the failed run allocated before pickling the answer
        peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        try:
            conn.send((outcome, peak_bytes))
        except MemoryError:
            conn.send((failure_reason(MemoryError(), memory_limit_bytes), peak_bytes))
        del inp, outcome


def init_worker(niceness: int) -> None:
    """Set up a planning worker process (runs once in each, first thing).

    Lowers the worker's CPU priority by ``niceness``: a frontier is background work, and
    requests (plan fetches, telemetry) must keep their latency while one is computed on a
    machine with few cores. And exits when the server process dies, even killed with
    SIGKILL, so that no orphaned workers linger.
    """
    if niceness > 0:
        os.nice(niceness)
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def exit_with_parent() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=exit_with_parent, name="exit with server", daemon=True).start()


def warm_up() -> None:
    """Import the solver and load its compiled kernels (numba; about 0.6 s from its cache, the
    first time on an installation 6-15 s to compile), so that no job pays for them; from then
    on this process plans every job with them, small ones too (see
    :func:`perseus.solver.planner.warm_kernels`). Where that fails, the process still plans:
    small jobs with numpy's passes, large ones compiling what they use."""
    from perseus.solver import planner

    try:
        planner.warm_kernels()
    except Exception:
        log.warning(
            "planning process: the solver's compiled kernels could not be loaded ahead of "
            "jobs; small jobs plan with numpy's passes",
            exc_info=True,
        )
