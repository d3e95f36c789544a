"""One training rank: the training thread's hooks and the threads that serve them.

The training thread only ever does cheap things: at each instruction boundary it compares
the instruction with the plan, hands a clock to the :class:`ClockController` (skipped when
unchanged) and appends one log entry; at each iteration boundary it adopts a newer plan if
the session thread has one and queues its telemetry. Everything slow runs elsewhere:

- the **session** thread talks to the planner: it reads the job, registers the rank,
  uploads the profile, then long-polls for plans (with backoff and jitter while the planner
  is down, logging once per outage);
- the **reporter** thread posts iteration telemetry (a bounded queue: dropped, never
  blocking, when the planner is down) and writes the clock log;
- the **meter** thread reads the energy counter (:mod:`perseus.client.meter`);
- the **controller** thread sets clocks at CUDA events (:mod:`perseus.client.controller`).

Online profiling (:mod:`perseus.client.profiler`) runs on the training thread between
iterations, one clock per iteration boundary, from the second iteration on (the first one
captures a real microbatch for the profiling loops); training goes on between clocks. Until
the plan arrives, and whenever anything fails, the GPU runs at its default clock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing.util
import os
import random
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from perseus.client.controller import BoundaryEvent, ClockController, Stamp
from perseus.client.fake import FakeGpu, default_work
from perseus.client.gpu import GpuControl, GpuMode, open_gpu
from perseus.client.meter import EnergyMeter
from perseus.client.planner import Backoff, PlannerClient, retry_call
from perseus.client.profiler import (
    ClockMeasurement,
    ClockSweep,
    StageProfile,
    Workload,
    calibrated,
    device_work,
    measure_idle_power,
)
from perseus.client.settings import ClientSettings, SettingsError, load_settings
from perseus.errors import (
    AuthError,
    JobNotFound,
    PerseusError,
    PlanError,
    PlannerUnavailable,
    PlanNotReady,
    ProfileError,
)
from perseus.schemas import (
    IterationReport,
    JobView,
    PlanResponse,
    ProfileReport,
    ProfileRow,
    RankRegistration,
)

if TYPE_CHECKING:
    from perseus.solver.profiles import Profile

__all__ = ["Rank", "connect"]

_log = logging.getLogger("perseus.client")

Key = tuple[str, int, int | None]

_MIN_STREAM_SAMPLES = 5
_MAX_STREAM_SAMPLES = 256
_CALIBRATION_ITERATIONS = 3


@dataclass(frozen=True, slots=True)
class ActivePlan:
    """A plan as the training thread uses it: keys and clocks in execution order."""

    version: int
    keys: tuple[Key, ...]
    frequencies_mhz: tuple[int, ...]

    @classmethod
    def from_response(cls, plan: PlanResponse) -> ActivePlan:
        return cls(
            version=plan.version,
            keys=tuple((i.instruction, i.microbatch, i.chunk) for i in plan.instructions),
            frequencies_mhz=tuple(i.frequency_mhz for i in plan.instructions),
        )


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the framework integration knows about the schedule it runs."""

    schedule: str | None = None
    stages: int | None = None
    microbatches: int | None = None
    virtual_stages: int | None = None


class _Outage:
    """Logs once when the planner goes away and once when it is back."""

    def __init__(self) -> None:
        self.down_since: float | None = None

    def failed(self, err: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            _log.warning(
                "perseus: planner unavailable (%s); training goes on, retrying in the background",
                err,
            )

    def ok(self) -> None:
        if self.down_since is not None:
            _log.warning(
                "perseus: planner reachable again after %.0f s",
                time.monotonic() - self.down_since,
            )
            self.down_since = None


class _Instruction:
    """The reusable context manager the training thread enters for every instruction."""

    __slots__ = ("chunk", "kind", "microbatch", "rank")

    def __init__(self, rank: Rank) -> None:
        self.rank = rank
        self.kind = "forward"
        self.microbatch = 0
        self.chunk: int | None = None

    def __enter__(self) -> None:
        self.rank._enter_instruction(self.kind, self.microbatch, self.chunk)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.rank._exit_instruction(exc is not None)


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


class Rank:
    """perseus inside one training process. Create it with :func:`connect`.

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
        workload: Workload | Callable[[], Workload | None] | None = None,
        record_event: Callable[[], BoundaryEvent] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.active = settings.server is not None
        self._clock = clock
        self._closed = False
        # Re-entrant: a signal handler closes the rank on the main thread, which may be
        # inside close() already.
        self._close_lock = threading.RLock()
        self._iteration_cm = _Iteration(self)
        self._instruction_cm = _Instruction(self)
        self.iteration_index = 0
        self.failure: str | None = None
        """Why perseus stopped planning this rank (training goes on at default clocks)."""
        self.profile: StageProfile | None = None
        self.p_block_w: float | None = None
        self._expect = Expectation()
        self._scale = 1.0
        self._workload = workload
        # Training-thread state.
        self._plan: ActivePlan | None = None
        self._pending: ActivePlan | None = None
        self._plan_off = False
        self._k = 0
        self._entries: list[tuple[str, int, int | None, int | None]] = []
        self._t_first: Stamp | None = None
        self._profile_state = "off"
        self._sweep: ClockSweep | None = None
        self._reference: ClockMeasurement | None = None
        self._calibrating = False
        self._stream: dict[str, list[tuple[Stamp, Stamp]]] = {}
        self._stream_start: tuple[str, Stamp] | None = None
        self._calibration_waits = 0
        self._calibrated_iterations = 0
        self._profile_ready = threading.Event()
        self._pending_rows: tuple[list[ProfileRow], float | None] = ([], None)
        self._log_lock = threading.Lock()
        self._job: JobView | None = None
        self._position_ready = threading.Event()
        self._registered = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reports: deque[tuple[int, Stamp, Stamp, int | None]] = deque(
            maxlen=settings.telemetry_queue
        )
        self._logs: deque[tuple[int, int | None, list[tuple[str, int, int | None, int | None]]]] = (
            deque()
        )
        self._wake_reporter = threading.Event()
        if not self.active:
            return
        self._saved = _read_saved_profile(settings)
        self._gpu = gpu if gpu is not None else open_gpu(settings.gpu, settings.gpu_index)
        self._fake = self._gpu if isinstance(self._gpu, FakeGpu) else None
        if self._fake is not None:
            record_event = None  # the fake's clock is a memory write: set it inline
        self._meter = EnergyMeter(self._gpu, clock=clock)
        self._controller = ClockController(self._gpu, record_event, clock=clock)
        self._planner = planner or PlannerClient.open(
            settings.server or "", settings.job or "", settings.token or ""
        )
        self._profile_state = "saved" if settings.profile_path else "pending"
        self._log_file = None
        if settings.clock_log_dir:
            os.makedirs(settings.clock_log_dir, exist_ok=True)
            path = os.path.join(settings.clock_log_dir, f"rank{settings.rank}.jsonl")
            self._log_file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if settings.stage is not None:
            self._position_ready.set()
        self._meter.start()
        for target, name in (
            (self._session, "perseus-session"),
            (self._reporter, "perseus-report"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
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
    def gpu(self) -> GpuControl | None:
        """The GPU this rank drives (None when perseus is off)."""
        return self._gpu if self.active else None

    @property
    def plan_version(self) -> int | None:
        """The plan version the training thread follows now (None before a plan)."""
        return None if self._plan is None else self._plan.version

    def iteration(self) -> AbstractContextManager[None]:
        """Bracket one training iteration (not re-entrant)."""
        return self._iteration_cm if self.active else _NOTHING

    def instruction(
        self, kind: str, microbatch: int, chunk: int | None = None
    ) -> AbstractContextManager[None]:
        """Bracket one forward or backward of one microbatch (and model chunk)."""
        if not self.active:
            return _NOTHING
        cm = self._instruction_cm
        cm.kind = kind
        cm.microbatch = microbatch
        cm.chunk = chunk
        return cm

    def bind(
        self,
        *,
        stage: int | None = None,
        stages: int | None = None,
        schedule: str | None = None,
        microbatches: int | None = None,
        virtual_stages: int | None = None,
        workload: Workload | Callable[[], Workload | None] | None = None,
    ) -> None:
        """Tell the rank what the framework knows (called by the integrations).

        ``stage`` fills in the rank's pipeline stage if the settings did not give one;
        the rest is checked against the job on the server.
        """
        if not self.active:
            return
        if stage is not None and self.settings.stage is None:
            self.settings = self.settings.with_position(stage=stage)
            self._position_ready.set()
        elif stage is not None and stage != self.settings.stage:
            self._plan_off = True
            self._give_up(
                f"the framework runs pipeline stage {stage}, the settings or the job's layout "
                f"give {self.settings.stage}: set PERSEUS_STAGE"
            )
        self._expect = Expectation(
            schedule=schedule or self._expect.schedule,
            stages=stages or self._expect.stages,
            microbatches=microbatches or self._expect.microbatches,
            virtual_stages=virtual_stages or self._expect.virtual_stages,
        )
        if virtual_stages:
            self._scale = 1.0 / virtual_stages
        if workload is not None:
            self._workload = workload
        if self._fake is not None and self.settings.stage is not None and stages:
            self._fake.work = default_work(self.settings.stage, stages)
        if self._job is not None:
            self._check_job(self._job)

    def close(self, reason: str = "exit") -> None:
        """Stop every thread and reset the GPU's clocks (idempotent, never raises)."""
        with self._close_lock:
            if self._closed or not self.active:
                self._closed = True
                return
            self._closed = True
        self._stop.set()
        self._controller.close(reason)
        self._wake_reporter.set()
        for thread in self._threads:
            thread.join(timeout=2.0)
        self._meter.stop()
        self._drain_logs()
        with self._log_lock:
            if self._log_file is not None:
                with contextlib.suppress(OSError):  # reported by _write_logs already
                    self._log_file.close()
        with contextlib.suppress(Exception):  # closing a pool must not fail a shutdown
            self._planner.close()

    def _emergency_reset(self, reason: str) -> None:
        # From a signal handler: no joins, no locks that the interrupted code may hold. Also
        # when close() has begun: it resets only after joining the clock thread (seconds),
        # and the default handler ends the process before that.
        if self.active:
            self._plan_off = True
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
        if self.iteration_index >= 1 and self._profile_state in ("pending", "sweeping"):
            self._profile_step()
        pending = self._pending
        if pending is not None and pending is not self._plan and not self._plan_off:
            if self._plan is None:
                _log.info("perseus: following plan version %d", pending.version)
            self._plan = pending
        self._k = 0
        self._t_first = None
        self._entries = []

    def _exit_iteration(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        if exc is not None:
            # Training failed: whatever happens next must not run at a low clock.
            self._controller.reset(f"exception in training: {type(exc).__name__}")
            return
        plan = self._plan
        if plan is not None and not self._plan_off and self._k != len(plan.keys):
            self._plan_mismatch(
                f"the iteration ran {self._k} instructions, plan version {plan.version} has "
                f"{len(plan.keys)}"
            )
        if self._t_first is not None:
            end = self._controller.mark()
            self._reports.append((self.iteration_index, self._t_first, end, self.plan_version))
        if self._calibrating:
            self._calibrated_iterations += 1
            if self._calibrated_iterations == 1:
                # The first iteration under calibration still warms up (allocator, kernel
                # autotuning) and runs slower than the rest: its times would inflate the ratio.
                self._stream.clear()
        if self._log_file is not None:
            version = None if self._plan_off else self.plan_version
            self._logs.append((self.iteration_index, version, self._entries))
        self._wake_reporter.set()
        self.iteration_index += 1

    def _enter_instruction(self, kind: str, microbatch: int, chunk: int | None) -> None:
        if self._t_first is None:
            self._t_first = self._controller.mark()
        frequency: int | None = None
        plan = self._plan
        if plan is not None and not self._plan_off:
            k = self._k
            key = (kind, microbatch, chunk)
            if k < len(plan.keys) and plan.keys[k] == key:
                frequency = plan.frequencies_mhz[k]
            else:
                expected = plan.keys[k] if k < len(plan.keys) else "nothing more"
                self._plan_mismatch(
                    f"instruction {k} of the iteration is {key}, plan version {plan.version} "
                    f"expects {expected}"
                )
        self._controller.apply(frequency)
        if self._log_file is not None:
            self._entries.append((kind, microbatch, chunk, frequency))
        self._k += 1
        if self._calibrating:
            self._stream_start = (kind, self._controller.mark())
        if self._fake is not None:
            self._fake.begin(kind, self._scale)

    def _exit_instruction(self, failed: bool) -> None:
        if self._fake is not None:
            self._fake.end()
        if self._calibrating and self._stream_start is not None:
            kind, start = self._stream_start
            samples = self._stream.setdefault(kind, [])
            if len(samples) < _MAX_STREAM_SAMPLES:
                samples.append((start, self._controller.mark()))
            self._stream_start = None

    def _plan_mismatch(self, message: str) -> None:
        self._plan_off = True
        self.failure = (
            f"the plan does not match the schedule that runs ({message}); perseus stops "
            "changing clocks on this rank: check the job's schedule and microbatches"
        )
        _log.error("perseus: %s", self.failure)
        self._controller.apply(None)

    # ------------------------------------------------------------------ profiling

    def _profile_step(self) -> None:
        """One step of online profiling between iterations; never raises."""
        try:
            if self._sweep is not None and self.failure is not None:
                # perseus gave up meanwhile (the planner refused this rank, say): training goes
                # on at default clocks, so the sweep stops lowering them
                self._sweep = None
                self._calibrating = False
                self._profile_state = "failed"
                self._controller.reset()
                return
            if self._profile_state == "pending":
                self._start_profiling()
            if self._sweep is not None:
                measured = self._sweep.step()
                if measured is not None:
                    _log.debug(
                        "perseus: %d MHz: forward %.4f s %.3f J, backward %.4f s %.3f J",
                        measured.frequency_mhz,
                        measured.forward_time_s,
                        measured.forward_energy_j,
                        measured.backward_time_s,
                        measured.backward_energy_j,
                    )
                if self._sweep.done and self._calibration_ready():
                    self._finish_profiling(self._sweep.result())
        except Exception as err:  # profiling must never take training down
            self._profile_state = "failed"
            self._sweep = None
            self._controller.reset("profiling failed")
            self._give_up(f"online profiling failed: {type(err).__name__}: {err}")

    def _start_profiling(self) -> None:
        workload = self._workload
        if workload is not None and not hasattr(workload, "forward"):
            workload = workload()
        # Every rank takes part in the blocking-power collective, even one that has given
        # up: a rank that skipped it would leave its peers waiting in the barrier.
        self.p_block_w = self._measure_blocking_power()
        if self.failure is not None:
            self._profile_state = "failed"
            return
        if workload is None:
            self._profile_state = "failed"
            self._give_up(
                "nothing to profile: instrument a framework (perseus.client.torch_pipelining) "
                "or pass a workload or a saved profile (PERSEUS_PROFILE)"
            )
            return
        lock = self._gpu.can_set_clocks
        sweep = ClockSweep(
            self._gpu,
            self._meter,
            workload,  # type: ignore[arg-type]
            self.settings.budget,
            device_work(self._gpu),
            clock=self._clock,
            lock=lock,
        )
        _log.warning(
            "perseus: rank %d profiling %d clocks (%d-%d MHz) online: %s%s",
            self.settings.rank,
            len(sweep.clocks),
            sweep.clocks[-1],
            sweep.clocks[0],
            self.settings.budget.describe(),
            "" if lock else "; this GPU's clocks may not be changed: only the current clock",
        )
        # The reference for the in-stream calibration: the loops at the clock the GPU picks
        # by itself, the clock the training iterations during the sweep run at.
        self._reference = sweep.measure_unlocked() if lock else None
        self._sweep = sweep
        self._profile_state = "sweeping"
        self._calibrating = True

    def _finish_profiling(self, profile: StageProfile) -> None:
        self._sweep = None
        self._calibrating = False
        reference = self._reference or (profile.measurements[0] if profile.measurements else None)
        ratios = self._stream_ratios(reference) if reference is not None else {}
        if ratios:
            _log.warning(
                "perseus: rank %d in the training stream: forward x%.3f, backward x%.3f of the "
                "loop times at the default clock; profile scaled",
                self.settings.rank,
                ratios["forward"],
                ratios["backward"],
            )
            profile = calibrated(profile, ratios)
        self.profile = profile
        self._profile_state = "done"
        _log.warning(
            "perseus: rank %d profiled %d clocks (%s); blocking power %s",
            self.settings.rank,
            len(profile.measurements),
            profile.stopped,
            "unknown" if self.p_block_w is None else f"{self.p_block_w:.1f} W",
        )
        if len(profile.measurements) == 0:
            self._give_up("online profiling measured nothing")
            return
        for inverted in profile.inversions():
            # reported all the same: the planner has nothing better, and the operator is told
            _log.warning(
                "perseus: rank %d: %s; a lower clock never runs faster, so the measurement was "
                "disturbed (another process on this GPU?)",
                self.settings.rank,
                inverted,
            )
        self._report_profile(profile.rows(), self.p_block_w)

    def _calibration_ready(self) -> bool:
        """True once each kind has enough in-stream samples, or after a few more iterations.

        A short sweep (one clock on a GPU whose clocks may not change) ends before training
        ran any instruction under calibration; up to three more iterations give it some.
        """
        if all(
            len(self._stream.get(k, ())) >= _MIN_STREAM_SAMPLES for k in ("forward", "backward")
        ):
            return True
        self._calibration_waits += 1
        return self._calibration_waits > _CALIBRATION_ITERATIONS

    def _stream_ratios(self, reference: ClockMeasurement) -> dict[str, float]:
        """In-stream over loop time per kind, at the default clock; {} without enough data.

        Each instruction run during the sweep's training iterations was bracketed by two
        device stamps (:meth:`ClockController.mark`); a chunk of an interleaved stage costs
        its share of the stage.
        """
        loop = {
            "forward": reference.forward_time_s * self._scale,
            "backward": reference.backward_time_s * self._scale,
        }
        ratios: dict[str, float] = {}
        for kind, samples in self._stream.items():
            durations = [
                end.at_s - start.at_s
                for start, end in samples
                if start.at_s is not None and end.at_s is not None
            ]
            if len(durations) < _MIN_STREAM_SAMPLES:
                return {}
            ratio = statistics.median(durations) / loop[kind]
            # Outside this range the stream is not what the loops measured (a different
            # workload, a rank waiting inside its instructions): leave the profile alone.
            if not 0.5 <= ratio <= 2.0:
                _log.warning(
                    "perseus: rank %d %s takes %.2f x its loop time in the stream; not calibrating",
                    self.settings.rank,
                    kind,
                    ratio,
                )
                return {}
            ratios[kind] = ratio
        return ratios if len(ratios) == 2 else {}

    def _report_profile(self, rows: list[ProfileRow], p_block_w: float | None) -> None:
        self._pending_rows = (rows, p_block_w)
        self._profile_ready.set()

    def _measure_blocking_power(self) -> float | None:
        """Power while this rank waits on its peers in a real collective.

        Every rank of the default process group takes part (they all reach this iteration
        boundary): in round ``r`` rank ``r`` holds the others up for ``blocking_s`` while
        they wait in a barrier, so each waiting rank's GPU draws what it draws blocked in
        communication. Two rounds let every rank be measured. Without a process group the
        rank measures its GPU idle (a sleep), which is the blocking power of the fake GPU
        and a lower bound on a real one.
        """
        seconds = self.settings.budget.blocking_s
        dist = _distributed()
        if dist is None:
            return measure_idle_power(self._meter, time.sleep, seconds, self._clock)
        me = dist.get_rank()
        readings: list[float] = []
        for holder in range(min(2, dist.get_world_size())):
            dist.barrier()
            if me == holder:
                time.sleep(seconds)
                dist.barrier()
            else:
                reading = measure_idle_power(
                    self._meter, lambda _s: dist.barrier(), seconds, self._clock
                )
                if reading is not None:
                    readings.append(reading)
        return sum(readings) / len(readings) if readings else None

    def _give_up(self, message: str) -> None:
        self.failure = message
        # As the message says: a plan adopted before must not go on lowering clocks (the
        # training thread puts the default back at its next instruction).
        self._plan_off = True
        _log.error("perseus: %s; training goes on at default clocks", message)

    # ------------------------------------------------------------------ session thread

    def _session(self) -> None:
        rng = random.Random()
        backoff = Backoff()
        outage = _Outage()

        def on_error(err: BaseException, attempt: int) -> None:
            outage.failed(err)

        def call(fn: Callable[[], Any]) -> Any:
            result = retry_call(fn, backoff=backoff, stop=self._stop, rng=rng, on_error=on_error)
            outage.ok()
            return result

        try:
            job: JobView = call(self._planner.job)
            self._job = job
            self._resolve_position(job)
            self._check_job(job)
            if self.failure is not None:
                return
            self._position_ready.set()
            self._register(call)
            self._registered.set()
            if self._profile_state == "saved":
                rows, p_block = self._saved_profile()
                self._pending_rows = (rows, p_block)
                self._profile_ready.set()
            while not self._profile_ready.wait(0.5):
                if self._stop.is_set():
                    return
            rows, p_block = self._pending_rows
            stage = self.settings.stage
            if stage is None:  # only when the position could not be resolved, logged there
                return
            call(
                lambda: self._planner.report_profile(
                    ProfileReport(
                        rank=self.settings.rank, stage=stage, rows=rows, p_block_w=p_block
                    )
                )
            )
            _log.info("perseus: rank %d profile reported", self.settings.rank)
            self._poll_plans(rng, backoff, outage)
        except PlannerUnavailable:
            return  # only when stopping
        except (AuthError, JobNotFound, PlanError, ProfileError) as err:
            self._give_up(str(err))
        except PerseusError as err:
            self._give_up(f"{type(err).__name__}: {err}")
        except Exception as err:  # a bug here must not reach training
            _log.exception("perseus: session thread failed")
            self._give_up(f"internal error: {err}")

    def _register(self, call: Callable[[Callable[[], Any]], Any]) -> None:
        s = self.settings
        stage = s.stage if s.stage is not None else 0
        body = RankRegistration(
            rank=s.rank,
            stage=stage,
            data_parallel_rank=s.data_parallel_rank or 0,
            tensor_parallel_rank=s.tensor_parallel_rank or 0,
            gpu_name=self._gpu.name,
            supported_clocks_mhz=list(self._gpu.supported_clocks_mhz()),
        )
        call(lambda: self._planner.register(body))

    def _poll_plans(self, rng: random.Random, backoff: Backoff, outage: _Outage) -> None:
        version: int | None = None
        attempt = 0
        not_ready_logged = ""
        while not self._stop.is_set():
            try:
                plan = self._planner.plan(
                    self.settings.rank, version=version, wait_s=self.settings.poll_wait_s
                )
            except PlanNotReady as err:
                if err.state == "failed" and not_ready_logged != "failed":
                    _log.error("perseus: planning failed on the server: %s", err)
                not_ready_logged = err.state
                outage.ok()
                self._stop.wait(min(5.0, 0.5 + attempt * 0.5))
                attempt += 1
                continue
            except PlannerUnavailable as err:
                outage.failed(err)
                self._stop.wait(backoff.delay_s(attempt, rng))
                attempt += 1
                continue
            outage.ok()
            attempt = 0
            if plan is None:
                continue
            self._accept_plan(plan)
            version = plan.version

    def _accept_plan(self, plan: PlanResponse) -> None:
        if plan.stage != self.settings.stage:
            self._give_up(f"plan version {plan.version} is for stage {plan.stage}")
            return
        active = ActivePlan.from_response(plan)
        _log.info(
            "perseus: plan version %d received (%d instructions, %.4f s per iteration)",
            plan.version,
            len(active.keys),
            plan.time_s,
        )
        self._pending = active

    def _resolve_position(self, job: JobView) -> None:
        """Fill in stage, data- and tensor-parallel rank from the job's sizes where unknown.

        The layout is Megatron's default: tensor parallel fastest, then data parallel,
        then pipeline stage (``rank = (stage * D + d) * T + t``).
        """
        spec = job.spec
        r = self.settings.rank
        t = r % spec.tensor_parallel
        d = (r // spec.tensor_parallel) % spec.data_parallel
        stage = r // (spec.tensor_parallel * spec.data_parallel)
        self.settings = self.settings.with_position(
            stage=stage, data_parallel_rank=d, tensor_parallel_rank=t
        )
        if self._fake is not None and self._expect.stages is None:
            self._fake.work = default_work(self.settings.stage or 0, spec.stages)
        if spec.virtual_stages > 1:
            self._scale = 1.0 / spec.virtual_stages

    def _check_job(self, job: JobView) -> None:
        spec = job.spec
        e = self._expect
        problems = []
        if e.schedule is not None and e.schedule != spec.schedule:
            problems.append(f"schedule {e.schedule!r} runs, the job has {spec.schedule!r}")
        if e.stages is not None and e.stages != spec.stages:
            problems.append(f"{e.stages} pipeline stages run, the job has {spec.stages}")
        if e.microbatches is not None and e.microbatches != spec.microbatches:
            problems.append(f"{e.microbatches} microbatches run, the job has {spec.microbatches}")
        if e.virtual_stages is not None and e.virtual_stages != spec.virtual_stages:
            problems.append(
                f"{e.virtual_stages} virtual stages run, the job has {spec.virtual_stages}"
            )
        if problems and self.failure is None:
            self._plan_off = True
            self._give_up(f"job {job.job_id} does not match this training: {'; '.join(problems)}")

    def _saved_profile(self) -> tuple[list[ProfileRow], float | None]:
        profile = self._saved
        path = self.settings.profile_path or ""
        if profile is None:
            raise ProfileError(f"{path}: no saved profile was read")
        stage = self.settings.stage or 0
        if stage >= profile.num_stages:
            raise ProfileError(
                f"{path}: has {profile.num_stages} stages, this rank is stage {stage}"
            )
        rows = [
            ProfileRow(
                instruction="forward" if o_kind == "forward" else "backward",
                frequency_mhz=option.frequency_mhz,
                time_s=option.time_s,
                energy_j=option.energy_j,
            )
            for o_kind, options in profile.stages[stage].items()
            for option in options
        ]
        return rows, profile.p_block_w

    # ------------------------------------------------------------------ reporter thread

    def _reporter(self) -> None:
        rng = random.Random()
        backoff = Backoff()
        outage = _Outage()
        attempt = 0
        retry_at = 0.0
        while True:
            self._wake_reporter.wait(0.5)
            self._wake_reporter.clear()
            self._drain_logs()
            if self._stop.is_set():
                return
            if not self._registered.is_set() or time.monotonic() < retry_at:
                continue
            while self._reports and not self._stop.is_set():
                iteration, start_stamp, end_stamp, version = self._reports[0]
                start, end = start_stamp.at_s, end_stamp.at_s
                if start is None or end is None:
                    break  # the device has not reached the iteration's end yet
                energy = self._meter.energy_between(start, end)
                if energy is None:
                    if self._clock() - end < 1.0 and self._meter.failed is None:
                        break  # the meter has not read past the end yet
                    self._reports.popleft()
                    continue
                report = IterationReport(
                    rank=self.settings.rank,
                    iteration=iteration,
                    time_s=max(end - start, 1e-6),
                    energy_j=max(energy, 0.0),
                    plan_version=version,
                )
                try:
                    self._planner.report_iteration(report)
                except PlannerUnavailable as err:
                    outage.failed(err)
                    retry_at = time.monotonic() + backoff.delay_s(attempt, rng)
                    attempt += 1
                    break
                except PerseusError as err:
                    _log.debug("perseus: iteration report refused: %s", err)
                self._reports.popleft()
                outage.ok()
                attempt = 0

    def _drain_logs(self) -> None:
        with self._log_lock:
            self._write_logs()

    def _write_logs(self) -> None:
        if self._log_file is None or self._log_file.closed:
            self._logs.clear()
            return
        wrote = False
        while self._logs:
            iteration, version, entries = self._logs.popleft()
            lines = [
                json.dumps(
                    {
                        "iteration": iteration,
                        "instruction": kind,
                        "microbatch": microbatch,
                        "chunk": chunk,
                        "frequency_mhz": frequency,
                        "plan_version": version,
                    }
                )
                for kind, microbatch, chunk, frequency in entries
            ]
            try:
                self._log_file.write("\n".join(lines) + "\n")
            except OSError as err:
                self._stop_logging(err)
                return
            wrote = True
        if wrote:
            try:
                self._log_file.flush()
            except OSError as err:
                self._stop_logging(err)

    def _stop_logging(self, err: OSError) -> None:
        # A full disk must not kill the reporter thread (and its telemetry) nor fail close().
        file = self._log_file
        _log.error(
            "perseus: cannot write the clock log %s (%s); clock logging stops",
            getattr(file, "name", "?"),
            err,
        )
        self._log_file = None
        self._logs.clear()
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()


def _read_saved_profile(settings: ClientSettings) -> Profile | None:
    """The profile ``PERSEUS_PROFILE`` names, read now so that a bad one fails at start-up.

    Raises:
        SettingsError: The file is unreadable or malformed, or has no row for the stage.
    """
    if settings.profile_path is None:
        return None
    from perseus.solver.profiles import load_profile

    try:
        profile = load_profile(settings.profile_path)
    except ProfileError as err:
        raise SettingsError(f"PERSEUS_PROFILE: {err}") from err
    stage = settings.stage
    if stage is not None and stage >= profile.num_stages:
        raise SettingsError(
            f"PERSEUS_PROFILE: {settings.profile_path} has {profile.num_stages} stages, "
            f"this rank is stage {stage}"
        )
    return profile


# ---------------------------------------------------------------------- connect and exit

_ranks: list[Rank] = []
_hooks_pid: int | None = None  # the process whose exit hooks are in place
_signals_installed = False  # signal handlers survive a fork, exit hooks need a new process
_said_off = False


def connect(
    *,
    workload: Workload | Callable[[], Workload | None] | None = None,
    gpu: GpuControl | GpuMode | None = None,
    planner: PlannerClient | None = None,
    install_signal_handlers: bool = True,
    **settings: object,
) -> Rank:
    """Connect this training process to the planner.

    Args:
        workload: The stage's work for online profiling (the framework integrations bind
            one themselves), or a callable returning it once the first iteration has run.
        gpu: The GPU mode (``"nvml"``, ``"dry-run"``, ``"fake"``, else ``PERSEUS_GPU``), or
            a GPU object to drive instead (tests).
        planner: A planner client instead of one for ``PERSEUS_SERVER`` (tests).
        install_signal_handlers: Reset the GPU's clocks on SIGTERM and SIGINT (then let the
            previous handler run). Only possible from the main thread.
        **settings: Any :class:`~perseus.client.settings.ClientSettings` field (``server``,
            ``job``, ``token``, ``rank``, ``stage``, ``gpu_index``, ``profile_path``, ...);
            unset ones come from ``PERSEUS_*`` variables.

    Returns:
        The rank. Without a server it does nothing at all (and says so once).

    Raises:
        SettingsError: A setting is malformed.
        GpuControlError: The GPU cannot be opened (NVML missing, bad index).
    """
    global _said_off
    if isinstance(gpu, str):
        settings["gpu"] = gpu
        gpu = None
    if "rank" not in settings:
        dist = _distributed()
        if dist is not None and not os.environ.get("PERSEUS_RANK") and not os.environ.get("RANK"):
            settings["rank"] = dist.get_rank()
    resolved = load_settings(None, **settings)
    if resolved.server is None:
        if not _said_off:
            _log.warning("perseus: PERSEUS_SERVER is not set; perseus does nothing in this run")
            _said_off = True
        return Rank(resolved)
    rank = Rank(
        resolved, gpu=gpu, planner=planner, workload=workload, record_event=_cuda_events(resolved)
    )
    _ranks.append(rank)
    _install_exit_hooks(install_signal_handlers)
    return rank


def _cuda_events(settings: ClientSettings) -> Callable[[], BoundaryEvent] | None:
    if settings.gpu == "fake":
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def record() -> BoundaryEvent:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        boundary: BoundaryEvent = event
        return boundary

    return record


def _distributed() -> Any:
    """``torch.distributed`` when a process group is up, else None (torch is optional)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _close_all(reason: str) -> None:
    for rank in list(_ranks):
        rank.close(reason)
    _ranks.clear()


def _install_exit_hooks(signals: bool) -> None:
    global _hooks_pid, _signals_installed
    if _hooks_pid != os.getpid():
        _hooks_pid = os.getpid()
        # multiprocessing runs its finalizers at every process's exit (through atexit), and
        # also in the children it forks, which leave through os._exit, past atexit.
        multiprocessing.util.Finalize(None, _close_all, args=("exit",), exitpriority=100)
    if _signals_installed or not signals:
        return
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may; a later connect() from it installs them
    _signals_installed = True
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        signal.signal(signum, _make_handler(signum, previous))


def _forget_the_parents_ranks() -> None:
    # A forked child has copies of its parent's ranks, whose threads did not come along: they
    # are the parent's to close (closing them here would reset the parent's GPU under it).
    _ranks.clear()


os.register_at_fork(after_in_child=_forget_the_parents_ranks)


def _make_handler(
    signum: int, previous: Callable[[int, FrameType | None], Any] | int | None
) -> Callable[[int, FrameType | None], None]:
    name = signal.Signals(signum).name

    def handler(received: int, frame: FrameType | None) -> None:
        # Reset first: whatever the previous handler does next (exit, KeyboardInterrupt),
        # the GPU must not stay at a low clock.
        for rank in list(_ranks):
            rank._emergency_reset(name)
        if callable(previous):
            previous(received, frame)
            return
        if previous == signal.SIG_IGN:
            return
        _close_all(name)
        signal.signal(received, signal.SIG_DFL)
        os.kill(os.getpid(), received)

    return handler
