"""One training rank: the hooks the training thread calls.

The training thread only ever does cheap things: at each instruction boundary it compares
the instruction with the plan, tells the controller which plan position started (one queued
tuple, no wait) and appends one log entry; at each iteration boundary it adopts the plan
chosen at the boundary before, hands the controller this iteration's plan and the next one's
(the controller aims every change from them), steps online profiling and queues its
telemetry, marked with the iteration's phase. Everything
slow runs elsewhere, one small class per thread or concern:

- :class:`Rank` (this module), **training thread**: the iteration and instruction hooks,
  following the plan, handing each instruction's clock to the controller;
- :class:`~perseus.client.profiling.online.OnlineProfiling`, **training thread, between
iterations**:
  the clock sweep, a state machine (:class:`~perseus.client.profiling.online.ProfilingState`);
- :class:`~perseus.client.session.Session`, thread ``perseus-session``: register, upload the
  profile, long-poll plans;
- :class:`~perseus.client.reporter.Reporter`, thread ``perseus-report``: iteration telemetry
  and the clock log;
- :class:`~perseus.client.gpu.meter.EnergyMeter`, its own thread: reads the energy counter;
- :class:`~perseus.client.clocks.controller.ClockController`, thread ``perseus-clocks``: requests
  each clock change ahead, a raise to land the margin before its boundary, a lowering the
  margin after it, so that no instruction runs slower than planned; reads the clock each
  instruction ran at its middle (on a simulated GPU, the simulation says).

They share one :class:`~perseus.client.state.RankState` (position, failure);
:func:`~perseus.client.lifecycle.connect`
builds a rank and puts the exit and signal hooks in place. Until the plan arrives, and
whenever anything fails, the GPU runs at its default clock.

Phases (each iteration report carries one): ``profiling`` while online profiling runs;
then ``baseline``: at least ``PERSEUS_BASELINE_ITERATIONS`` iterations at default clocks
(iterations waiting for a plan count too; a saved profile starts here), the baseline the
realized saving is measured against; ``plan`` while following a plan; ``default`` otherwise
(the plan stopped after a mismatch, profiling failed). A plan received is followed from the
iteration after the one that saw it, so that the change to its first clock can be aimed
from that iteration's last instruction like every other change.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType

from perseus.client.api.client import PlannerClient
from perseus.client.clocks.controller import BoundaryEvent, ClockController, LogEntry, Stamp
from perseus.client.gpu.control import GpuControl, open_gpu, work_observer
from perseus.client.gpu.meter import EnergyMeter
from perseus.client.profiling.online import (
    OnlineProfiling,
    ProfilingState,
    StreamSampler,
    WorkloadSource,
)
from perseus.client.profiling.profiler import StageProfile
from perseus.client.reporter import Reporter
from perseus.client.session import Session, read_saved_profile
from perseus.client.settings import ClientSettings
from perseus.client.state import ActivePlan, Expectation, RankState
from perseus.core.errors import GpuControlError, PerseusError
from perseus.core.pipeline import InstructionKind
from perseus.schemas import IterationPhase

__all__ = ["ActivePlan", "Expectation", "Rank"]

_log = logging.getLogger("perseus.client")


class _Instruction:
    """The reusable context manager the training thread enters for every instruction."""

    __slots__ = ("chunk", "kind", "microbatch", "rank")

    def __init__(self, rank: Rank) -> None:
        self.rank = rank
        self.kind: str = InstructionKind.FORWARD
        self.microbatch = 0
        self.chunk = 0

    def __enter__(self) -> None:
        self.rank._enter_instruction(self.kind, self.microbatch, self.chunk)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.rank._exit_instruction()


class _Iteration:
    __slots__ = ("rank",)

    def __init__(self, rank: Rank) -> None:
        self.rank = rank

    def __enter__(self) -> None:
        self.rank._enter_iteration()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.rank._exit_iteration(exc)


_NOTHING: AbstractContextManager[None] = nullcontext()


def _report_gave_up(settings: ClientSettings, planner: PlannerClient | None, why: str) -> None:
    """Tell the planner, from a thread of its own, that this rank is off and why (the job
    view lists it); a failure to is logged, never raised."""

    def report() -> None:
        client = planner or PlannerClient.open(
            settings.server or "", settings.job or "", settings.token or ""
        )
        try:
            client.report_gave_up(settings.rank, why)
        except PerseusError as err:
            _log.warning("perseus: could not tell the planner this rank is off: %s", err)
        finally:
            if planner is None:
                client.close()

    threading.Thread(target=report, name="perseus-gave-up", daemon=True).start()


class Rank:
    """perseus inside one training process. Create it with :func:`perseus.client.connect`.

    Use::

        rank = perseus.client.connect()
        with rank.iteration():
            with rank.instruction("forward", microbatch=j, chunk=c): ...
            with rank.instruction("backward", microbatch=j, chunk=c): ...
        rank.close()

    Without a server (``PERSEUS_SERVER`` unset) every method is a cheap no-op.
    """

    def __init__(
        self,
        settings: ClientSettings,
        *,
        gpu: GpuControl | None = None,
        planner: PlannerClient | None = None,
        workload: WorkloadSource = None,
        record_event: Callable[[], BoundaryEvent] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.active = settings.server is not None
        self._state = RankState(settings)
        self._closed = False
        # Re-entrant: a signal handler closes the rank on the main thread, which may be
        # inside close() already.
        self._close_lock = threading.RLock()
        self._iteration_cm = _Iteration(self)
        self._instruction_cm = _Instruction(self)
        self.iteration_index = 0
        # Training-thread state.
        self._plan: ActivePlan | None = None
        self._upcoming: ActivePlan | None = None  # the plan the next iteration follows
        self._k = 0
        self._count = 0  # instructions the last iteration ran
        self._phase: IterationPhase = "default"
        self._baseline_done = 0
        self._planned_before = False
        self._entries: list[LogEntry] | None = None
        self._entry: LogEntry | None = None  # the running instruction's (simulated GPU)
        self._t_first: Stamp | None = None
        self._sampler: StreamSampler | None = None
        if not self.active:
            return
        saved = read_saved_profile(settings)
        if gpu is None:
            try:
                gpu = open_gpu(
                    settings.gpu, settings.gpu_index, fake_clock_delay_s=settings.fake_clock_delay_s
                )
            except GpuControlError as err:
                if settings.strict:
                    raise
                # perseus never stops training: without a GPU to drive there is nothing to
                # plan, so the rank is off, and says so in one line (no traceback).
                self.active = False
                self._state.failure = f"the GPU cannot be controlled: {err}"
                _log.error(
                    "perseus: rank %d: %s; training goes on at default clocks "
                    "(PERSEUS_STRICT=1 makes this fatal)",
                    settings.rank,
                    self._state.failure,
                )
                _report_gave_up(settings, planner, self._state.failure)
                return
        self._gpu = gpu
        self._observer = work_observer(self._gpu)
        if self._observer is not None:
            record_event = None  # its work runs on this thread: no device stream to mark
        self._meter = EnergyMeter(self._gpu, clock=clock)
        self._controller = ClockController(
            self._gpu, record_event, clock=clock, latency_s=settings.clock_latency_s
        )
        self._planner = planner or PlannerClient.open(
            settings.server or "", settings.job or "", settings.token or ""
        )
        self._stop = threading.Event()
        self._session = Session(
            self._state, self._planner, self._gpu, self._observer, self._stop, saved
        )
        self._reporter = Reporter(
            settings,
            self._planner,
            self._meter,
            self._session.registered,
            self._stop,
            clock=clock,
            latency=lambda: self._controller.latency.measured_s,
        )
        self._profiling = OnlineProfiling(
            self._state,
            self._gpu,
            self._meter,
            self._controller,
            workload,
            self._session.submit_profile,
            initial=ProfilingState.SAVED if saved is not None else ProfilingState.PENDING,
            clock=clock,
        )
        self._meter.start()
        self._session.start()
        self._reporter.start()
        _log.info(
            "perseus: rank %d, GPU %d (%s, %s), planner %s, job %s",
            settings.rank,
            self._gpu.index,
            self._gpu.name,
            settings.gpu,
            settings.server,
            settings.job,
        )

    # ------------------------------------------------------------------ public API

    @property
    def settings(self) -> ClientSettings:
        """The rank's settings, with its position once known."""
        return self._state.settings

    @property
    def failure(self) -> str | None:
        """Why perseus stopped planning this rank, or why it refused the newest plan
        (training goes on at default clocks); None while it follows plans or waits for one."""
        state = self._state
        if state.failure is not None:
            return state.failure
        if state.rejection is not None:
            return state.rejection
        if self.active and not self._controller.enabled:
            return self._controller.failure
        return None

    @property
    def profile(self) -> StageProfile | None:
        """The profile measured online (None before, or with a saved profile)."""
        return self._profiling.profile if self.active else None

    @property
    def p_block_w(self) -> float | None:
        """The blocking power measured online, in watts (None before or unknown)."""
        return self._profiling.p_block_w if self.active else None

    @property
    def profiling_state(self) -> ProfilingState:
        """How far online profiling got."""
        return self._profiling.state if self.active else ProfilingState.OFF

    @property
    def gpu(self) -> GpuControl | None:
        """The GPU this rank drives (None when perseus is off)."""
        return self._gpu if self.active else None

    @property
    def controller(self) -> ClockController | None:
        """The clock controller of the GPU (None when perseus is off)."""
        return self._controller if self.active else None

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """The rank's session and reporter threads (none when perseus is off)."""
        if not self.active:
            return ()
        return (self._session.thread, self._reporter.thread)

    @property
    def plan_version(self) -> int | None:
        """The plan version the training thread follows now (None before a plan)."""
        return None if self._plan is None else self._plan.version

    @property
    def phase(self) -> IterationPhase:
        """What the current (or last) iteration runs: ``"baseline"`` (default clocks, before
        the first plan), ``"profiling"``, ``"plan"`` or ``"default"`` (anything else)."""
        return self._phase

    @property
    def baseline_iterations(self) -> int:
        """Baseline iterations run so far."""
        return self._baseline_done

    def iteration(self) -> AbstractContextManager[None]:
        """Bracket one training iteration (not re-entrant)."""
        return self._iteration_cm if self.active else _NOTHING

    def instruction(
        self, kind: InstructionKind | str, microbatch: int, chunk: int | None = None
    ) -> AbstractContextManager[None]:
        """Bracket one forward or backward of one microbatch (and model chunk).

        ``kind`` is an :class:`~perseus.core.pipeline.InstructionKind` (or its value);
        ``chunk`` None means chunk 0 (a schedule without model chunks).
        """
        if not self.active:
            return _NOTHING
        cm = self._instruction_cm
        cm.kind = kind
        cm.microbatch = microbatch
        cm.chunk = chunk or 0
        return cm

    def bind(
        self,
        *,
        stage: int | None = None,
        stages: int | None = None,
        schedule: str | None = None,
        microbatches: int | None = None,
        virtual_stages: int | None = None,
        workload: WorkloadSource = None,
    ) -> None:
        """Tell the rank what the framework knows (called by the integrations).

        ``stage`` fills in the rank's pipeline stage if the settings did not give one;
        the rest is checked against the job on the server.
        """
        if not self.active:
            return
        state = self._state
        if stage is not None and state.settings.stage is None:
            state.settings = state.settings.with_position(stage=stage)
            state.position_ready.set()
        elif stage is not None and stage != state.settings.stage:
            state.give_up(
                f"the framework runs pipeline stage {stage}, the settings or the job's layout "
                f"give {state.settings.stage}: set PERSEUS_STAGE"
            )
        e = state.expect
        state.expect = Expectation(
            schedule=schedule or e.schedule,
            stages=stages or e.stages,
            microbatches=microbatches or e.microbatches,
            virtual_stages=virtual_stages or e.virtual_stages,
        )
        if virtual_stages:
            state.scale = 1.0 / virtual_stages
        if workload is not None:
            self._profiling.workload = workload
        if self._observer is not None and state.settings.stage is not None and stages:
            self._observer.place(state.settings.stage, stages)
        if state.job is not None:
            state.check_job(state.job)

    def give_up(self, message: str) -> None:
        """Stop planning this rank for good (training goes on at default clocks)."""
        if self.active:
            self._state.give_up(message)

    def close(self, reason: str = "exit") -> None:
        """Stop every thread and reset the GPU's clocks (idempotent, never raises)."""
        with self._close_lock:
            if self._closed or not self.active:
                self._closed = True
                return
            self._closed = True
        self._stop.set()
        self._controller.close(reason)
        self._reporter.wake()
        for thread in self.threads:
            thread.join(timeout=2.0)
        self._meter.stop()
        self._reporter.close()
        with contextlib.suppress(Exception):  # closing a pool must not fail a shutdown
            self._planner.close()

    def emergency_reset(self, reason: str) -> None:
        """Reset the GPU's clocks at once and stop following plans (from a signal handler).

        No joins, no locks that the interrupted code may hold; never raises. Also once
        :meth:`close` has begun: it resets only after joining the clock thread (seconds),
        and the default handler ends the process before that.
        """
        if not self.active:
            return
        self._state.stopped = True
        self._controller.discard_pending()
        try:
            self._gpu.reset_clock()
            _log.warning("perseus: GPU %d clocks reset (%s)", self._gpu.index, reason)
        except Exception as err:  # from a signal handler: nothing may reach the training code
            _log.error("perseus: could not reset GPU %d clocks: %s", self._gpu.index, err)

    # ------------------------------------------------------------------ training thread

    def _enter_iteration(self) -> None:
        if self._closed:
            return
        if self.iteration_index >= 1:
            self._profiling.step()
            self._sampler = self._profiling.sampler
        state = self._state
        rejected = state.rejected_version
        if (
            state.stopped
            or not self._controller.enabled
            or (
                self._upcoming is not None
                and rejected is not None
                and self._upcoming.version <= rejected
            )
        ):
            # Not followed: neither the clock log nor telemetry may claim the plan's clocks.
            # A refused version supersedes the plans before it: default clocks until a newer.
            self._plan = self._upcoming = None
        else:
            # A plan is followed from the iteration after the one it was chosen in: that
            # iteration's last instruction aims the change to the plan's first clock.
            if self._upcoming is not None and self._plan is None:
                _log.info("perseus: following plan version %d", self._upcoming.version)
                state.rejection = None  # an older plan's refusal no longer holds
            self._plan = self._upcoming
        if self._plan is not None:
            self._phase = "plan"
            self._planned_before = True
        elif self._profiling.state in (ProfilingState.PENDING, ProfilingState.SWEEPING):
            self._phase = "profiling"
        elif (
            self._profiling.state in (ProfilingState.DONE, ProfilingState.SAVED)
            and not self._planned_before
            and not state.stopped
        ):
            self._phase = "baseline"
        else:
            self._phase = "default"
        pending = self._session.pending
        if (
            pending is not None
            and state.rejected_version is not None
            and pending.version <= state.rejected_version
        ):
            pending = None  # refused: the rank waits at default clocks for a newer one
        upcoming = self._plan
        baseline_done = self._baseline_done + 1 >= state.settings.baseline_iterations
        if (
            pending is not None
            and pending is not self._plan
            and not state.stopped
            and self._controller.enabled
            and (
                self._phase in ("plan", "default") or (self._phase == "baseline" and baseline_done)
            )
        ):
            upcoming = pending
        self._upcoming = upcoming
        if state.stopped:
            self._controller.follow(None, None, self._count)
        else:
            count = len(upcoming.keys) if upcoming is not None else self._count
            plan = self._plan
            self._controller.follow(plan, upcoming, len(plan.keys) if plan else count)
        self._k = 0
        self._t_first = None
        self._entries = [] if self._reporter.logs_clocks else None

    def _exit_iteration(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        if exc is not None:
            # Training failed: whatever happens next must not run at a low clock.
            self._controller.reset(f"exception in training: {type(exc).__name__}")
            return
        plan = self._plan
        stopped = self._state.stopped
        if plan is not None and not stopped and self._k != len(plan.keys):
            self._plan_mismatch(
                f"the iteration ran {self._k} instructions, plan version {plan.version} has "
                f"{len(plan.keys)}"
            )
        self._count = self._k
        if self._k:
            self._state.instructions = self._k
        phase = self._phase
        if phase == "plan" and (self._state.stopped or self._plan is None):
            phase = self._phase = "default"
        elif phase == "baseline":
            self._baseline_done += 1
        reporter = self._reporter
        if self._t_first is not None:
            end = self._controller.mark()
            progress = self._profiling.progress() if phase == "profiling" else None
            reporter.queue_iteration(
                self.iteration_index, self._t_first, end, self.plan_version, phase, progress
            )
        if self._sampler is not None:
            self._sampler.iteration_done()
        if self._entries is not None:
            version = None if self._state.stopped else self.plan_version
            reporter.queue_log(
                self.iteration_index, version, phase, self._entries, self._controller.fence()
            )
        reporter.wake()
        self.iteration_index += 1

    def _enter_instruction(self, kind: str, microbatch: int, chunk: int) -> None:
        controller = self._controller
        if self._t_first is None:
            self._t_first = controller.mark()
        observer = self._observer
        # The simulated work starts first: a change the controller issues as soon as this
        # instruction has started must find it running.
        if observer is not None:
            observer.begin(kind, self._state.scale)
        if self._sampler is not None:
            # Stamped before anything below can hand the interpreter to another thread (the
            # controller's queue wakes it): a stamp taken after such a switch lands up to
            # the switch interval (5 ms) late and shortens this instruction's in-stream time.
            self._sampler.begin(kind)
        k = self._k
        frequency: int | None = None
        plan = self._plan
        if plan is not None and not self._state.stopped and controller.enabled:
            keys = plan.keys
            if k < len(keys) and keys[k] == (kind, microbatch, chunk):
                frequency = plan.frequencies_mhz[k]
            else:
                expected_key = keys[k] if k < len(keys) else "nothing more"
                self._plan_mismatch(
                    f"instruction {k} of the iteration is {(kind, microbatch, chunk)}, plan "
                    f"version {plan.version} expects {expected_key}"
                )
        entries = self._entries
        entry = None
        if entries is not None:
            entry = LogEntry(kind, microbatch, chunk, frequency, None)
            entries.append(entry)
        if observer is None:
            controller.started(k, entry)  # the controller reads ran_mhz at its middle
        else:
            self._entry = entry  # the simulation says at end()
            controller.started(k)
        self._k = k + 1

    def _exit_instruction(self) -> None:
        if self._observer is not None:
            ran = self._observer.end()
            entry = self._entry
            if entry is not None:
                entry.ran_mhz = ran
                self._entry = None
        if self._sampler is not None:
            self._sampler.end()

    def _plan_mismatch(self, message: str) -> None:
        # This plan version is refused, not planning: a newer version that matches is
        # followed (the rank polls on); until then the GPU runs at its default clock.
        plan = self._plan
        self._plan = self._upcoming = None
        self._state.reject_plan(
            plan.version if plan is not None else None,
            f"the plan does not match the schedule that runs ({message}): check the job's "
            "schedule and microbatches",
        )
        self._controller.apply(None)
