"""``perseus plan``'s command line and the request it builds: the parser and its argument
types, the checks between arguments, :class:`PlanRequest`, and the schedule a request names
(a named schedule, or a torch schedule file).

Nothing here solves; :mod:`perseus.cli.plan` plans the request and
:mod:`perseus.cli.plan_views` renders what it found.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from perseus.cli.arguments import (
    Parser,
    UsageError,
    finite_number,
    nonnegative_float,
    positive_float,
    positive_int,
)
from perseus.cli.arguments import policy as policy_argument
from perseus.cli.outputs import Outputs
from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S, EXACT_TIME_LIMIT_S, POLISH_S, RESOLUTION_S
from perseus.core.errors import PerseusError, ProfileError

if TYPE_CHECKING:
    from perseus.solver import Policy, Profile, Schedule

__all__ = [
    "PlanRequest",
    "blocking_power",
    "build_parser",
    "check_arguments",
    "check_outputs",
    "request_of",
    "request_schedule",
]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus plan`` (imports the solver for the schedule names)."""
    from perseus.core.pipeline import SCHEDULE_NAMES

    parser = Parser(
        prog="perseus plan",
        description="Compute the time-energy frontier of a profile, compare it with the "
        "baselines and pick the point a policy chooses.",
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile: Zeus CSV or perseus JSON")
    parser.add_argument(
        "--microbatches",
        metavar="M",
        type=positive_int,
        help="microbatches (required, except with --schedule-file, which says how many)",
    )
    parser.add_argument(
        "--p-block",
        metavar="WATTS",
        type=positive_float,
        help="blocking power of a waiting GPU (default: the JSON profile's p_block_w)",
    )
    parser.add_argument(
        "--schedule",
        metavar="NAME[,NAME...]",
        type=_schedule_names(SCHEDULE_NAMES),
        help=f"one of {', '.join(SCHEDULE_NAMES)} (default 1f1b); several, comma-separated, "
        "print one what-if table comparing their iteration time and energy",
    )
    parser.add_argument(
        "--schedule-file",
        metavar="FILE",
        help="plan the order in torch's compute_only schedule CSV (what "
        "PipelineScheduleMulti._dump_csv writes: one row per rank, cells such as 2F0, 1I3, "
        "0W1, (0F3;3B1)OVERLAP_F_B; overlapped pairs are planned as their two halves in order)",
    )
    parser.add_argument(
        "--virtual-stages",
        metavar="V",
        type=positive_int,
        help="model chunks per GPU for interleaved-1f1b, interleaved-zb, zbv, dualpipev and "
        "looped-bfs (default 2 there, else 1)",
    )
    parser.add_argument(
        "--policy",
        metavar="POLICY",
        type=policy_argument,
        help="no-slowdown (default), max-slowdown:FACTOR, deadline:SECONDS, min-energy, "
        "zeus-cost:ETA",
    )
    parser.add_argument(
        "--resolution",
        metavar="SECONDS",
        # at most perseus.solver.deadlines.MAX_RESOLUTION_S (not imported: --help stays light)
        type=finite_number(0, inclusive=False, maximum=1.0),
        default=None,
        help=f"time step between frontier deadlines, at most 1 (default: follows the job: "
        f"{RESOLUTION_S:g} where that grid is small, else about 2,048 deadlines or more "
        "across the span of plan times; the frontier file records it)",
    )
    parser.add_argument(
        "--exact", action="store_true", help="solve every deadline exactly (MILP; small cases)"
    )
    parser.add_argument(
        "--exact-time-limit",
        metavar="SECONDS",
        type=positive_float,
        default=EXACT_TIME_LIMIT_S,
        help="--exact: wall-clock limit; a sweep estimated to need more is refused at once, and "
        "one the limit cuts short says how many MILPs it stopped and how many deadlines it "
        f"left to the fast plans (the frontier is then partial) (default {EXACT_TIME_LIMIT_S:g})",
    )
    parser.add_argument(
        "--polish",
        metavar="SECONDS",
        type=nonnegative_float,
        default=POLISH_S,
        help="seconds to spend improving the no-slowdown plan with a branch and bound "
        f"(default {POLISH_S:g}: off; timed, so the result then depends on the machine's speed)",
    )
    parser.add_argument(
        "--clock-change-margin",
        metavar="SECONDS",
        type=_margin,
        default=CLOCK_CHANGE_MARGIN_S,
        help="a clock raise takes effect this long before an instruction boundary and a "
        "lowering this long after it, so the lower-clocked instruction of the pair runs "
        "SECONDS at the higher clock; stated times and energies include it (default "
        f"{CLOCK_CHANGE_MARGIN_S:g}; 0: no transitions; less than 1)",
    )
    parser.add_argument(
        "--straggler",
        metavar="SECONDS",
        type=positive_float,
        help="what-if: another pipeline imposes this iteration time; longer than the chosen "
        "plan's, the least-energy plan that fits it runs (the straggler plan) and its saving is "
        "against the reference stretched to that time; not longer, the chosen plan runs as it is",
    )
    parser.add_argument("--output", metavar="FRONTIER.json", help="write the frontier as JSON")
    parser.add_argument(
        "--plan-output",
        metavar="PLAN.json",
        help="write the plan that runs as JSON: the chosen plan, or with a --straggler that "
        "slows this pipeline, the straggler plan",
    )
    parser.add_argument("--plot", metavar="FRONTIER.png", help="plot the frontier")
    parser.add_argument(
        "--timeline",
        metavar="TIMELINE.png",
        help="plot the timeline of the plan that runs (as --plan-output)",
    )
    return parser


def _schedule_names(known: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(","))
        for name in names:
            if name not in known:
                raise argparse.ArgumentTypeError(
                    f"unknown schedule {name!r}; expected one of {', '.join(known)}"
                )
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"a schedule is named twice in {text!r}")
        return names

    return parse


def _margin(text: str) -> float:
    value = nonnegative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0 and < 1, got {text!r}")
    return value


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What to plan and which files to write; ``extra_files`` are written with them."""

    profile: Profile
    microbatches: int | None
    p_block_w: float | None
    schedule: str
    virtual_stages: int | None
    policy: Policy
    resolution_s: float | None
    exact: bool
    exact_time_limit_s: float = EXACT_TIME_LIMIT_S
    polish_s: float = POLISH_S
    clock_change_margin_s: float = CLOCK_CHANGE_MARGIN_S
    straggler_s: float | None = None
    output: str | None = None
    plan_output: str | None = None
    plot: str | None = None
    timeline: str | None = None
    extra_files: Mapping[str, bytes] = field(default_factory=dict)
    schedule_file: str | None = None
    """Plan this torch schedule CSV instead of ``schedule`` (see ``--schedule-file``)."""


def check_arguments(args: argparse.Namespace) -> tuple[str, ...]:
    """The schedules ``args`` name (one to plan, several to compare), once the arguments agree.

    Raises:
        UsageError: Arguments that contradict each other or are missing.
    """
    from perseus.core.pipeline import CHUNKED_SCHEDULES

    if args.schedule is not None and args.schedule_file is not None:
        raise UsageError("--schedule-file: give --schedule or --schedule-file, not both")
    if args.microbatches is None and args.schedule_file is None:
        raise UsageError("--microbatches: required (unless --schedule-file says how many)")
    names: tuple[str, ...] = args.schedule or ("1f1b",)
    chunked = any(name in CHUNKED_SCHEDULES for name in names)
    if args.virtual_stages not in (None, 1) and not chunked and args.schedule_file is None:
        raise UsageError(
            f"--virtual-stages: {names[0]} runs one model chunk per GPU; V > 1 needs "
            f"--schedule interleaved-1f1b (or another chunked schedule)"
        )
    if args.virtual_stages == 1 and chunked:
        raise UsageError(
            f"--virtual-stages: {names[0]} runs V >= 2 model chunks per GPU; for one, "
            "use --schedule 1f1b"
        )
    if args.schedule_file is not None and args.virtual_stages is not None:
        raise UsageError("--virtual-stages: --schedule-file says where every stage runs")
    if len(names) > 1:
        for option, value in (
            ("--output", args.output),
            ("--plan-output", args.plan_output),
            ("--plot", args.plot),
            ("--timeline", args.timeline),
            ("--straggler", args.straggler),
            ("--exact", args.exact or None),
        ):
            if value is not None:
                raise UsageError(
                    f"{option}: plans one schedule; drop it to compare {', '.join(names)}"
                )
    return names


def check_outputs(args: argparse.Namespace) -> Outputs:
    """The files ``args`` ask for, checked before any solving.

    Raises:
        UsageError: A plot not named ``.png``, or a file that cannot be written.
    """
    for option, path in (("--plot", args.plot), ("--timeline", args.timeline)):
        if path is not None and Path(path).suffix.lower() != ".png":
            raise UsageError(f"{option}: {path}: plots are PNG images; give a name ending in .png")
    return Outputs(
        [args.output, args.plan_output, args.plot, args.timeline],
        ["--output", "--plan-output", "--plot", "--timeline"],
    )


def request_of(args: argparse.Namespace, names: Sequence[str]) -> PlanRequest:
    """The request ``args`` make for the first of ``names``, its profile read.

    Raises:
        ProfileError: A bad profile.
    """
    from perseus.solver import Policy, load_profile

    return PlanRequest(
        profile=load_profile(args.profile),
        microbatches=args.microbatches,
        p_block_w=args.p_block,
        schedule=names[0],
        virtual_stages=args.virtual_stages,
        policy=args.policy or Policy.parse("no-slowdown"),
        resolution_s=args.resolution,
        exact=args.exact,
        exact_time_limit_s=args.exact_time_limit,
        polish_s=args.polish,
        clock_change_margin_s=args.clock_change_margin,
        straggler_s=args.straggler,
        output=args.output,
        plan_output=args.plan_output,
        plot=args.plot,
        timeline=args.timeline,
        schedule_file=args.schedule_file,
    )


def request_schedule(request: PlanRequest, name: str) -> Schedule:
    """The schedule ``name`` on the request's profile, or the request's schedule file.

    A file whose order is one of the named schedules' is that schedule (so its frontier and
    plan files name it); another order can be planned but not written to those files.

    Raises:
        ScheduleError: A bad file, a list that deadlocks or misses actions, bad sizes.
        UsageError: The file disagrees with --microbatches, or an unnamed order with outputs.
    """
    from perseus.core.pipeline import CHUNKED_SCHEDULES
    from perseus.solver import SCHEDULE_NAMES, build_dag, make_schedule, schedule_from_actions

    stages = request.profile.num_stages
    if request.schedule_file is None:
        virtual_stages = request.virtual_stages
        if virtual_stages is None:
            virtual_stages = 2 if name in CHUNKED_SCHEDULES else 1
        elif name not in CHUNKED_SCHEDULES:
            virtual_stages = 1  # a comparison: --virtual-stages is for the chunked ones
        if request.microbatches is None:
            raise UsageError("--microbatches: required (unless --schedule-file says how many)")
        return make_schedule(name, stages, request.microbatches, virtual_stages)
    from perseus.formats.plan_files import read_torch_schedule_file

    actions, overlapped = read_torch_schedule_file(request.schedule_file)
    schedule = schedule_from_actions(Path(request.schedule_file).name, actions, None, overlapped)
    if request.microbatches is not None and request.microbatches != schedule.microbatches:
        raise UsageError(
            f"--microbatches: {request.schedule_file} runs {schedule.microbatches} "
            f"microbatches, not {request.microbatches}"
        )
    build_dag(schedule)  # complete and free of deadlocks, or say which actions are not
    for known in SCHEDULE_NAMES:
        try:
            named = make_schedule(
                known, schedule.stages, schedule.microbatches, schedule.virtual_stages
            )
        except PerseusError:
            continue
        if named.actions() == schedule.actions() and named.overlapped == schedule.overlapped:
            return named
    if request.output or request.plan_output:
        raise UsageError(
            f"--schedule-file: {request.schedule_file} is none of the named schedules; its "
            "frontier and plan cannot be written to --output/--plan-output (those files name "
            "their schedule)"
        )
    return schedule


def blocking_power(given: float | None, profile: Profile) -> float:
    """``--p-block`` if given, else the profile's blocking power.

    Raises:
        ProfileError: Neither says it.
    """
    if given is not None:
        return given
    if profile.p_block_w is not None:
        return profile.p_block_w
    raise ProfileError(
        f"{profile.source}: p_block_w: the profile carries no blocking power; pass --p-block WATTS"
    )
