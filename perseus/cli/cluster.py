"""``perseus cluster``: a power budget for a whole cluster.

``perseus cluster simulate FOLDER`` plans a folder of saved profiles with their job shapes
offline and prints, at each budget, the throughput kept by choosing each job's point on its
frontier against uniformly lowered GPU power limits and per-job planning alone
(:mod:`perseus.cli.cluster_simulate`).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from perseus.cli.arguments import Parser, needs

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
    return parser


def run(argv: list[str]) -> int:
    """Run ``perseus cluster`` with ``argv`` (the arguments after ``cluster``); returns 0.

    Raises:
        UsageError: A bad command line, or the planner extra is not installed.
        PerseusError: A job file, profile or shape that cannot be planned.
    """
    args = build_parser().parse_args(argv)
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
