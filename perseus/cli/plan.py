"""``perseus plan``: the time-energy frontier of a profile, the baselines, the chosen plan.

Everything is computed first and the files are written last, all or none
(:class:`~perseus.cli.outputs.Outputs`), so a bad input leaves nothing behind. ``perseus demo``
runs the same planning on the shipped example profile (:func:`plan`, :func:`print_result`).

The command line and the request it builds are :mod:`perseus.cli.plan_request`; the report's
text is :mod:`perseus.cli.plan_views`. This module plans: :func:`run` parses, :func:`plan` (or
:func:`compare`, for several schedules) solves and writes, :func:`print_result` prints.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perseus.cli.arguments import asks_help
from perseus.cli.outputs import Outputs
from perseus.cli.plan_request import (
    PlanRequest,
    blocking_power,
    build_parser,
    check_arguments,
    check_outputs,
    request_of,
    request_schedule,
)
from perseus.cli.plan_views import (
    ScheduleOutcome,
    cut_text,
    describe,
    exact_text,
    margin_text,
    plan_table,
    straggler_note,
    stretched,
    whatif_table,
)
from perseus.cli.progress import ProgressBar
from perseus.cli.tables import schedule_text
from perseus.core.baselines import reference_key
from perseus.core.errors import InfeasibleDeadline, PlanError, SolverTimeout

if TYPE_CHECKING:
    from perseus.solver import Frontier, Policy, Profile, Schedule
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
        names = check_arguments(args)
        outputs = check_outputs(args)
        progress.phase(f"reading {args.profile}")
        request = request_of(args, names)
        if len(names) > 1:
            result = compare(request, names, progress)
        else:
            result = plan(request, outputs, progress)
    return print_result(result)


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
    from perseus.formats.plan_files import FrontierFile, PlanFile, profile_fingerprint
    from perseus.solver import baselines_at, choose_point, compute_frontier
    from perseus.solver.exact import recorded_sweeps

    profile = request.profile
    p_block_w = blocking_power(request.p_block_w, profile)
    schedule = request_schedule(request, request.schedule)
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
            f"({cut_text(exact)}): the frontier is partial; allow more time for a complete one"
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
            replayed = frontier.replay_point(profile, running)
            outputs.put(
                request.timeline,
                plots.timeline_png(
                    schedule,
                    replayed,
                    point.frequencies_mhz,
                    clock_range_mhz=profile.clock_range_mhz,
                    title=f"{title}: {policy}, point {chosen}"
                    if straggler is None
                    else f"{title}: straggler at {straggler[0]:.4f} s, point {running}",
                ),
            )
    progress.phase("writing files")
    written = outputs.write()
    text = describe(profile, schedule, frontier, solved_s)
    if exact is not None:
        text += f"exact     {exact_text(exact)}\n"
    text += "\n" + plan_table(
        frontier, baselines, chosen, str(policy), straggler, request.straggler_s
    )
    return PlanResult(text, written, warnings)


def compare(request: PlanRequest, names: Sequence[str], progress: ProgressBar) -> PlanResult:
    """What-if: plan each named schedule on the request's profile with its policy and print
    one table of iteration times and energies, the first schedule's default as reference.

    Raises:
        PerseusError: A bad profile or schedule, an infeasible policy, a solver limit.
    """
    from perseus.solver import baselines_at, choose_point, compute_frontier

    profile = request.profile
    p_block_w = blocking_power(request.p_block_w, profile)
    policy = request.policy
    outcomes = []
    for name in names:
        schedule = request_schedule(request, name)
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
        outcomes.append(ScheduleOutcome(name, schedule, default, point.time_s, point.energy_j))
    text = whatif_table(
        profile,
        request.microbatches,
        p_block_w,
        request.clock_change_margin_s,
        policy,
        outcomes,
    )
    return PlanResult(text, [], [])


def _exact_sweep(sweeps: Sequence[ExactSweep]) -> ExactSweep | None:
    """The sweep of ``--exact`` (the last one with a time limit, else the last one)."""
    timed = [sweep for sweep in sweeps if sweep.time_limit_s is not None] or list(sweeps)
    return timed[-1] if timed else None


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
