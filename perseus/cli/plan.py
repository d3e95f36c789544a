"""``perseus plan``: the time-energy frontier of a profile, the baselines, the chosen plan.

Everything is computed first and the files are written last, all or none
(:class:`~perseus.cli.outputs.Outputs`), so a bad input leaves nothing behind. ``perseus demo``
runs the same planning on the shipped example profile (:func:`plan`, :func:`print_result`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from perseus.baselines import baseline_label, reference_key, saving_text, shown_baselines
from perseus.cli.arguments import (
    Parser,
    UsageError,
    asks_help,
    finite_number,
    nonnegative_float,
    positive_float,
    positive_int,
)
from perseus.cli.arguments import policy as policy_argument
from perseus.cli.outputs import Outputs
from perseus.cli.progress import ProgressBar
from perseus.cli.tables import format_table, schedule_text
from perseus.defaults import CLOCK_CHANGE_MARGIN_S, EXACT_TIME_LIMIT_S, POLISH_S, RESOLUTION_S
from perseus.errors import (
    InfeasibleDeadline,
    PerseusError,
    PlanError,
    ProfileError,
    SolverTimeout,
)

if TYPE_CHECKING:
    from perseus.solver import Baseline, Frontier, Policy, Profile, Schedule
    from perseus.solver.exact import ExactSweep

__all__ = [
    "PlanRequest",
    "PlanResult",
    "build_parser",
    "exact_text",
    "margin_text",
    "plan",
    "print_result",
    "run",
    "straggler_note",
    "stretched",
]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus plan`` (imports the solver for the schedule names)."""
    from perseus.solver import SCHEDULE_NAMES

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


@dataclass(frozen=True, slots=True)
class PlanResult:
    """What :func:`plan` hands back to print once the progress bar is gone."""

    text: str  # the report: the profile, schedule and frontier, then the table
    written: list[str]  # the files written, in the order given
    warnings: list[str]


def run(argv: list[str]) -> int:
    """Run ``perseus plan`` with ``argv`` (the arguments after ``plan``); returns 0.

    Raises:
        UsageError: A bad command line.
        PerseusError: A bad profile, an infeasible policy, a solver limit.
    """
    with ProgressBar(sys.stderr, enabled=not asks_help(argv)) as progress:
        progress.phase("loading the solver")
        args = build_parser().parse_args(argv)
        from perseus.solver import Policy, load_profile
        from perseus.solver.schedules import CHUNKED_SCHEDULES

        if args.schedule is not None and args.schedule_file is not None:
            raise UsageError("--schedule-file: give --schedule or --schedule-file, not both")
        if args.microbatches is None and args.schedule_file is None:
            raise UsageError("--microbatches: required (unless --schedule-file says how many)")
        names = args.schedule or ("1f1b",)
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
        outputs = _check_outputs(args)
        progress.phase(f"reading {args.profile}")
        request = PlanRequest(
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
        if len(names) > 1:
            result = compare(request, names, progress)
        else:
            result = plan(request, outputs, progress)
    return print_result(result)


def _check_outputs(args: argparse.Namespace) -> Outputs:
    for option, path in (("--plot", args.plot), ("--timeline", args.timeline)):
        if path is not None and Path(path).suffix.lower() != ".png":
            raise UsageError(f"{option}: {path}: plots are PNG images; give a name ending in .png")
    return Outputs(
        [args.output, args.plan_output, args.plot, args.timeline],
        ["--output", "--plan-output", "--plot", "--timeline"],
    )


def print_result(result: PlanResult) -> int:
    """Print what :func:`plan` returns, once the progress bar is gone; exit status 0."""
    for warning in result.warnings:
        print(f"perseus: warning: {warning}", file=sys.stderr)
    sys.stdout.write(result.text)
    for path in result.written:
        sys.stdout.write(f"wrote {path}\n")
    return 0


def plan(request: PlanRequest, outputs: Outputs, progress: ProgressBar) -> PlanResult:
    """Plan, render every file and write them.

    Raises:
        PerseusError: A bad profile or schedule, an infeasible deadline, a solver limit.
        UsageError: A file could not be written (none was).
    """
    from perseus.files import FrontierFile, PlanFile, profile_fingerprint
    from perseus.solver import baselines_at, choose_point, compute_frontier, replay
    from perseus.solver.exact import recorded_sweeps

    profile = request.profile
    p_block_w = _blocking_power(request.p_block_w, profile)
    schedule = _request_schedule(request, request.schedule)
    fingerprint = profile_fingerprint(profile)
    _check_feasible(profile, schedule, p_block_w, request)

    progress.phase("planning")
    started = time.monotonic()
    try:
        with recorded_sweeps() as sweeps:
            frontier = compute_frontier(
                profile,
                schedule,
                p_block_w=p_block_w,
                resolution_s=request.resolution_s,
                exact=request.exact,
                exact_time_limit_s=request.exact_time_limit_s,
                polish_s=request.polish_s,
                progress=progress,
                clock_change_margin_s=request.clock_change_margin_s,
            )
    except SolverTimeout as err:
        raise SolverTimeout(f"{err} (--exact-time-limit SECONDS)") from err
    solved_s = time.monotonic() - started
    progress.phase("comparing with the baselines")
    policy = request.policy
    try:
        chosen = choose_point(frontier, policy)
    except InfeasibleDeadline as err:
        raise InfeasibleDeadline(f"--policy {policy}: {err}") from err
    warnings: list[str] = []
    exact = _exact_sweep(sweeps) if request.exact else None
    if exact is not None and exact.partial:
        warnings.append(
            f"--exact-time-limit {request.exact_time_limit_s:g} s cut the exact sweep short "
            f"({_cut_text(exact)}): the frontier is partial; allow more time for a complete one"
        )
    # The plan that runs: the chosen one, or under a straggler that slows this pipeline, the
    # least-energy plan that fits the straggler's time (as the planner server chooses).
    running = chosen
    straggler = None  # (the iteration time the straggler imposes, the straggler plan)
    if request.straggler_s is not None:
        from perseus.solver import straggler_point

        chosen_s = float(frontier.times_s[chosen])
        if request.straggler_s > chosen_s * (1 + 1e-12):
            try:
                running = straggler_point(frontier, request.straggler_s)
            except InfeasibleDeadline as err:
                raise InfeasibleDeadline(f"--straggler: {err}") from err
            straggler = (request.straggler_s, running)
        else:
            warnings.append(
                f"--straggler {request.straggler_s:g} s is not longer than the chosen plan's "
                f"{chosen_s:.4f} s: this pipeline, not the other, sets the pace, and the chosen "
                "plan runs as it is"
            )
    # The run's one set of baselines, shown alike by the table, frontier.json and the plot: at
    # the policy's own limit where it has one (max-slowdown, deadline), else at the chosen
    # point's time.
    deadline_s = _baselines_deadline(frontier, policy, chosen)
    baselines = baselines_at(
        profile,
        schedule,
        frontier.p_block_w,
        deadline_s,
        clock_change_margin_s=frontier.clock_change_margin_s,
    )

    # Everything that can fail on bad input has run; render the files in memory, then write.
    for path, data in request.extra_files.items():
        outputs.put(path, data)
    if request.output:
        progress.phase(f"rendering {request.output}")
        document = FrontierFile.of_run(
            frontier, baselines, profile=fingerprint, baselines_deadline_s=deadline_s
        )
        outputs.put(request.output, document.render())
    if request.plan_output:
        outputs.put(
            request.plan_output, PlanFile.of_point(frontier, running, profile=fingerprint).render()
        )
    if request.plot or request.timeline:
        progress.phase("loading matplotlib")
        from perseus import plots

        title = f"{Path(profile.source).name}: {schedule_text(schedule)}"
        if request.plot:
            progress.phase(f"drawing {request.plot}")
            outputs.put(
                request.plot,
                plots.frontier_png(
                    frontier,
                    chosen,
                    baselines=baselines,
                    title=title,
                    policy=str(policy),
                    deadline_s=deadline_s if policy.kind in ("max-slowdown", "deadline") else None,
                    straggler=straggler,
                ),
            )
        if request.timeline:
            progress.phase(f"drawing {request.timeline}")
            point = frontier.point(running)
            replayed = replay(
                profile,
                schedule,
                frontier.p_block_w,
                point.frequencies_mhz,
                clock_change_margin_s=frontier.clock_change_margin_s,
            )
            outputs.put(
                request.timeline,
                plots.timeline_png(
                    schedule,
                    replayed,
                    point.frequencies_mhz,
                    clock_range_mhz=_clock_range(profile),
                    title=f"{title}: {policy}, point {chosen}"
                    if straggler is None
                    else f"{title}: straggler at {straggler[0]:.4f} s, point {running}",
                ),
            )
    progress.phase("writing files")
    written = outputs.write()
    text = _describe(profile, schedule, frontier, solved_s)
    if exact is not None:
        text += f"exact     {exact_text(exact)}\n"
    text += "\n" + _plan_table(
        frontier, baselines, chosen, str(policy), straggler, request.straggler_s
    )
    return PlanResult(text, written, warnings)


def _request_schedule(request: PlanRequest, name: str) -> Schedule:
    """The schedule ``name`` on the request's profile, or the request's schedule file.

    A file whose order is one of the named schedules' is that schedule (so its frontier and
    plan files name it); another order can be planned but not written to those files.

    Raises:
        ScheduleError: A bad file, a list that deadlocks or misses actions, bad sizes.
        UsageError: The file disagrees with --microbatches, or an unnamed order with outputs.
    """
    from perseus.solver import SCHEDULE_NAMES, build_dag, make_schedule, schedule_from_actions
    from perseus.solver.schedules import CHUNKED_SCHEDULES

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
    from perseus.files import read_torch_schedule

    actions = read_torch_schedule(request.schedule_file)
    schedule = schedule_from_actions(Path(request.schedule_file).name, actions)
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
        if named.actions() == schedule.actions():
            return named
    if request.output or request.plan_output:
        raise UsageError(
            f"--schedule-file: {request.schedule_file} is none of the named schedules; its "
            "frontier and plan cannot be written to --output/--plan-output (those files name "
            "their schedule)"
        )
    return schedule


def compare(request: PlanRequest, names: Sequence[str], progress: ProgressBar) -> PlanResult:
    """What-if: plan each named schedule on the request's profile with its policy and print
    one table of iteration times and energies, the first schedule's default as reference.

    Raises:
        PerseusError: A bad profile or schedule, an infeasible policy, a solver limit.
    """
    from perseus.solver import baselines_at, choose_point, compute_frontier

    profile = request.profile
    p_block_w = _blocking_power(request.p_block_w, profile)
    policy = request.policy
    rows = [
        [
            "schedule",
            "chunks",
            "instructions",
            "default s",
            "default J",
            f"{policy} s",
            f"{policy} J",
            "saving",
            f"s vs {names[0]}",
            f"J vs {names[0]}",
        ]
    ]
    reference: tuple[float, float] | None = None
    for name in names:
        schedule = _request_schedule(request, name)
        progress.phase(f"planning {name}")
        frontier = compute_frontier(
            profile,
            schedule,
            p_block_w=p_block_w,
            resolution_s=request.resolution_s,
            polish_s=request.polish_s,
            progress=progress,
            clock_change_margin_s=request.clock_change_margin_s,
        )
        try:
            chosen = choose_point(frontier, policy)
        except InfeasibleDeadline as err:
            raise InfeasibleDeadline(f"--policy {policy} ({name}): {err}") from err
        point = frontier.point(chosen)
        default = baselines_at(
            profile,
            schedule,
            frontier.p_block_w,
            point.time_s,
            clock_change_margin_s=frontier.clock_change_margin_s,
        )["default"]
        if reference is None:
            reference = (default.time_s, default.energy_j)
        rows.append(
            [
                name,
                str(schedule.virtual_stages),
                str(schedule.num_instructions),
                f"{default.time_s:.4f}",
                f"{default.energy_j:.1f}",
                f"{point.time_s:.4f}",
                f"{point.energy_j:.1f}",
                saving_text(point.energy_j, default.energy_j),
                f"{100 * (point.time_s / reference[0] - 1):+.2f} %",
                f"{100 * (point.energy_j / reference[1] - 1):+.2f} %",
            ]
        )
    text = (
        f"profile   {profile.source}: {profile.num_stages} stages, {request.microbatches} "
        f"microbatches, P_block {p_block_w:g} W, clock-change margin "
        f"{1000 * request.clock_change_margin_s:g} ms\n\n"
        + format_table(rows, right=range(1, 10))
        + f"\ndefault: every instruction at the highest clock; saving: {policy} against its "
        f"schedule's default;\nvs {names[0]}: {policy} against {names[0]}'s default\n"
    )
    return PlanResult(text, [], [])


def _exact_sweep(sweeps: Sequence[ExactSweep]) -> ExactSweep | None:
    """The sweep of ``--exact`` (the last one with a time limit, else the last one)."""
    timed = [sweep for sweep in sweeps if sweep.time_limit_s is not None] or list(sweeps)
    return timed[-1] if timed else None


def exact_text(sweep: ExactSweep) -> str:
    """What an exact sweep solved, and what its time limit cut short, for the summary."""
    if not sweep.partial:
        return f"every point proven optimal ({sweep.solves} MILPs for {sweep.deadlines} deadlines)"
    limit = "" if sweep.time_limit_s is None else f" of {sweep.time_limit_s:g} s"
    return f"PARTIAL: the time limit{limit} cut {_cut_text(sweep)}"


def _cut_text(sweep: ExactSweep) -> str:
    parts = []
    if sweep.stopped:
        parts.append(
            f"{sweep.stopped} of {sweep.solves} MILPs stopped before proving optimality (their "
            "gaps stand)"
        )
    if sweep.unsolved:
        parts.append(
            f"{sweep.unsolved} of {sweep.deadlines} deadlines (the shortest) left to the fast "
            "mode's plans"
        )
    return "; ".join(parts)


def _check_feasible(
    profile: Profile, schedule: Schedule, p_block_w: float, request: PlanRequest
) -> None:
    """Refuse a deadline or straggler time that no plan meets, before any solving."""
    from perseus.solver import replay

    limits = []
    if request.policy.kind == "deadline":
        limits.append((f"--policy {request.policy}", float(request.policy.value or 0.0)))
    if request.straggler_s is not None:
        limits.append(("--straggler", request.straggler_s))
    if not limits:
        return
    fastest = [
        tuple(
            min(profile.options(gpu, ins.kind), key=lambda o: o.time_s).frequency_mhz for ins in seq
        )
        for gpu, seq in enumerate(schedule.order)
    ]
    try:
        fastest_s = replay(
            profile,
            schedule,
            p_block_w,
            fastest,
            clock_change_margin_s=request.clock_change_margin_s,
        ).time_s
    except PlanError:  # the profile does not fit the schedule: compute_frontier says how
        return
    for option, limit_s in limits:
        if limit_s < fastest_s * (1 - 1e-12):
            raise InfeasibleDeadline(
                f"{option}: no plan finishes within {limit_s:.6f} s; the fastest, every "
                f"instruction at its fastest clock, takes {fastest_s:.6f} s"
            )


def _baselines_deadline(frontier: Frontier, policy: Policy, chosen: int) -> float:
    value = float(policy.value or 0.0)
    if policy.kind == "deadline":
        return value
    if policy.kind == "max-slowdown":
        key = reference_key(frontier.baselines)
        reference_s = (
            frontier.baselines[key].time_s if key is not None else float(frontier.times_s[0])
        )
        return value * reference_s
    return float(frontier.times_s[chosen])


def _blocking_power(given: float | None, profile: Profile) -> float:
    if given is not None:
        return given
    if profile.p_block_w is not None:
        return profile.p_block_w
    raise ProfileError(
        f"{profile.source}: p_block_w: the profile carries no blocking power; pass --p-block WATTS"
    )


def _describe(profile: Profile, schedule: Schedule, frontier: Frontier, solved_s: float) -> str:
    clocks = {opt.frequency_mhz for s in profile.stages for opts in s.values() for opt in opts}
    times = frontier.times_s
    return (
        f"profile   {profile.source}: {profile.num_stages} stages, {len(clocks)} clocks\n"
        f"schedule  {schedule_text(schedule)} ({schedule.num_instructions} instructions), "
        f"P_block {frontier.p_block_w:g} W{margin_text(frontier.clock_change_margin_s)}\n"
        f"frontier  {len(frontier)} points, {times[0]:.4f} s to {times[-1]:.4f} s, "
        f"solved in {solved_s:.2f} s\n"
    )


def margin_text(margin_s: float) -> str:
    """The clock-change margin the stated figures include, for the summary (nothing at 0)."""
    return f", clock-change margin {1000 * margin_s:g} ms" if margin_s > 0 else ""


def _plan_table(
    frontier: Frontier,
    baselines: Mapping[str, Baseline],
    chosen: int,
    policy: str,
    straggler: tuple[float, int] | None,
    straggler_s: float | None,
) -> str:
    key = reference_key(baselines)
    if key is None:
        raise PlanError("baselines: neither default nor all_fastest was computed")
    reference = baselines[key]

    def row(label: str, time_s: float, energy_j: float, gap: str, base_j: float) -> list[str]:
        return [
            label,
            f"{time_s:.4f}",
            f"{energy_j:.1f}",
            saving_text(energy_j, base_j),
            f"{100 * (time_s / reference.time_s - 1):.2f} %",
            gap,
        ]

    rows = [["plan", "time (s)", "energy (J)", "saving", "slowdown", "gap"]]
    for name, baseline in shown_baselines(baselines):
        label = f"{baseline_label(name)}{_clocks_note(baseline.frequencies_mhz)}"
        rows.append(row(label, baseline.time_s, baseline.energy_j, "-", reference.energy_j))
    point = frontier.point(chosen)
    rows.append(
        row(
            f"{policy} (point {chosen} of {len(frontier)})",
            point.time_s,
            point.energy_j,
            f"{100 * point.gap:.2f} %",
            reference.energy_j,
        )
    )
    notes = [f"saving and slowdown are against {baseline_label(key)}"]
    if straggler is not None:
        imposed_s, index = straggler
        blocking_w = frontier.p_block_w * frontier.schedule.stages
        base_s, base_j = stretched(reference.time_s, reference.energy_j, blocking_w, imposed_s)
        if base_s > reference.time_s:
            rows.append(row(f"{baseline_label(key)}, stretched", base_s, base_j, "-", base_j))
        rows.append(
            row(
                f"straggler (point {index} of {len(frontier)})",
                imposed_s,
                frontier.energy_at(index, imposed_s),
                f"{100 * frontier.point(index).gap:.2f} %",
                base_j,
            )
        )
        notes.append(straggler_note(baseline_label(key), imposed_s, reference.time_s))
        notes.append(
            "the straggler plan is the one that runs: --plan-output and --timeline take it"
        )
    elif straggler_s is not None:
        notes.append(straggler_note(baseline_label(key), straggler_s, point.time_s, slows=False))
    return format_table(rows, right=range(1, 6)) + "".join(f"{note}\n" for note in notes)


def stretched(
    time_s: float, energy_j: float, blocking_w: float, iteration_s: float
) -> tuple[float, float]:
    """A plan of ``time_s`` and ``energy_j`` when every iteration takes ``iteration_s`` (a
    straggler's): its GPUs block for the difference, drawing ``blocking_w`` together (the
    pipeline's blocking power); a plan that takes longer is left as it is."""
    if iteration_s <= time_s:
        return time_s, energy_j
    return iteration_s, energy_j + blocking_w * (iteration_s - time_s)


def straggler_note(
    reference: str, iteration_s: float, other_s: float, *, slows: bool = True
) -> str:
    """The footer of the straggler rows, alike in ``perseus plan`` and ``perseus job frontier``.

    ``slows``: the straggler's ``iteration_s`` is longer than the chosen plan's, so the
    straggler plan runs and the reference (of ``other_s``) is stretched to ``iteration_s``.
    Else ``other_s`` is the chosen plan's time, which the straggler does not lengthen.
    """
    if not slows:
        return (
            f"straggler: its {iteration_s:.4f} s is not longer than the chosen plan's "
            f"{other_s:.4f} s,\nso it does not slow this pipeline: the chosen plan runs as it is"
        )
    against = (
        f"{reference} stretched to that time"
        if iteration_s > other_s
        else f"{reference}, which takes longer ({other_s:.4f} s) and is not stretched"
    )
    return (
        f"straggler rows: the iteration takes {iteration_s:.4f} s because of another pipeline;\n"
        f"their saving is against {against}"
    )


def _clocks_note(frequencies_mhz: Sequence[Sequence[int]]) -> str:
    per_gpu = [set(clocks) for clocks in frequencies_mhz]
    if per_gpu and all(len(clocks) == 1 for clocks in per_gpu):
        distinct = [next(iter(clocks)) for clocks in per_gpu]
        if len(set(distinct)) == 1:
            return f" {distinct[0]} MHz"
        if len(distinct) <= 8:
            return f" {'/'.join(map(str, distinct))} MHz"
    return ""


def _clock_range(profile: Profile) -> tuple[int, int]:
    clocks = [opt.frequency_mhz for s in profile.stages for opts in s.values() for opt in opts]
    return min(clocks), max(clocks)
