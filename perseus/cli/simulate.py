"""``perseus simulate``: replay a plan on a profile: time, energy, per-stage busy and idle.

The replay uses the clock-change margin the file records (0 for files written before it
existed), so a plan replayed on its own profile gives back exactly what it states.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perseus.cli.arguments import Parser, UsageError, index, positive_float
from perseus.cli.arguments import policy as policy_argument
from perseus.cli.plan_views import margin_text
from perseus.cli.tables import format_table, schedule_text
from perseus.core.errors import PlanError

__all__ = ["build_parser", "run"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus simulate``."""
    parser = Parser(
        prog="perseus simulate",
        description="Replay a plan (a frontier point or a single plan) on a profile.",
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile: Zeus CSV or perseus JSON")
    parser.add_argument("plan", metavar="PLAN.json", help="perseus.frontier/1 or perseus.plan/1")
    parser.add_argument(
        "--p-block", metavar="WATTS", type=positive_float, help="blocking power (default: plan's)"
    )
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--point", metavar="N", type=index, help="frontier point index")
    pick.add_argument(
        "--policy",
        metavar="POLICY",
        type=policy_argument,
        help="pick the frontier point by policy (default no-slowdown)",
    )
    return parser


def run(argv: list[str]) -> int:
    """Run ``perseus simulate`` with ``argv`` (the arguments after ``simulate``); returns 0.

    Raises:
        UsageError: A bad command line.
        PerseusError: A bad profile or plan file, or a plan that does not fit the profile.
    """
    args = build_parser().parse_args(argv)
    from perseus.formats.plan_files import FrontierFile, profile_fingerprint, read_plan_or_frontier
    from perseus.solver import Policy, choose_point, load_profile, replay

    profile = load_profile(args.profile)
    document = read_plan_or_frontier(args.plan)
    stated: tuple[float, float] | None = None
    try:
        if isinstance(document, FrontierFile):
            frontier = document.to_frontier()
            if args.point is not None:
                if args.point >= len(frontier):
                    raise UsageError(
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
                raise UsageError(
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
        result = replay(
            profile,
            schedule,
            p_block_w,
            frequencies,
            clock_change_margin_s=document.clock_change_margin_s,
        )
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
    margin = margin_text(document.clock_change_margin_s)
    out.write(f"schedule  {schedule_text(schedule)}, P_block {p_block_w:g} W{margin}\n\n")
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
    out.write(format_table(rows, right=range(4)))
    return 0
