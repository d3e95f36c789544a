"""The ``perseus`` command: plan, simulate, demo, serve, job, profile, reset-clocks.

Every subcommand computes everything first and writes its files last, each through a temporary
file renamed into place, so a bad input leaves nothing behind. Errors print one line,
``perseus: error: ...`` naming the file, row or field, and exit with status 2.

Importing this module costs only the standard library: each subcommand builds its parser and
imports what it needs (the solver, the server, the client) when it runs, so ``perseus --help``
answers at once and ``perseus plan`` shows its progress before the solver has loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from perseus import __version__
from perseus.arguments import finite_number, integer_at_least
from perseus.arguments import policy as policy_argument
from perseus.baselines import baseline_label, reference_key, saving_text, shown_baselines
from perseus.defaults import EXACT_TIME_LIMIT_S, POLISH_S, RESOLUTION_S
from perseus.errors import (
    InfeasibleDeadline,
    PerseusError,
    PlanError,
    ProfileError,
    SolverTimeout,
)
from perseus.outputs import check_writable, resolve, write_files

if TYPE_CHECKING:
    from perseus.solver import Baseline, Frontier, Policy, Profile, Schedule

__all__ = ["ProgressBar", "command_parser", "install_hint", "main"]

EXIT_ERROR = 2
DEMO_MICROBATCHES = 8
DISTRIBUTION = "perseus-planner"
_COMMAND_HELP = {
    "plan": "compute the time-energy frontier of a profile and pick a plan",
    "simulate": "replay a plan on a profile: time, energy, per-stage busy and idle",
    "demo": "plan the shipped example profile and draw the plots (no GPU needed)",
    "serve": f"run the planner server (needs {DISTRIBUTION}[server])",
    "job": "create, inspect and steer jobs on a planner server",
    "profile": "profile this machine's GPU without a server",
    "reset-clocks": "restore default SM clocks, e.g. after a training process was killed",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``perseus`` command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status: 0 on success, 2 on bad input (after one ``perseus: error:`` line).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    commands: dict[str, Callable[[list[str]], int]] = {
        "plan": _plan_command,
        "simulate": _simulate_command,
        "demo": _demo_command,
        "serve": _serve,
        "job": _job,
        "profile": _profile,
        "reset-clocks": _reset_clocks,
    }
    try:
        if args_list and args_list[0] in commands:
            return commands[args_list[0]](args_list[1:])
        _top_parser().parse_args(args_list)  # --help, --version, or a one-line usage error
        raise _UsageError(
            "a command is required: plan, simulate, demo, serve, job, profile or reset-clocks "
            "(see perseus --help)"
        )
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


def install_hint(extra: str) -> str:
    """How to install an extra, from the package index and from a checkout."""
    return f"pip install '{DISTRIBUTION}[{extra}]' (from a checkout: pip install '.[{extra}]')"


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="perseus",
        description="Plan per-instruction GPU clocks for pipeline-parallel training.",
        epilog="'perseus COMMAND --help' describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"perseus {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    for name, text in _COMMAND_HELP.items():
        commands.add_parser(name, help=text, add_help=False)
    return parser


def _asks_help(argv: Sequence[str]) -> bool:
    return any(
        arg in ("-h", "--help") for arg in argv[: argv.index("--") if "--" in argv else None]
    )


# plan and demo


def _plan_parser() -> argparse.ArgumentParser:
    from perseus.solver import SCHEDULE_NAMES

    parser = _Parser(
        prog="perseus plan",
        description="Compute the time-energy frontier of a profile, compare it with the "
        "baselines and pick the point a policy chooses.",
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile: Zeus CSV or perseus JSON")
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
        help="no-slowdown (default), max-slowdown:FACTOR, deadline:SECONDS, min-energy, "
        "zeus-cost:ETA",
    )
    parser.add_argument(
        "--resolution",
        metavar="SECONDS",
        type=finite_number(0, inclusive=False, maximum=RESOLUTION_S),
        default=RESOLUTION_S,
        help=f"time step between frontier points (default and most {RESOLUTION_S:g})",
    )
    parser.add_argument(
        "--exact", action="store_true", help="solve every deadline exactly (MILP; small cases)"
    )
    parser.add_argument(
        "--exact-time-limit",
        metavar="SECONDS",
        type=_positive_float,
        default=EXACT_TIME_LIMIT_S,
        help="--exact: wall-clock limit; a sweep estimated to need more is refused at once "
        f"(default {EXACT_TIME_LIMIT_S:g})",
    )
    parser.add_argument(
        "--polish",
        metavar="SECONDS",
        type=_nonnegative_float,
        default=POLISH_S,
        help="seconds to spend improving the no-slowdown plan with a branch and bound "
        f"(default {POLISH_S:g}: off; timed, so the result then depends on the machine's speed)",
    )
    parser.add_argument(
        "--straggler",
        metavar="SECONDS",
        type=_positive_float,
        help="what-if: another pipeline imposes this iteration time",
    )
    parser.add_argument("--output", metavar="FRONTIER.json", help="write the frontier as JSON")
    parser.add_argument("--plan-output", metavar="PLAN.json", help="write the chosen plan as JSON")
    parser.add_argument("--plot", metavar="FRONTIER.png", help="plot the frontier")
    parser.add_argument(
        "--timeline", metavar="TIMELINE.png", help="plot the chosen plan's timeline"
    )
    return parser


_positive_int = integer_at_least(1)
_index = integer_at_least(0)
_positive_float = finite_number(0, inclusive=False)
_nonnegative_float = finite_number(0, inclusive=True)
_policy = policy_argument  # imports the solver only when a policy is parsed


@dataclass(frozen=True, slots=True)
class _PlanRequest:
    profile: Profile
    microbatches: int
    p_block_w: float | None
    schedule: str
    virtual_stages: int | None
    policy: Policy
    resolution_s: float
    exact: bool
    exact_time_limit_s: float = EXACT_TIME_LIMIT_S
    polish_s: float = POLISH_S
    straggler_s: float | None = None
    output: str | None = None
    plan_output: str | None = None
    plot: str | None = None
    timeline: str | None = None
    extra_files: Mapping[str, bytes] = field(default_factory=dict)


def _plan_command(argv: list[str]) -> int:
    with ProgressBar(sys.stderr, enabled=not _asks_help(argv)) as progress:
        progress.phase("loading the solver")
        args = command_parser("plan").parse_args(argv)
        from perseus.solver import Policy, load_profile

        if args.virtual_stages not in (None, 1) and args.schedule != "interleaved-1f1b":
            raise _UsageError(
                f"--virtual-stages: {args.schedule} runs one model chunk per GPU; V > 1 needs "
                f"--schedule interleaved-1f1b"
            )
        if args.virtual_stages == 1 and args.schedule == "interleaved-1f1b":
            raise _UsageError(
                "--virtual-stages: interleaved-1f1b runs V >= 2 model chunks per GPU; for one, "
                "use --schedule 1f1b"
            )
        outputs = _check_outputs(args)
        progress.phase(f"reading {args.profile}")
        request = _PlanRequest(
            profile=load_profile(args.profile),
            microbatches=args.microbatches,
            p_block_w=args.p_block,
            schedule=args.schedule,
            virtual_stages=args.virtual_stages,
            policy=args.policy or Policy.parse("no-slowdown"),
            resolution_s=args.resolution,
            exact=args.exact,
            exact_time_limit_s=args.exact_time_limit,
            polish_s=args.polish,
            straggler_s=args.straggler,
            output=args.output,
            plan_output=args.plan_output,
            plot=args.plot,
            timeline=args.timeline,
        )
        result = _plan(request, outputs, progress)
    return _print_plan(*result)


def _demo_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="perseus demo",
        description=f"Plan the shipped synthetic H200-like example profile: 1F1B, "
        f"{DEMO_MICROBATCHES} microbatches, P_block 100 W. Writes example_profile.csv (the "
        "profile, for perseus plan and perseus simulate), frontier.json, plan.json, "
        "frontier.png and timeline.png.",
    )
    parser.add_argument("--outdir", metavar="DIR", default=".", help="where to write (default .)")
    return parser


def _demo_command(argv: list[str]) -> int:
    from importlib import resources

    with ProgressBar(sys.stderr, enabled=not _asks_help(argv)) as progress:
        args = command_parser("demo").parse_args(argv)
        progress.phase("loading the solver")
        from perseus.solver import Policy, load_profile
        from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W

        outdir = Path(args.outdir)
        if outdir.exists() and not outdir.is_dir():
            raise _UsageError(f"--outdir: {outdir} exists and is not a directory")
        outdir.mkdir(parents=True, exist_ok=True)

        def at(name: str) -> str:
            return name if args.outdir == "." else str(outdir / name)

        shipped = resources.files("perseus") / "data" / "example_profile.csv"
        with resources.as_file(shipped) as shipped_path:
            profile = load_profile(shipped_path)
        request = _PlanRequest(
            profile=dataclasses.replace(profile, source=at("example_profile.csv")),
            microbatches=DEMO_MICROBATCHES,
            p_block_w=EXAMPLE_P_BLOCK_W,
            schedule="1f1b",
            virtual_stages=None,
            policy=Policy.parse("no-slowdown"),
            resolution_s=RESOLUTION_S,
            exact=False,
            output=at("frontier.json"),
            plan_output=at("plan.json"),
            plot=at("frontier.png"),
            timeline=at("timeline.png"),
            extra_files={at("example_profile.csv"): shipped.read_bytes()},
        )
        outputs = _Outputs(
            [request.output, request.plan_output, request.plot, request.timeline],
            ["--output", "--plan-output", "--plot", "--timeline"],
        )
        result = _plan(request, outputs, progress)
    return _print_plan(*result)


def _check_outputs(args: argparse.Namespace) -> _Outputs:
    for option, path in (("--plot", args.plot), ("--timeline", args.timeline)):
        if path is not None and Path(path).suffix.lower() != ".png":
            raise _UsageError(f"{option}: {path}: plots are PNG images; give a name ending in .png")
    return _Outputs(
        [args.output, args.plan_output, args.plot, args.timeline],
        ["--output", "--plan-output", "--plot", "--timeline"],
    )


def _print_plan(text: str, written: list[str], warnings: list[str]) -> int:
    """Print what :func:`_plan` returns, once the progress bar is gone; exit status 0."""
    for warning in warnings:
        print(f"perseus: warning: {warning}", file=sys.stderr)
    sys.stdout.write(text)
    for path in written:
        sys.stdout.write(f"wrote {path}\n")
    return 0


def _plan(
    request: _PlanRequest, outputs: _Outputs, progress: ProgressBar
) -> tuple[str, list[str], list[str]]:
    """Plan, render every file and write them; returns the report, the paths written and the
    warnings (printed once the progress bar is gone)."""
    from perseus.files import FrontierFile, PlanFile, profile_fingerprint
    from perseus.solver import baselines_at, choose_point, compute_frontier, make_schedule, replay

    profile = request.profile
    p_block_w = _blocking_power(request.p_block_w, profile)
    virtual_stages = request.virtual_stages
    if virtual_stages is None:
        virtual_stages = 2 if request.schedule == "interleaved-1f1b" else 1
    schedule = make_schedule(
        request.schedule, profile.num_stages, request.microbatches, virtual_stages
    )
    fingerprint = profile_fingerprint(profile)
    _check_feasible(profile, schedule, p_block_w, request)

    progress.phase("planning")
    started = time.monotonic()
    try:
        frontier = compute_frontier(
            profile,
            schedule,
            p_block_w=p_block_w,
            resolution_s=request.resolution_s,
            exact=request.exact,
            exact_time_limit_s=request.exact_time_limit_s,
            polish_s=request.polish_s,
            progress=progress,
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
    straggler = None
    warnings: list[str] = []
    if request.straggler_s is not None:
        from perseus.solver import straggler_point

        try:
            straggler = (request.straggler_s, straggler_point(frontier, request.straggler_s))
        except InfeasibleDeadline as err:
            raise InfeasibleDeadline(f"--straggler: {err}") from err
        chosen_s = float(frontier.times_s[chosen])
        if request.straggler_s < chosen_s:
            warnings.append(
                f"--straggler {request.straggler_s:g} s is shorter than the chosen plan's "
                f"{chosen_s:.4f} s: this pipeline, not the other, sets the pace; the straggler "
                "rows show what fits the shorter time"
            )
    # The run's one set of baselines, shown alike by the table, frontier.json and the plot: at
    # the policy's own limit where it has one (max-slowdown, deadline), else at the chosen
    # point's time.
    deadline_s = _baselines_deadline(frontier, policy, chosen)
    baselines = baselines_at(profile, schedule, frontier.p_block_w, deadline_s)

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
            request.plan_output, PlanFile.of_point(frontier, chosen, profile=fingerprint).render()
        )
    if request.plot or request.timeline:
        progress.phase("loading matplotlib")
        from perseus import plots

        title = f"{Path(profile.source).name}: {_schedule_text(schedule)}"
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
            point = frontier.point(chosen)
            replayed = replay(profile, schedule, frontier.p_block_w, point.frequencies_mhz)
            outputs.put(
                request.timeline,
                plots.timeline_png(
                    schedule,
                    replayed,
                    point.frequencies_mhz,
                    clock_range_mhz=_clock_range(profile),
                    title=f"{title}: {policy}, point {chosen}",
                ),
            )
    progress.phase("writing files")
    written = outputs.write()
    text = _describe(profile, schedule, frontier, solved_s) + "\n"
    text += _plan_table(frontier, baselines, chosen, str(policy), straggler)
    return text, written, warnings


def _check_feasible(
    profile: Profile, schedule: Schedule, p_block_w: float, request: _PlanRequest
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
            min(profile.stages[gpu][ins.kind], key=lambda o: o.time_s).frequency_mhz for ins in seq
        )
        for gpu, seq in enumerate(schedule.order)
    ]
    try:
        fastest_s = replay(profile, schedule, p_block_w, fastest).time_s
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
    baselines: Mapping[str, Baseline],
    chosen: int,
    policy: str,
    straggler: tuple[float, int] | None,
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
        stretched_s = max(imposed_s, reference.time_s)
        stretched_j = reference.energy_j + frontier.p_block_w * frontier.schedule.stages * (
            stretched_s - reference.time_s
        )
        rows.append(
            row(f"{baseline_label(key)}, stretched", stretched_s, stretched_j, "-", stretched_j)
        )
        rows.append(
            row(
                f"straggler (point {index} of {len(frontier)})",
                imposed_s,
                frontier.energy_at(index, imposed_s),
                f"{100 * frontier.point(index).gap:.2f} %",
                stretched_j,
            )
        )
        notes.append(
            f"straggler rows: the iteration takes {imposed_s:.4f} s because of another pipeline;\n"
            f"their saving is against {baseline_label(key)} stretched to that time"
        )
    return _format_table(rows, right=range(1, 6)) + "".join(f"{note}\n" for note in notes)


def _clocks_note(frequencies_mhz: Sequence[Sequence[int]]) -> str:
    per_gpu = [set(clocks) for clocks in frequencies_mhz]
    if per_gpu and all(len(clocks) == 1 for clocks in per_gpu):
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


def _simulate_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="perseus simulate",
        description="Replay a plan (a frontier point or a single plan) on a profile.",
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile: Zeus CSV or perseus JSON")
    parser.add_argument("plan", metavar="PLAN.json", help="perseus.frontier/1 or perseus.plan/1")
    parser.add_argument(
        "--p-block", metavar="WATTS", type=_positive_float, help="blocking power (default: plan's)"
    )
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--point", metavar="N", type=_index, help="frontier point index")
    pick.add_argument(
        "--policy",
        metavar="POLICY",
        type=_policy,
        help="pick the frontier point by policy (default no-slowdown)",
    )
    return parser


def _simulate_command(argv: list[str]) -> int:
    args = command_parser("simulate").parse_args(argv)
    from perseus.files import FrontierFile, profile_fingerprint, read_plan_or_frontier
    from perseus.solver import Policy, choose_point, load_profile, replay

    profile = load_profile(args.profile)
    document = read_plan_or_frontier(args.plan)
    stated: tuple[float, float] | None = None
    try:
        if isinstance(document, FrontierFile):
            frontier = document.to_frontier()
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
            stated = (point.time_s, point.energy_j)
            what = f"point {index} of {len(frontier)} in {args.plan}"
        else:
            if args.point is not None or args.policy is not None:
                raise _UsageError(
                    f"--point and --policy pick a frontier point; {args.plan} is a plan"
                )
            schedule, frequencies = document.to_schedule(), document.clocks
            if document.time_s is not None and document.energy_j is not None:
                stated = (document.time_s, document.energy_j)
            what = args.plan
    except PlanError as err:
        raise PlanError(f"{args.plan}: {err}") from err
    planned_on = document.profile
    mismatch = ""
    if planned_on is not None and planned_on.sha256 != profile_fingerprint(profile).sha256:
        mismatch = (
            f"{args.plan} was planned on another profile ({planned_on.source}, sha256 "
            f"{planned_on.sha256[:12]}), not on {Path(profile.source).name}"
        )
    p_block_w = args.p_block if args.p_block is not None else document.p_block_w
    try:
        result = replay(profile, schedule, p_block_w, frequencies)
    except PlanError as err:
        why = mismatch or f"it does not fit profile {profile.source}"
        raise PlanError(f"{args.plan}: {err}; {why}") from err
    if mismatch:
        print(
            f"perseus: warning: {mismatch}; replayed, its clocks take what this profile says",
            file=sys.stderr,
        )

    out = sys.stdout
    out.write(f"plan      {what}\n")
    out.write(f"profile   {profile.source}: {profile.num_stages} stages\n")
    out.write(f"schedule  {_schedule_text(schedule)}, P_block {p_block_w:g} W\n\n")
    out.write(f"iteration time  {result.time_s:.6f} s\n")
    out.write(f"energy          {result.energy_j:.3f} J\n")
    if stated is not None and p_block_w == document.p_block_w and not mismatch:
        out.write(f"(the plan states {stated[0]:.6f} s and {stated[1]:.3f} J)\n")
    out.write("\n")
    rows = [["stage", "busy (s)", "idle (s)", "busy"]]
    for stage, (busy, idle) in enumerate(zip(result.busy_s, result.idle_s, strict=True)):
        rows.append(
            [str(stage), f"{busy:.4f}", f"{idle:.4f}", f"{100 * busy / result.time_s:.1f} %"]
        )
    out.write(_format_table(rows, right=range(4)))
    return 0


# serve, job, profile, reset-clocks: each imports its side (server, client) only when it runs


def command_parser(name: str) -> argparse.ArgumentParser:
    """The full argument parser of subcommand ``name``, e.g. to check a command line.

    Imports the module that defines the subcommand's arguments, never an optional extra: every
    ``--help`` works on a bare install, and running a command without its extra says which to
    install (:func:`_needs`).

    Raises:
        _UsageError: Unknown command.
    """
    if name == "plan":
        return _plan_parser()
    if name == "simulate":
        return _simulate_parser()
    if name == "demo":
        return _demo_parser()
    if name == "serve":
        from perseus.server.cli import add_serve_arguments

        parser = _Parser(prog="perseus serve", description="Run the planner server.")
        add_serve_arguments(parser)
        return parser
    if name in ("job", "reset-clocks"):
        from perseus.client.jobcli import add_job_arguments, add_reset_clocks_arguments

        if name == "job":
            parser = _Parser(
                prog="perseus job",
                description="Create, inspect and steer jobs on a planner server. The server, "
                "job and token default to $PERSEUS_SERVER, $PERSEUS_JOB and $PERSEUS_TOKEN, as "
                'eval "$(perseus job create ...)" sets them.',
            )
            add_job_arguments(parser)
            return parser
        parser = _Parser(
            prog="perseus reset-clocks",
            description="Restore the default SM clocks of GPUs, e.g. after a training process "
            "that locked them was killed with -9. Usually needs root.",
        )
        add_reset_clocks_arguments(parser)
        return parser
    if name == "profile":
        from perseus.client.standalone import add_profile_arguments

        parser = _Parser(
            prog="perseus profile",
            description="Profile this machine's GPU: time and energy per instruction and clock.",
        )
        add_profile_arguments(parser)
        return parser
    raise _UsageError(f"unknown command {name!r}; see perseus --help")


@contextlib.contextmanager
def _needs(command: str, extra: str, what: str) -> Iterator[None]:
    """Turn a missing optional dependency, met while ``command`` runs, into a one-line error
    that says which extra to install (its ``--help`` works without it)."""
    try:
        yield
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] == "perseus":
            raise
        raise _UsageError(
            f"{command}: {what} is not installed ({err}); " + install_hint(extra)
        ) from err


def _serve(argv: list[str]) -> int:
    args = command_parser("serve").parse_args(argv)
    with _needs("serve", "server", "the planner server"):
        from perseus.server.cli import run_serve

        status: int = run_serve(args)
    return status


def _job(argv: list[str]) -> int:
    args = command_parser("job").parse_args(argv)
    from perseus.client.jobcli import CommandError, run_job

    with _needs(f"job {argv[0]}", "client", "the client"):
        try:
            return run_job(args)
        except (CommandError, PerseusError) as err:
            raise _UsageError(f"job {argv[0]}: {err}") from err


def _profile(argv: list[str]) -> int:
    args = command_parser("profile").parse_args(argv)
    with _needs("profile", "torch", "the client with torch"):
        from perseus.client.standalone import run_profile

        status: int = run_profile(args)
    return status


def _reset_clocks(argv: list[str]) -> int:
    args = command_parser("reset-clocks").parse_args(argv)
    from perseus.client.jobcli import run_reset_clocks

    with _needs("reset-clocks", "client", "the client"):
        return run_reset_clocks(args)


# output files and progress


@dataclass
class _Outputs:
    """Files to write at the very end, all or none (:func:`perseus.outputs.write_files`)."""

    paths: list[str | None]
    options: list[str]
    _pending: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Check destinations before the long computation rather than fail after it.
        seen: dict[Path, str] = {}
        for path, option in zip(self.paths, self.options, strict=True):
            if path is None:
                continue
            if path == "-":
                raise _UsageError(
                    f"{option}: '-': this command prints its table on standard output; give a "
                    f"file name"
                )
            refused = check_writable(path)
            if refused is not None:
                raise _UsageError(f"{option}: {refused}")
            target = resolve(path)
            if target in seen and not target.is_char_device():
                raise _UsageError(f"{option}: {path} is also {seen[target]}'s file")
            seen[target] = option

    def put(self, path: str, data: bytes) -> None:
        self._pending[path] = data

    def write(self) -> list[str]:
        """Write every pending file (see :func:`perseus.outputs.write_files`)."""
        try:
            write_files(self._pending)
        except OSError as err:
            raise _UsageError(f"cannot write {err.filename or 'output'}: {err.strerror}") from err
        return list(self._pending)


class ProgressBar:
    """Shows on a terminal what a long command is doing: its phase, a bar, the time so far.

    Used as a context manager: a thread redraws the line every ``interval_s`` seconds from
    ``delay_s`` on (so it keeps moving while a phase reports nothing, and commands quicker than
    ``delay_s`` stay silent), and it is erased at the end. Called as ``progress(done, total)``
    (the solver's callback) it fills the bar; the bar never moves back within a phase, even
    when the total grows. Nothing is drawn when the stream is not a terminal (logs, pipes).
    """

    _SPIN = "|/-\\"

    def __init__(
        self,
        stream: TextIO,
        *,
        enabled: bool = True,
        delay_s: float = 0.2,
        interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        width: int = 24,
        thread: bool = True,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._delay_s = delay_s
        self._interval_s = interval_s
        self._width = width
        self._enabled = enabled and stream.isatty()
        self._phase = "starting"
        self._fraction: float | None = None
        self._draws = 0
        self._drawn = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = (
            threading.Thread(target=self._run, name="perseus-progress", daemon=True)
            if thread and self._enabled
            else None
        )

    def __enter__(self) -> ProgressBar:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def phase(self, text: str) -> None:
        """Start a phase: ``text`` replaces the previous one and the bar empties."""
        self._phase = text
        self._fraction = None

    def __call__(self, done: int, total: int) -> None:
        if total > 0:
            fraction = min(max(done / total, 0.0), 1.0)
            self._fraction = max(fraction, self._fraction or 0.0)

    def draw(self) -> None:
        """Redraw the line now (the thread does this; tests call it with a fake clock)."""
        if not self._enabled:
            return
        elapsed = self._clock() - self._start
        if elapsed < self._delay_s:
            return
        spin = self._SPIN[self._draws % len(self._SPIN)]
        self._draws += 1
        fraction = self._fraction
        if fraction is None:
            bar = ""
        else:
            filled = round(fraction * self._width)
            bar = f" [{'#' * filled}{'.' * (self._width - filled)}] {100 * fraction:3.0f} %"
        with self._lock:
            self._stream.write(f"\r\033[Kperseus: {self._phase}{bar} {spin} {elapsed:.1f} s")
            self._stream.flush()
            self._drawn = True

    def close(self) -> None:
        """Stop redrawing and erase the line, if one was drawn."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()
        with self._lock:
            if self._drawn:
                self._stream.write("\r\033[K")
                self._stream.flush()
                self._drawn = False

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.draw()


if __name__ == "__main__":
    sys.exit(main())
