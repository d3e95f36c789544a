"""The session thread: a rank's conversation with the planner.

It reads the job (filling in the rank's position from the job's sizes), registers the rank,
uploads the profile (a saved one, or the one online profiling hands over), then long-polls
for plans, with backoff and jitter while the planner is down, logging once per outage, and
never starting two polls less than :data:`POLL_FLOOR_S` apart. A new
plan waits in :attr:`Session.pending` until the training thread adopts it at an iteration
boundary. Any refusal from the planner gives up on planning, never on training.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perseus.client.api.client import PlannerClient, PlanTooLarge
from perseus.client.api.retry import Backoff, retry_call
from perseus.client.gpu.control import GpuControl, WorkObserver
from perseus.client.settings import ClientSettings, SettingsError
from perseus.client.state import ActivePlan, RankState
from perseus.core.errors import (
    AuthError,
    JobNotFound,
    PerseusError,
    PlanError,
    PlannerUnavailable,
    PlanNotReady,
    ProfileError,
)
from perseus.core.jobs import JobState
from perseus.schemas import JobView, PlanResponse, ProfileReport, ProfileRow, RankRegistration

if TYPE_CHECKING:
    from perseus.core.profiles import Profile

__all__ = ["Outage", "Session", "read_saved_profile", "saved_profile_rows"]

_log = logging.getLogger("perseus.client")

PLAN_BYTES_BASE = 64 * 1024
PLAN_BYTES_PER_INSTRUCTION = 256
"""A plan's answer may be up to ``PLAN_BYTES_BASE`` plus this much per instruction the rank
could run (a plan instruction is ~100 bytes of JSON): anything longer is refused unread."""

KINDS_PER_MICROBATCH = 4
"""The most instructions one microbatch of one model chunk may be in a plan (forward,
backward, or its input and weight halves): with the job's microbatches and virtual stages,
the most a plan may hold before the rank has counted its own."""

POLL_FLOOR_S = 1.0
"""The least time between the starts of two plan polls, whatever the server answers: a 304
that comes back at once (a server with a tiny ``max_wait_s``, a proxy that ends long polls
early) must not make the rank poll in a loop."""


class Outage:
    """Logs once when the planner goes away and once when it is back."""

    def __init__(self) -> None:
        self.down_since: float | None = None

    def failed(self, err: BaseException) -> None:
        """A call failed for want of the planner (logged on the first of a run)."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            _log.warning(
                "perseus: planner unavailable (%s); training goes on, retrying in the background",
                err,
            )

    def ok(self) -> None:
        """A call went through (logged after an outage)."""
        if self.down_since is not None:
            _log.warning(
                "perseus: planner reachable again after %.0f s",
                time.monotonic() - self.down_since,
            )
            self.down_since = None


def read_saved_profile(settings: ClientSettings) -> Profile | None:
    """The profile ``PERSEUS_PROFILE`` names, read now so that a bad one fails at start-up.

    Raises:
        SettingsError: The file is unreadable or malformed, or has no row for the stage.
    """
    if settings.profile_path is None:
        return None
    from perseus.formats.profiles import load_profile

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


def saved_profile_rows(
    profile: Profile, stage: int, path: str
) -> tuple[list[ProfileRow], float | None]:
    """The rows of ``stage`` in a saved profile, and its blocking power.

    Raises:
        ProfileError: The profile has no such stage.
    """
    if stage >= profile.num_stages:
        raise ProfileError(f"{path}: has {profile.num_stages} stages, this rank is stage {stage}")
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


class Session:
    """Runs the session thread of one rank.

    Args:
        state: The rank's shared state (position, failure).
        planner: The planner client.
        gpu: The rank's GPU (its name and clocks go into the registration).
        observer: The GPU's work observer, told the rank's stage once the job gives it.
        stop: Set when the rank closes.
        saved: The saved profile to upload instead of profiling online (None: wait for
            :meth:`submit_profile`).
    """

    def __init__(
        self,
        state: RankState,
        planner: PlannerClient,
        gpu: GpuControl,
        observer: WorkObserver | None,
        stop: threading.Event,
        saved: Profile | None,
        *,
        poll_floor_s: float = POLL_FLOOR_S,
    ) -> None:
        self._state = state
        self._planner = planner
        self._gpu = gpu
        self._observer = observer
        self._stop = stop
        self._saved = saved
        self._poll_floor_s = poll_floor_s
        self._clocks_mhz: frozenset[int] = frozenset()
        self._reported_gave_up = False
        # This process's registration: a second process with the same rank is refused.
        self._instance = uuid.uuid4().hex
        self.pending: ActivePlan | None = None
        """The newest plan received; the training thread adopts it at an iteration boundary."""
        self.registered = threading.Event()
        """Set once the planner knows this rank (telemetry may flow)."""
        self._profile_ready = threading.Event()
        self._rows: tuple[list[ProfileRow], float | None] = ([], None)
        self._thread = threading.Thread(target=self._run, name="perseus-session", daemon=True)

    @property
    def thread(self) -> threading.Thread:
        """The session thread."""
        return self._thread

    def start(self) -> None:
        """Start the session thread."""
        self._thread.start()

    def submit_profile(self, rows: list[ProfileRow], p_block_w: float | None) -> None:
        """Hand over the profile measured online, for upload (any thread)."""
        self._rows = (rows, p_block_w)
        self._profile_ready.set()

    # ------------------------------------------------------------------ session thread

    def _run(self) -> None:
        rng = random.Random()
        backoff = Backoff()
        outage = Outage()
        state = self._state

        def on_error(err: BaseException, attempt: int) -> None:
            outage.failed(err)

        def call(fn: Callable[[], Any]) -> Any:
            result = retry_call(fn, backoff=backoff, stop=self._stop, rng=rng, on_error=on_error)
            outage.ok()
            return result

        try:
            job: JobView = call(self._planner.job)
            state.job = job
            self._resolve_position(job)
            state.check_job(job)
            if state.failure is not None:
                self._report_gave_up()
                return
            state.position_ready.set()
            self._register(call)
            self.registered.set()
            if self._saved is not None:
                path = state.settings.profile_path or ""
                self.submit_profile(
                    *saved_profile_rows(self._saved, state.settings.stage or 0, path)
                )
            while not self._profile_ready.wait(0.5):
                if self._stop.is_set():
                    return
                if state.failure is not None:
                    self._report_gave_up()
                    return
            rows, p_block = self._rows
            stage = state.settings.stage
            if stage is None:  # only when the position could not be resolved, logged there
                return
            rank = state.settings.rank
            call(
                lambda: self._planner.report_profile(
                    ProfileReport(rank=rank, stage=stage, rows=rows, p_block_w=p_block)
                )
            )
            _log.info("perseus: rank %d profile reported", rank)
            self._poll_plans(rng, backoff, outage)
        except PlannerUnavailable:
            return  # only when stopping
        except (AuthError, JobNotFound) as err:
            state.give_up(str(err))  # the planner would not take the report either
        except (PlanError, ProfileError) as err:
            state.give_up(str(err))
            self._report_gave_up()
        except PerseusError as err:
            state.give_up(f"{type(err).__name__}: {err}")
            self._report_gave_up()
        except Exception as err:  # a bug here must not reach training
            _log.exception("perseus: session thread failed")
            state.give_up(f"internal error: {err}")

    def _report_gave_up(self) -> None:
        """Tell the planner once why this rank stopped planning (for the job view); a
        failure to is logged, never raised."""
        failure = self._state.failure
        if failure is None or self._reported_gave_up:
            return
        self._reported_gave_up = True
        try:
            self._planner.report_gave_up(self._state.settings.rank, failure)
        except PerseusError as err:
            _log.warning("perseus: could not tell the planner this rank gave up: %s", err)

    def _register(self, call: Callable[[Callable[[], Any]], Any]) -> None:
        s = self._state.settings
        stage = s.stage if s.stage is not None else 0
        body = RankRegistration(
            instance=self._instance,
            rank=s.rank,
            stage=stage,
            data_parallel_rank=s.data_parallel_rank or 0,
            tensor_parallel_rank=s.tensor_parallel_rank or 0,
            gpu_name=self._gpu.name,
            supported_clocks_mhz=list(self._gpu.supported_clocks_mhz()),
        )
        self._clocks_mhz = frozenset(body.supported_clocks_mhz)
        call(lambda: self._planner.register(body))

    def _poll_plans(self, rng: random.Random, backoff: Backoff, outage: Outage) -> None:
        version: int | None = None
        attempt = 0
        not_ready_logged = ""
        settings = self._state.settings
        last_start: float | None = None
        while not self._stop.is_set():
            if self._state.failure is not None:
                self._report_gave_up()
                return
            if last_start is not None:
                rest = self._poll_floor_s - (time.monotonic() - last_start)
                if rest > 0 and self._stop.wait(rest):
                    return
            last_start = time.monotonic()
            try:
                plan = self._planner.plan(
                    settings.rank,
                    version=version,
                    wait_s=settings.poll_wait_s,
                    max_bytes=self._plan_limit_bytes(),
                )
            except PlanTooLarge as err:
                outage.ok()
                self._state.reject_plan(err.version, f"plan version {err.version}: {err}")
                if err.version is not None:
                    version = err.version  # the server answers 304 until a newer one
                else:  # no version to wait past: try again, slowly
                    self._stop.wait(backoff.delay_s(attempt, rng))
                    attempt += 1
                continue
            except PlanNotReady as err:
                if err.state == JobState.FAILED and not_ready_logged != JobState.FAILED:
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

    def _most_instructions(self) -> int:
        """The most instructions a plan for this rank may hold: the count the rank ran, once
        it ran an iteration; before, what the job's sizes allow."""
        state = self._state
        if state.instructions:
            return state.instructions
        job = state.job
        if job is None:
            return 1 << 16
        return KINDS_PER_MICROBATCH * job.spec.microbatches * max(job.spec.virtual_stages, 1)

    def _plan_limit_bytes(self) -> int:
        return PLAN_BYTES_BASE + PLAN_BYTES_PER_INSTRUCTION * self._most_instructions()

    def _plan_problem(self, plan: PlanResponse) -> str | None:
        """Why this rank cannot follow ``plan`` (None: it can)."""
        if plan.stage != self._state.settings.stage:
            return (
                f"it is for stage {plan.stage}, this rank runs stage {self._state.settings.stage}"
            )
        n = len(plan.instructions)
        ran = self._state.instructions
        if ran and n != ran:
            return f"it has {n} instructions, an iteration of this rank runs {ran}"
        if n > self._most_instructions():
            return f"it has {n} instructions, more than the job's sizes allow"
        if self._clocks_mhz:
            bad = sorted({i.frequency_mhz for i in plan.instructions} - self._clocks_mhz)
            if bad:
                shown = ", ".join(str(f) for f in bad[:5])
                return f"this GPU does not support its clocks {shown} MHz"
        return None

    def _accept_plan(self, plan: PlanResponse) -> None:
        problem = self._plan_problem(plan)
        if problem is not None:
            self._state.reject_plan(plan.version, f"plan version {plan.version} refused: {problem}")
            return
        active = ActivePlan.from_response(plan)
        _log.info(
            "perseus: plan version %d received (%d instructions, %.4f s per iteration)",
            plan.version,
            len(active.keys),
            plan.time_s,
        )
        self.pending = active

    def _resolve_position(self, job: JobView) -> None:
        """Fill in stage, data- and tensor-parallel rank from the job's sizes where unknown.

        The layout is Megatron's default: tensor parallel fastest, then data parallel,
        then pipeline stage (``rank = (stage * D + d) * T + t``).
        """
        state = self._state
        spec = job.spec
        r = state.settings.rank
        t = r % spec.tensor_parallel
        d = (r // spec.tensor_parallel) % spec.data_parallel
        stage = r // (spec.tensor_parallel * spec.data_parallel)
        state.settings = state.settings.with_position(
            stage=stage, data_parallel_rank=d, tensor_parallel_rank=t
        )
        if self._observer is not None and state.expect.stages is None:
            self._observer.place(state.settings.stage or 0, spec.stages)
        if spec.virtual_stages > 1:
            state.scale = 1.0 / spec.virtual_stages
