"""The ``perseus`` command: plan, simulate, demo, serve, job, profile, reset-clocks.

Every subcommand computes everything first and writes its files last, each through a temporary
file renamed into place, so a bad input leaves nothing behind. Errors print one line,
``perseus: error: ...`` naming the file, row or field, and exit with status 2.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn, TextIO

from perseus.arguments import finite_number, integer_at_least
from perseus.arguments import policy as policy_argument
from perseus.errors import InfeasibleDeadline, PerseusError, PlanError, ProfileError
from perseus.solver import (
    FRONTIER_FORMAT,
    SCHEDULE_NAMES,
    Baseline,
    Frontier,
    Policy,
    Profile,
    Schedule,
    baselines_at,
    choose_point,
    compute_frontier,
    load_profile,
    make_schedule,
    replay,
    straggler_point,
)
from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W

__all__ = ["PLAN_FORMAT", "main"]

PLAN_FORMAT = "perseus.plan/1"
EXIT_ERROR = 2
DEMO_MICROBATCHES = 8
DEFAULT_POLISH_S = 30.0  # seconds the no-slowdown plan may be improved by a branch and bound
_BASELINE_LABELS = {
    "all_fastest": "all-fastest (default)",
    "global_clock": "global clock",
    "per_stage_clock": "per-stage clock",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``perseus`` command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status: 0 on success, 2 on bad input (after one ``perseus: error:`` line).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list[:1] == ["serve"]:
            return _serve(args_list[1:])
        if args_list[:1] == ["job"]:
            return _job(args_list[1:])
        if args_list[:1] == ["profile"]:
            return _profile(args_list[1:])
        if args_list[:1] == ["reset-clocks"]:
            return _reset_clocks(args_list[1:])
        args = _build_parser().parse_args(args_list)
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except (_UsageError, PerseusError) as err:
        print(f"perseus: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (`perseus ... | head`): stop quietly, as other tools do. Point
        # stdout at devnull so the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


class _UsageError(Exception):
    """A bad command line; the message says which argument and why."""


class _Parser(argparse.ArgumentParser):
    """An argument parser that reports errors in one line instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog.removeprefix('perseus').strip() or 'perseus'}: {message}")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="perseus",
        description="Plan per-instruction GPU clocks for pipeline-parallel training.",
    )
    parser.set_defaults(run=_no_command)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)

    plan = commands.add_parser(
        "plan",
        help="compute the time-energy frontier of a profile and pick a plan",
        description="Compute the time-energy frontier of a profile, compare it with the "
        "baselines and pick the point a policy chooses.",
    )
    plan.add_argument("profile", metavar="PROFILE", help="profile: Zeus CSV or perseus JSON")
    _add_planning_arguments(plan)
    plan.add_argument(
        "--straggler",
        metavar="SECONDS",
        type=_positive_float,
        help="what-if: another pipeline imposes this iteration time",
    )
    plan.add_argument("--output", metavar="FRONTIER.json", help="write the frontier as JSON")
    plan.add_argument("--plan-output", metavar="PLAN.json", help="write the chosen plan as JSON")
    plan.add_argument("--plot", metavar="FRONTIER.png", help="plot the frontier")
    plan.add_argument("--timeline", metavar="TIMELINE.png", help="plot the chosen plan's timeline")
    plan.set_defaults(run=_run_plan)

    simulate = commands.add_parser(
        "simulate",
        help="replay a plan on a profile: time, energy, per-stage busy and idle",
        description="Replay a plan (a frontier point or a single plan) on a profile.",
    )
    simulate.add_argument("profile", metavar="PROFILE", help="profile: Zeus CSV or perseus JSON")
    simulate.add_argument("plan", metavar="PLAN.json", help="perseus.frontier/1 or perseus.plan/1")
    simulate.add_argument(
        "--p-block", metavar="WATTS", type=_positive_float, help="blocking power (default: plan's)"
    )
    pick = simulate.add_mutually_exclusive_group()
    pick.add_argument("--point", metavar="N", type=_index, help="frontier point index")
    pick.add_argument(
        "--policy",
        metavar="POLICY",
        type=_policy,
        help="pick the frontier point by policy (default no-slowdown)",
    )
    simulate.set_defaults(run=_run_simulate)

    demo = commands.add_parser(
        "demo",
        help="plan the shipped example profile and draw the plots (no GPU needed)",
        description=f"Plan the shipped synthetic H200-like example profile: 1F1B, "
        f"{DEMO_MICROBATCHES} microbatches, P_block {EXAMPLE_P_BLOCK_W:g} W. Writes "
        "frontier.json, frontier.png and timeline.png.",
    )
    demo.add_argument("--outdir", metavar="DIR", default=".", help="where to write (default .)")
    demo.set_defaults(run=_run_demo)

    # Built in full only when run (below), so that their imports cost nothing here.
    commands.add_parser(
        "serve",
        help="run the planner server (needs perseus[server]; see 'perseus serve --help')",
        add_help=False,
    )
    commands.add_parser(
        "job",
        help="create, inspect and steer jobs on a planner server (see 'perseus job --help')",
        add_help=False,
    )
    commands.add_parser(
        "profile",
        help="profile this machine's GPU without a server (see 'perseus profile --help')",
        add_help=False,
    )
    commands.add_parser(
        "reset-clocks",
        help="restore default SM clocks, e.g. after a training process was killed",
        add_help=False,
    )
    return parser


def _add_planning_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--microbatches", metavar="M", type=_positive_int, required=True, help="microbatches"
    )
    parser.add_argument(
        "--p-block",
        metavar="WATTS",
        type=_positive_float,
        help="blocking power of a waiting GPU (default: the JSON profile's p_block_w)",
    )
    parser.add_argument("--schedule", choices=SCHEDULE_NAMES, default="1f1b", help="(default 1f1b)")
    parser.add_argument(
        "--virtual-stages",
        metavar="V",
        type=_positive_int,
        help="model chunks per GPU for interleaved-1f1b (default 2 there, else 1)",
    )
    parser.add_argument(
        "--policy",
        metavar="POLICY",
        type=_policy,
        default=Policy.parse("no-slowdown"),
        help="no-slowdown (default), max-slowdown:FACTOR, deadline:SECONDS, min-energy, "
        "zeus-cost:ETA",
    )
    parser.add_argument(
        "--resolution",
        metavar="SECONDS",
        type=_positive_float,
        default=1e-3,
        help="time step between frontier points (default 0.001)",
    )
    parser.add_argument(
        "--exact", action="store_true", help="solve every deadline exactly (MILP; small cases)"
    )
    parser.add_argument(
        "--polish",
        metavar="SECONDS",
        type=_nonnegative_float,
        default=DEFAULT_POLISH_S,
        help="time to spend improving the no-slowdown plan with a branch and bound "
        f"(default {DEFAULT_POLISH_S:g}; 0: off; it stops early once the plan is optimal)",
    )


def _no_command(_args: argparse.Namespace) -> int:
    raise _UsageError(
        "a command is required: plan, simulate, demo, serve, job, profile or reset-clocks "
        "(see perseus --help)"
    )


_positive_int = integer_at_least(1)
_index = integer_at_least(0)
_positive_float = finite_number(0, inclusive=False)
_nonnegative_float = finite_number(0, inclusive=True)
_policy = policy_argument


# plan and demo


@dataclass(frozen=True, slots=True)
class _PlanRequest:
    profile_path: str
    microbatches: int
    p_block_w: float | None
    schedule: str
    virtual_stages: int | None
    policy: Policy
    resolution_s: float
    exact: bool
    polish_s: float = 0.0
    straggler_s: float | None = None
    output: str | None = None
    plan_output: str | None = None
    plot: str | None = None
    timeline: str | None = None


def _run_plan(args: argparse.Namespace) -> int:
    request = _PlanRequest(
        profile_path=args.profile,
        microbatches=args.microbatches,
        p_block_w=args.p_block,
        schedule=args.schedule,
        virtual_stages=args.virtual_stages,
        policy=args.policy,
        resolution_s=args.resolution,
        exact=args.exact,
        polish_s=args.polish,
        straggler_s=args.straggler,
        output=args.output,
        plan_output=args.plan_output,
        plot=args.plot,
        timeline=args.timeline,
    )
    return _plan(request, sys.stdout)


def _run_demo(args: argparse.Namespace) -> int:
    outdir = Path(args.outdir).resolve()  # absolute, so the demo says exactly where it wrote
    if outdir.exists() and not outdir.is_dir():
        raise _UsageError(f"--outdir: {outdir} exists and is not a directory")
    outdir.mkdir(parents=True, exist_ok=True)
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        request = _PlanRequest(
            profile_path=str(path),
            microbatches=DEMO_MICROBATCHES,
            p_block_w=EXAMPLE_P_BLOCK_W,
            schedule="1f1b",
            virtual_stages=None,
            policy=Policy.parse("no-slowdown"),
            resolution_s=1e-3,
            exact=False,
            polish_s=DEFAULT_POLISH_S,
            output=str(outdir / "frontier.json"),
            plot=str(outdir / "frontier.png"),
            timeline=str(outdir / "timeline.png"),
        )
        return _plan(request, sys.stdout)


def _plan(request: _PlanRequest, out: TextIO) -> int:
    outputs = _Outputs(
        [request.output, request.plan_output, request.plot, request.timeline],
        ["--output", "--plan-output", "--plot", "--timeline"],
    )
    profile = load_profile(request.profile_path)
    p_block_w = _blocking_power(request.p_block_w, profile)
    virtual_stages = request.virtual_stages
    if virtual_stages is None:
        virtual_stages = 2 if request.schedule == "interleaved-1f1b" else 1
    schedule = make_schedule(
        request.schedule, profile.num_stages, request.microbatches, virtual_stages
    )

    started = time.monotonic()
    bar = ProgressBar(sys.stderr)
    try:
        frontier = compute_frontier(
            profile,
            schedule,
            p_block_w=p_block_w,
            resolution_s=request.resolution_s,
            exact=request.exact,
            polish_s=request.polish_s,
            progress=bar,
        )
    finally:
        bar.close()
    solved_s = time.monotonic() - started
    try:
        chosen = choose_point(frontier, request.policy)
    except InfeasibleDeadline as err:
        raise InfeasibleDeadline(f"--policy {request.policy}: {err}") from err
    straggler = None
    if request.straggler_s is not None:
        try:
            straggler = (request.straggler_s, straggler_point(frontier, request.straggler_s))
        except InfeasibleDeadline as err:
            raise InfeasibleDeadline(f"--straggler: {err}") from err

    # Baselines at the same deadline as the chosen point: the policy's own limit where it has
    # one, else the point's iteration time.
    policy = request.policy
    if policy.kind == "max-slowdown":
        deadline_s = float(policy.value or 1.0) * float(frontier.times_s[0])
    elif policy.kind == "deadline":
        deadline_s = float(policy.value or 0.0)
    else:
        deadline_s = float(frontier.times_s[chosen])
    baselines = baselines_at(profile, schedule, frontier.p_block_w, deadline_s)

    # Everything that can fail on bad input has run; render the files in memory, then write.
    point = frontier.point(chosen)
    if request.output:
        text = io.StringIO()
        frontier.write_json(text)
        outputs.put(request.output, text.getvalue().encode())
    if request.plan_output:
        outputs.put(request.plan_output, _plan_bytes(frontier, chosen))
    if request.plot or request.timeline:
        from perseus import plots  # matplotlib is slow to import; only load it when drawing

        title = f"{Path(profile.source).name}: {_schedule_text(schedule)}"
        if request.plot:
            outputs.put(
                request.plot,
                plots.frontier_png(
                    frontier, chosen, title=title, policy=str(request.policy), straggler=straggler
                ),
            )
        if request.timeline:
            replayed = replay(profile, schedule, frontier.p_block_w, point.frequencies_mhz)
            outputs.put(
                request.timeline,
                plots.timeline_png(
                    schedule,
                    replayed,
                    point.frequencies_mhz,
                    clock_range_mhz=_clock_range(profile),
                    title=f"{title}: {request.policy}, point {chosen}",
                ),
            )

    written = outputs.write()
    out.write(_describe(profile, schedule, frontier, solved_s))
    out.write("\n")
    out.write(_plan_table(frontier, baselines, chosen, str(request.policy), straggler))
    for path in written:
        out.write(f"wrote {path}\n")
    return 0


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
        f"schedule  {_schedule_text(schedule)} ({schedule.num_instructions} instructions), "
        f"P_block {frontier.p_block_w:g} W\n"
        f"frontier  {len(frontier)} points, {times[0]:.4f} s to {times[-1]:.4f} s, "
        f"solved in {solved_s:.2f} s\n"
    )


def _schedule_text(schedule: Schedule) -> str:
    text = f"{schedule.name}, {schedule.stages} stages x {schedule.microbatches} microbatches"
    if schedule.virtual_stages > 1:
        text += f" x {schedule.virtual_stages} chunks"
    return text


def _plan_table(
    frontier: Frontier,
    baselines: dict[str, Baseline],
    chosen: int,
    policy: str,
    straggler: tuple[float, int] | None,
) -> str:
    fastest = baselines["all_fastest"]

    def row(label: str, time_s: float, energy_j: float, gap: str, base: float) -> list[str]:
        return [
            label,
            f"{time_s:.4f}",
            f"{energy_j:.1f}",
            f"{100 * (1 - energy_j / base):.2f} %",
            f"{100 * (time_s / fastest.time_s - 1):.2f} %",
            gap,
        ]

    rows = [["plan", "time (s)", "energy (J)", "saving", "slowdown", "gap"]]
    for key, label in _BASELINE_LABELS.items():
        baseline = baselines[key]
        rows.append(
            row(
                f"{label}{_clocks_note(baseline.frequencies_mhz)}",
                baseline.time_s,
                baseline.energy_j,
                "-",
                fastest.energy_j,
            )
        )
    point = frontier.point(chosen)
    rows.append(
        row(
            f"{policy} (point {chosen} of {len(frontier)})",
            point.time_s,
            point.energy_j,
            f"{100 * point.gap:.2f} %",
            fastest.energy_j,
        )
    )
    if straggler is not None:
        imposed_s, index = straggler
        stretched_j = fastest.energy_j + frontier.p_block_w * frontier.schedule.stages * (
            imposed_s - fastest.time_s
        )
        rows.append(row("all-fastest, stretched", imposed_s, stretched_j, "-", stretched_j))
        rows.append(
            row(
                f"straggler (point {index} of {len(frontier)})",
                imposed_s,
                frontier.energy_at(index, imposed_s),
                f"{100 * frontier.point(index).gap:.2f} %",
                stretched_j,
            )
        )
    text = _format_table(rows, right=range(1, 6))
    if straggler is not None:
        text += (
            f"straggler rows: the iteration takes {straggler[0]:.4f} s because of another "
            "pipeline; saving is against all-fastest stretched to that time\n"
        )
    return text


def _clocks_note(frequencies_mhz: Sequence[Sequence[int]]) -> str:
    per_gpu = [set(clocks) for clocks in frequencies_mhz]
    if all(len(clocks) == 1 for clocks in per_gpu):
        distinct = [next(iter(clocks)) for clocks in per_gpu]
        if len(set(distinct)) == 1:
            return f" {distinct[0]} MHz"
        if len(distinct) <= 8:
            return f" {'/'.join(map(str, distinct))} MHz"
    return ""


def _format_table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _clock_range(profile: Profile) -> tuple[int, int]:
    clocks = [opt.frequency_mhz for s in profile.stages for opts in s.values() for opt in opts]
    return min(clocks), max(clocks)


# simulate


def _run_simulate(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    data = _read_json(args.plan)
    fmt = data.get("format")
    stated: tuple[float, float] | None = None
    if fmt == FRONTIER_FORMAT:
        try:
            frontier = Frontier.from_json(data)
        except PlanError as err:
            raise PlanError(f"{args.plan}: {err}") from err
        if args.point is not None:
            if args.point >= len(frontier):
                raise _UsageError(
                    f"--point: {args.point} is out of range; {args.plan} has points "
                    f"0..{len(frontier) - 1}"
                )
            index = args.point
        else:
            index = choose_point(frontier, args.policy or Policy.parse("no-slowdown"))
        point = frontier.point(index)
        schedule, frequencies = frontier.schedule, point.frequencies_mhz
        plan_p_block = frontier.p_block_w
        stated = (point.time_s, point.energy_j)
        what = f"point {index} of {len(frontier)} in {args.plan}"
    elif fmt == PLAN_FORMAT:
        if args.point is not None or args.policy is not None:
            raise _UsageError(f"--point and --policy pick a frontier point; {args.plan} is a plan")
        schedule, frequencies, plan_p_block = _parse_plan(data, args.plan)
        what = args.plan
    else:
        raise PlanError(
            f"{args.plan}: format: expected {FRONTIER_FORMAT!r} or {PLAN_FORMAT!r}, got {fmt!r}"
        )
    p_block_w = args.p_block if args.p_block is not None else plan_p_block
    try:
        result = replay(profile, schedule, p_block_w, frequencies)
    except PlanError as err:
        raise PlanError(f"{args.plan}: {err} (profile {profile.source})") from err

    out = sys.stdout
    out.write(f"plan      {what}\n")
    out.write(f"profile   {profile.source}: {profile.num_stages} stages\n")
    out.write(f"schedule  {_schedule_text(schedule)}, P_block {p_block_w:g} W\n\n")
    out.write(f"iteration time  {result.time_s:.6f} s\n")
    out.write(f"energy          {result.energy_j:.3f} J\n")
    if stated is not None and p_block_w == plan_p_block:
        out.write(f"(the frontier states {stated[0]:.6f} s and {stated[1]:.3f} J)\n")
    out.write("\n")
    rows = [["stage", "busy (s)", "idle (s)", "busy"]]
    for stage, (busy, idle) in enumerate(zip(result.busy_s, result.idle_s, strict=True)):
        rows.append(
            [str(stage), f"{busy:.4f}", f"{idle:.4f}", f"{100 * busy / result.time_s:.1f} %"]
        )
    out.write(_format_table(rows, right=range(4)))
    return 0


def _read_json(path: str) -> Mapping[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise PlanError(f"{path}: cannot read plan: {err}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PlanError(f"{path}: line {err.lineno}: not valid JSON: {err.msg}") from err
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a JSON object with a 'format' field")
    return data


def _parse_plan(
    data: Mapping[str, Any], path: str
) -> tuple[Schedule, tuple[tuple[int, ...], ...], float]:
    """Validate a ``perseus.plan/1`` object; returns its schedule, clocks and blocking power."""

    def integer(name: str) -> int:
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{path}: {name}: expected an integer >= 1, got {value!r}")
        return value

    name = data.get("schedule")
    if not isinstance(name, str):
        raise PlanError(f"{path}: schedule: expected one of {', '.join(SCHEDULE_NAMES)}")
    p_block = data.get("p_block_w")
    if (
        isinstance(p_block, bool)
        or not isinstance(p_block, int | float)
        or not math.isfinite(p_block)
        or p_block <= 0
    ):
        raise PlanError(f"{path}: p_block_w: expected a finite number > 0, got {p_block!r}")
    try:
        schedule = make_schedule(
            name, integer("stages"), integer("microbatches"), integer("virtual_stages")
        )
    except PerseusError as err:
        raise PlanError(f"{path}: {err}") from err
    raw = data.get("frequencies_mhz")
    if not isinstance(raw, list) or len(raw) != schedule.stages:
        raise PlanError(
            f"{path}: frequencies_mhz: expected a list of {schedule.stages} lists (one per GPU)"
        )
    frequencies = []
    for gpu, clocks in enumerate(raw):
        expected = len(schedule.order[gpu])
        if not isinstance(clocks, list) or len(clocks) != expected:
            raise PlanError(
                f"{path}: frequencies_mhz[{gpu}]: expected {expected} clocks, one per instruction"
            )
        for k, clock in enumerate(clocks):
            if isinstance(clock, bool) or not isinstance(clock, int) or clock < 1:
                raise PlanError(
                    f"{path}: frequencies_mhz[{gpu}][{k}]: expected a clock in MHz, got {clock!r}"
                )
        frequencies.append(tuple(clocks))
    return schedule, tuple(frequencies), float(p_block)


def _plan_bytes(frontier: Frontier, index: int) -> bytes:
    schedule = frontier.schedule
    head = {
        "format": PLAN_FORMAT,
        "schedule": schedule.name,
        "stages": schedule.stages,
        "microbatches": schedule.microbatches,
        "virtual_stages": schedule.virtual_stages,
        "p_block_w": frontier.p_block_w,
    }
    # One line per GPU keeps a plan readable; json.dumps(indent=...) would give one per clock.
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    per_gpu = [f"    {json.dumps(list(c))}" for c in frontier.point(index).frequencies_mhz]
    text = "{\n" + "\n".join(lines) + '\n  "frequencies_mhz": [\n'
    text += ",\n".join(per_gpu) + "\n  ]\n}\n"
    return text.encode()


# serve


def _serve(argv: list[str]) -> int:
    try:
        from perseus.server.cli import add_serve_arguments, run_serve
    except ImportError as err:
        raise _UsageError(
            f"serve: the planner server is not installed ({err}); install perseus[server]"
        ) from err
    parser = _Parser(prog="perseus serve", description="Run the planner server.")
    add_serve_arguments(parser)
    status: int = run_serve(parser.parse_args(argv))
    return status


# job, profile, reset-clocks: the client side, imported only when one of them runs


def _job(argv: list[str]) -> int:
    from perseus.client.jobcli import CommandError, add_job_arguments, run_job

    parser = _Parser(
        prog="perseus job",
        description="Create, inspect and steer jobs on a planner server. The server, job and "
        "token default to $PERSEUS_SERVER, $PERSEUS_JOB and $PERSEUS_TOKEN, as "
        'eval "$(perseus job create ...)" sets them.',
    )
    add_job_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_job(args)
    except (CommandError, PerseusError) as err:
        raise _UsageError(f"job {argv[0]}: {err}") from err


def _profile(argv: list[str]) -> int:
    try:
        from perseus.client.standalone import add_profile_arguments, run_profile
    except ImportError as err:
        raise _UsageError(
            f"profile: the client is not installed ({err}); install perseus[client]"
        ) from err
    parser = _Parser(
        prog="perseus profile",
        description="Profile this machine's GPU: time and energy per instruction and clock.",
    )
    add_profile_arguments(parser)
    status: int = run_profile(parser.parse_args(argv))
    return status


def _reset_clocks(argv: list[str]) -> int:
    from perseus.client.jobcli import add_reset_clocks_arguments, run_reset_clocks

    parser = _Parser(
        prog="perseus reset-clocks",
        description="Restore the default SM clocks of GPUs, e.g. after a training process "
        "that locked them was killed with -9. Usually needs root.",
    )
    add_reset_clocks_arguments(parser)
    return run_reset_clocks(parser.parse_args(argv))


# output files and progress


@dataclass
class _Outputs:
    """Files to write at the very end, each through a temporary file renamed into place."""

    paths: list[str | None]
    options: list[str]
    _pending: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Check destinations before the long computation rather than fail after it.
        for path, option in zip(self.paths, self.options, strict=True):
            if path is None:
                continue
            target = Path(path)
            if target.is_dir():
                raise _UsageError(f"{option}: {path} is a directory")
            parent = target.parent
            if not parent.is_dir():
                raise _UsageError(f"{option}: {path}: directory {parent} does not exist")
            if not os.access(parent, os.W_OK):
                raise _UsageError(f"{option}: {path}: directory {parent} is not writable")

    def put(self, path: str, data: bytes) -> None:
        self._pending[path] = data

    def write(self) -> list[str]:
        """Write every pending file; all temporaries first, then the renames."""
        staged: list[tuple[str, str]] = []
        umask = os.umask(0)
        os.umask(umask)
        try:
            for path, data in self._pending.items():
                fd, tmp = tempfile.mkstemp(
                    dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=".tmp"
                )
                staged.append((tmp, path))
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual mode
            for tmp, path in staged:
                os.replace(tmp, path)
        except OSError as err:
            for tmp, _ in staged:
                Path(tmp).unlink(missing_ok=True)
            raise _UsageError(f"cannot write {err.filename or 'output'}: {err.strerror}") from err
        return list(self._pending)


class ProgressBar:
    """A ``progress(done, total)`` callback that draws a bar on a terminal.

    Nothing is drawn during the first ``delay_s`` seconds, so quick runs stay silent, nor when
    the stream is not a terminal (logs and pipes). Redraws at most every ``interval_s`` seconds.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        delay_s: float = 0.5,
        interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        width: int = 30,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._delay_s = delay_s
        self._interval_s = interval_s
        self._width = width
        self._last_draw = -math.inf
        self._drawn = False
        self._enabled = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        now = self._clock()
        if now - self._start < self._delay_s or now - self._last_draw < self._interval_s:
            return
        self._last_draw = now
        fraction = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
        filled = round(fraction * self._width)
        bar = "#" * filled + "." * (self._width - filled)
        self._stream.write(f"\rplanning [{bar}] {done}/{total} {now - self._start:.1f} s")
        self._stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar, if one was drawn."""
        if self._drawn:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._drawn = False


if __name__ == "__main__":
    sys.exit(main())
