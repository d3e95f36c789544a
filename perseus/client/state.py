"""What a rank's threads share: its position and expectations, whether it still follows plans.

One :class:`RankState` per rank, handed to the training thread's hooks (:mod:`.rank`), the
session thread (:mod:`.session`) and online profiling (:mod:`.online`). Each field names the
threads that write it; readers see whole values (an attribute assignment is atomic), never a
half-written one, so no lock is needed. :class:`ActivePlan` is a plan in the shape the
training thread compares instructions with.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from perseus.client.settings import ClientSettings
from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S
from perseus.core.pipeline import InstructionKind
from perseus.schemas import JobCreate, JobView, PlanResponse

__all__ = ["ActivePlan", "Expectation", "Key", "RankState", "job_mismatches"]

_log = logging.getLogger("perseus.client")

Key = tuple[InstructionKind, int, int]
"""An instruction as the training thread names it: kind, microbatch, model chunk (0 for
schedules without chunks; the wire's ``chunk: null``)."""


@dataclass(frozen=True, slots=True)
class ActivePlan:
    """A plan as the training thread uses it: keys, clocks and expected times in execution
    order, and how long before a boundary a clock change should land."""

    version: int
    keys: tuple[Key, ...]
    frequencies_mhz: tuple[int, ...]
    times_s: tuple[float | None, ...] = ()
    margin_s: float = CLOCK_CHANGE_MARGIN_S

    @classmethod
    def from_response(cls, plan: PlanResponse) -> ActivePlan:
        """The plan the server sent, as keys and clocks; ``chunk: null`` becomes chunk 0.

        A margin of 0 (a server that does not send one) becomes ``CLOCK_CHANGE_MARGIN_S``:
        a change aimed exactly at the boundary lands late half the time.
        """
        margin = plan.clock_change_margin_s
        return cls(
            version=plan.version,
            keys=tuple(
                (InstructionKind(i.instruction), i.microbatch, i.chunk or 0)
                for i in plan.instructions
            ),
            frequencies_mhz=tuple(i.frequency_mhz for i in plan.instructions),
            times_s=tuple(i.time_s for i in plan.instructions),
            margin_s=margin if margin > 0 else CLOCK_CHANGE_MARGIN_S,
        )


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the framework integration knows about the schedule it runs."""

    schedule: str | None = None
    stages: int | None = None
    microbatches: int | None = None
    virtual_stages: int | None = None


def job_mismatches(expect: Expectation, spec: JobCreate) -> list[str]:
    """How the schedule that runs differs from the job's (empty when they agree)."""
    problems = []
    if expect.schedule is not None and expect.schedule != spec.schedule:
        problems.append(f"schedule {expect.schedule!r} runs, the job has {spec.schedule!r}")
    if expect.stages is not None and expect.stages != spec.stages:
        problems.append(f"{expect.stages} pipeline stages run, the job has {spec.stages}")
    if expect.microbatches is not None and expect.microbatches != spec.microbatches:
        problems.append(f"{expect.microbatches} microbatches run, the job has {spec.microbatches}")
    if expect.virtual_stages is not None and expect.virtual_stages != spec.virtual_stages:
        problems.append(
            f"{expect.virtual_stages} virtual stages run, the job has {spec.virtual_stages}"
        )
    return problems


class RankState:
    """What the threads of one rank share.

    Attributes:
        settings: The rank's settings; its position (stage, data- and tensor-parallel rank) is
            filled in by :meth:`Rank.bind` (training thread) or from the job (session thread).
        position_ready: Set once the stage is known.
        expect: What the framework integration said it runs (training thread).
        scale: The share of the stage one instruction is (``1 / virtual_stages``).
        job: The job as the session thread read it (None before).
        failure: Why perseus stopped planning this rank (any thread; training goes on at
            default clocks). None while all is well.
        stopped: Whether the training thread stops following plans (set with ``failure``, and
            by a signal handler's emergency reset). Read at every instruction.
        instructions: Instructions the last whole iteration ran (training thread; None
            before one ran): the count a plan must have.
        rejected_version: The newest plan version the rank refused (session thread: too
            large, unsupported clocks, wrong count; training thread: it did not match the
            schedule that ran). Never followed; a newer version is.
        rejection: Why, with the version (None while no plan was refused, or once a newer
            plan is followed).
    """

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.position_ready = threading.Event()
        if settings.stage is not None:
            self.position_ready.set()
        self.expect = Expectation()
        self.scale = 1.0
        self.job: JobView | None = None
        self.failure: str | None = None
        self.stopped = False
        self.instructions: int | None = None
        self.rejected_version: int | None = None
        self.rejection: str | None = None

    def reject_plan(self, version: int | None, message: str) -> None:
        """Refuse one plan version: default clocks until a newer plan comes (any thread)."""
        if version is not None:
            self.rejected_version = max(version, self.rejected_version or 0)
        self.rejection = message
        _log.error("perseus: %s; default clocks until a newer plan comes", message)

    def give_up(self, message: str) -> None:
        """Stop planning this rank for good: training goes on at default clocks."""
        self.failure = message
        # As the message says: a plan adopted before must not go on lowering clocks (the
        # training thread puts the default back at its next instruction).
        self.stopped = True
        _log.error("perseus: %s; training goes on at default clocks", message)

    def check_job(self, job: JobView) -> None:
        """Give up if the job on the server is not the training that runs."""
        problems = job_mismatches(self.expect, job.spec)
        if problems and self.failure is None:
            self.give_up(f"job {job.job_id} does not match this training: {'; '.join(problems)}")
