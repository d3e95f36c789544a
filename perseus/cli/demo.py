"""``perseus demo``: plan the shipped example profile and draw the plots (no GPU needed)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from perseus.cli.arguments import Parser, UsageError, asks_help
from perseus.cli.outputs import Outputs
from perseus.cli.plan import PlanRequest, plan, print_result
from perseus.cli.progress import ProgressBar
from perseus.core.defaults import RESOLUTION_S

__all__ = ["DEMO_MICROBATCHES", "build_parser", "run"]

DEMO_MICROBATCHES = 8


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus demo``."""
    parser = Parser(
        prog="perseus demo",
        description=f"Plan the shipped synthetic H200-like example profile: 1F1B, "
        f"{DEMO_MICROBATCHES} microbatches, P_block 100 W. Writes example_profile.csv (the "
        "profile, for perseus plan and perseus simulate), frontier.json, plan.json, "
        "frontier.png and timeline.png.",
    )
    from perseus.core.pipeline import SCHEDULE_NAMES

    parser.add_argument(
        "--schedule",
        choices=SCHEDULE_NAMES,
        default="1f1b",
        help="plan another schedule (default 1f1b); the example profile measures the split "
        "backward, so the zero-bubble ones (zbv, interleaved-zb, dualpipev) plan too, with 2 "
        "chunks per GPU",
    )
    parser.add_argument("--outdir", metavar="DIR", default=".", help="where to write (default .)")
    return parser


def run(argv: list[str]) -> int:
    """Run ``perseus demo`` with ``argv`` (the arguments after ``demo``); returns 0."""
    from importlib import resources

    with ProgressBar(sys.stderr, enabled=not asks_help(argv)) as progress:
        args = build_parser().parse_args(argv)
        progress.phase("loading the solver")
        from perseus.solver import Policy
        from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, EXAMPLE_PROFILE, example_profile

        outdir = Path(args.outdir)
        if outdir.exists() and not outdir.is_dir():
            raise UsageError(f"--outdir: {outdir} exists and is not a directory")
        outdir.mkdir(parents=True, exist_ok=True)

        def at(name: str) -> str:
            return name if args.outdir == "." else str(outdir / name)

        profile = example_profile()
        request = PlanRequest(
            profile=dataclasses.replace(profile, source=at("example_profile.csv")),
            microbatches=DEMO_MICROBATCHES,
            p_block_w=EXAMPLE_P_BLOCK_W,
            schedule=args.schedule,
            virtual_stages=None,
            policy=Policy.parse("no-slowdown"),
            resolution_s=RESOLUTION_S,
            exact=False,
            output=at("frontier.json"),
            plan_output=at("plan.json"),
            plot=at("frontier.png"),
            timeline=at("timeline.png"),
            extra_files={
                at("example_profile.csv"): (
                    resources.files("perseus") / EXAMPLE_PROFILE
                ).read_bytes()
            },
        )
        outputs = Outputs(
            [request.output, request.plan_output, request.plot, request.timeline],
            ["--output", "--plan-output", "--plot", "--timeline"],
        )
        result = plan(request, outputs, progress)
    return print_result(result)
