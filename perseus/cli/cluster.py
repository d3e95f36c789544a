"""``perseus cluster``: a power budget for a whole cluster.

``perseus cluster simulate FOLDER`` plans a folder of saved profiles with their job shapes
offline and prints, at each budget, the throughput kept by choosing each job's point on its
frontier against uniformly lowered GPU power limits and per-job planning alone
(:mod:`perseus.cli.cluster_simulate`). ``perseus cluster budget 2.4MW`` (``--from``/``--to``
for a window, ``off`` to lift it), ``perseus cluster status`` and ``perseus cluster priority
JOB P`` talk to a planner server (:mod:`perseus.cli.cluster_budget`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from perseus.cli.arguments import Parser, finite_number, needs
from perseus.core.errors import CommandError, PerseusError, UsageError

__all__ = ["build_parser", "parse_power", "run"]

_POWER = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgG]?)[wW]?\s*")
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_power(text: str) -> float:
    """``2.4MW``, ``800kW``, ``1500W`` or ``1500`` (watts) as watts.

    Raises:
        argparse.ArgumentTypeError: Not a positive power.
    """
    match = _POWER.fullmatch(text)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a power > 0 such as 2.4MW, 800kW or 1500W, got {text!r}"
        )
    return float(match.group(1)) * _SCALE[match.group(2).lower()]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus cluster`` and its subcommands."""
    parser = Parser(
        prog="perseus cluster",
        description="A power budget for the whole cluster: each job's point on its frontier "
        "chosen so that the cluster stays under the budget at the least cost in speed.",
    )
    commands = parser.add_subparsers(
        title="commands", metavar="COMMAND", parser_class=Parser, required=True
    )
    simulate = commands.add_parser(
        "simulate",
        help="plan a folder of saved jobs offline: power against throughput",
        description="Plan every job file (*.json: profile, schedule, microbatches, replicas; "
        "optional virtual_stages, priority, policy, p_block_w) of FOLDER, then print the "
        "throughput kept at each budget by three ways of shedding power: each job's point "
        "on its frontier (frontiers), one power limit on every GPU (power limit), and every "
        "job at one common slowdown (per-job).",
    )
    simulate.add_argument("folder", metavar="FOLDER", type=Path, help="folder of job files")
    simulate.add_argument(
        "--budget",
        metavar="POWER",
        type=parse_power,
        action="append",
        help="a budget such as 2.4MW or 800kW (repeat for several; default: eight from the "
        "least power the jobs can draw to what their policies draw)",
    )
    simulate.add_argument("--plot", metavar="PNG", type=Path, help="draw the curves to PNG")
    simulate.set_defaults(cluster_command="simulate")
    _add_server_commands(commands)
    return parser


def _budget_power(text: str) -> float | None:
    """A budget's POWER argument: a power, or ``off`` (None)."""
    if text.strip().lower() == "off":
        return None
    return parse_power(text)


def _when(text: str) -> float:
    from perseus.cli.cluster_budget import parse_when

    return parse_when(text)


def _add_server_commands(commands: argparse._SubParsersAction[Parser]) -> None:
    """``budget``, ``status``, ``priority``: the budget on a planner server."""
    connection = Parser(add_help=False)
    connection.add_argument("--server", metavar="URL", help="planner server ($PERSEUS_SERVER)")
    connection.add_argument(
        "--token", metavar="TOKEN", help="the admin token ($PERSEUS_ADMIN_TOKEN)"
    )
    connection.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=finite_number(0, inclusive=False),
        help="connect, read and write timeout (default 5 s connect, 30 s read and write)",
    )
    connection.add_argument("--json", action="store_true", help="print the server's JSON view")
    budget = commands.add_parser(
        "budget",
        parents=[connection],
        help="set the cluster's power budget (or a window of it), or lift it",
        description="Set the cluster's power budget: every planned job's point on its "
        "frontier moves so that the jobs together draw at most POWER, at the least "
        "priority-weighted slowdown, never faster than each job's own policy. With --from "
        "or --to, a window (a demand-response event) that overrides the standing budget "
        "while it lasts. 'off' lifts the budget and any window: every job back at its own "
        "policy. Prints the cluster's status after the change.",
    )
    budget.add_argument(
        "power", metavar="POWER", type=_budget_power, help="2.4MW, 800kW, 1500W, or off"
    )
    budget.add_argument(
        "--from",
        dest="start",
        metavar="WHEN",
        type=_when,
        help="the window's start: +10m, +2h or an ISO time such as 2027-01-20T14:00",
    )
    budget.add_argument("--to", dest="end", metavar="WHEN", type=_when, help="the window's end")
    budget.set_defaults(cluster_command="budget")
    status = commands.add_parser(
        "status",
        parents=[connection],
        help="the budget, the cluster's predicted and measured power, each job's share",
        description="Show the budget in force, the cluster's predicted and measured power, "
        "whether the budget is met, and each job's power, share, slowdown and energy saved.",
    )
    status.set_defaults(cluster_command="status")
    priority = commands.add_parser(
        "priority",
        parents=[connection],
        help="weigh a job's slowdown under the budget",
        description="Set how much a job's slowdown weighs when the budget chooses the jobs' "
        "points (default 1; a job of priority 2 is slowed down half as readily). Sends "
        "--token, else $PERSEUS_ADMIN_TOKEN, else the job's $PERSEUS_TOKEN.",
    )
    priority.add_argument("job", metavar="JOB", help="the job's id")
    priority.add_argument(
        "priority", metavar="PRIORITY", type=finite_number(0, inclusive=False, maximum=1000)
    )
    priority.set_defaults(cluster_command="priority")


def run(argv: list[str]) -> int:
    """Run ``perseus cluster`` with ``argv`` (the arguments after ``cluster``); returns 0.

    Raises:
        UsageError: A bad command line, or the planner extra is not installed.
        PerseusError: A job file, profile or shape that cannot be planned.
    """
    args = build_parser().parse_args(argv)
    if args.cluster_command != "simulate":
        if args.cluster_command == "budget" and args.power is None and (args.start or args.end):
            raise UsageError("cluster budget: off lifts every budget; --from/--to need a POWER")
        with needs(f"cluster {args.cluster_command}", "client", "the client"):
            from perseus.cli.cluster_budget import run_budget_command

            power = args.power if args.cluster_command == "budget" else None
            try:
                run_budget_command(args, os.environ, sys.stdout, power)
            except (CommandError, PerseusError) as err:
                raise UsageError(f"cluster {args.cluster_command}: {err}") from err
        return 0
    with needs("cluster simulate", "planner", "the solver"):
        from perseus.cli import cluster_simulate as sim

        jobs = sim.plan_jobs(args.folder, sim.load_jobs(args.folder))
        budgets = args.budget or sim.default_budgets(jobs)
        curves = sim.simulate(jobs, sorted(budgets))
        print(sim.table(jobs, curves), end="")
        if args.plot is not None:
            from perseus import plots

            kept = {
                "frontiers (this choice)": [c.frontiers_kept for c in curves],
                "one power limit on every GPU": [c.limit_kept for c in curves],
                "per-job, one common slowdown": [c.per_job_kept for c in curves],
            }
            args.plot.write_bytes(plots.cluster_png([c.budget_w for c in curves], kept))
            print(f"plot: {args.plot}")
    return 0
