"""``perseus reset-clocks``: restore the default SM clocks of GPUs.

Meant for after a training process that locked them was killed (``kill -9``): its exit hooks
never ran. Needs the client extra (NVML) and usually root; where zeusd sets clocks
(``PERSEUS_GPU=zeusd``, or Zeus's ``ZEUSD_SOCK_PATH``/``ZEUSD_HOST_PORT`` set and
``PERSEUS_GPU`` unset), it asks zeusd instead and needs no root.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from perseus.cli.arguments import Parser, needs

__all__ = ["add_reset_clocks_arguments", "build_parser", "run", "run_reset_clocks"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus reset-clocks``."""
    parser = Parser(
        prog="perseus reset-clocks",
        description="Restore the default SM clocks of GPUs, e.g. after a training process "
        "that locked them was killed with -9. Usually needs root; through zeusd (where "
        "PERSEUS_GPU=zeusd, or ZEUSD_SOCK_PATH or ZEUSD_HOST_PORT is set) it does not.",
    )
    add_reset_clocks_arguments(parser)
    return parser


def run(argv: list[str]) -> int:
    """Run ``perseus reset-clocks`` with ``argv`` (the arguments after the command).

    Returns:
        0.

    Raises:
        UsageError: A bad command line, or the client extra is not installed.
        GpuControlError: NVML failed, or the process may not change clocks.
    """
    args = build_parser().parse_args(argv)
    with needs("reset-clocks", "client", "the client"):
        return run_reset_clocks(args)


def _gpus(text: str) -> list[int] | None:
    if text.strip() == "all":
        return None
    indices: list[int] = []
    for part in text.split(","):
        if not part.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"expected 'all' or GPU indices like 0 or 0,2, got {text!r}"
            )
        indices.append(int(part))
    return indices


def add_reset_clocks_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``perseus reset-clocks``; run it with :func:`run_reset_clocks`."""
    parser.add_argument(
        "--gpu",
        metavar="N|all",
        type=_gpus,
        default=None,
        help="NVML index of the GPU, several as 0,2, or all (default all)",
    )


def run_reset_clocks(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Restore the default SM clocks of the GPUs ``args.gpu`` names (None: all), printing a
    line per GPU to ``out`` (standard output if None).

    Returns:
        0.

    Raises:
        GpuControlError: NVML failed, or the process may not change clocks; or zeusd cannot be
            reached or refused (``ZeusdUnavailable``, ``ZeusdRefused``).
    """
    # Imported here: NVML is the client extra, and tests put a fake module in its place.
    from perseus.client.settings import default_gpu_mode

    stream = sys.stdout if out is None else out
    if default_gpu_mode(os.environ) == "zeusd":
        from perseus.client.gpu.zeusd import ZeusdEndpoint, reset_clocks_through_zeusd

        lines = reset_clocks_through_zeusd(args.gpu, ZeusdEndpoint.from_env(os.environ))
    else:
        from perseus.client.gpu.control import reset_clocks

        lines = reset_clocks(args.gpu)
    for line in lines:
        stream.write(f"{line}\n")
    return 0
