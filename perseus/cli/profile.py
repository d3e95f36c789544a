"""``perseus profile``: profile a synthetic transformer stage on one GPU, outside training.

The same measurement as online profiling (:mod:`perseus.client.profiling.profiler`): loops of the
stage's forward and forward+backward at each clock, energy from the counter updates inside
each loop's window; by default coarse then fine where plans go
(:mod:`perseus.client.profiling.sweep_order`), else the clocks listed until energy rises at
several clocks in a row. It prints each clock as it is measured and how long the sweep took.
The stage is :class:`perseus.client.profiling.standalone.SyntheticStage`, sized by the
arguments. The result is a Zeus-compatible CSV (``.json``: ``perseus.profile/1`` with the
measured idle power) that ``perseus plan`` reads.

On a GPU whose clocks this process may not change (no root or CAP_SYS_ADMIN, or
``--gpu dry-run``), it measures at the current clock only and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from typing import Any

from perseus.cli.arguments import Parser, install_hint, needs
from perseus.cli.outputs import check_writable, write_files
from perseus.client.gpu.control import GpuControl, open_gpu
from perseus.client.gpu.meter import EnergyMeter
from perseus.client.profiling.measurements import StageProfile
from perseus.client.profiling.profiler import ClockSweep, device_work
from perseus.client.profiling.standalone import SyntheticStage
from perseus.client.profiling.wait_power import measure_idle_power
from perseus.client.settings import GPU_MODES, ProfileBudget, SettingsError, default_gpu_mode
from perseus.core.errors import NvmlPermissionError, PerseusError

__all__ = ["add_profile_arguments", "build_parser", "run", "run_profile"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus profile``."""
    parser = Parser(
        prog="perseus profile",
        description="Profile this machine's GPU: time and energy per instruction and clock.",
    )
    add_profile_arguments(parser)
    return parser


def run(argv: list[str]) -> int:
    """Run ``perseus profile`` with ``argv`` (the arguments after ``profile``); returns 0.

    Raises:
        UsageError: A bad command line, or the client extra or torch is not installed.
        PerseusError: The GPU cannot be read, or the measurement failed.
    """
    args = build_parser().parse_args(argv)
    with needs("profile", "torch", "the client with torch"):
        return run_profile(args)


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``perseus profile``'s arguments to ``parser``."""
    parser.add_argument(
        "-o", "--output", default="profile.csv",
        help="where to write the profile: .csv (Zeus format) or .json (with the idle power); "
        "default profile.csv",
    )  # fmt: skip
    parser.add_argument(
        "--gpu", choices=GPU_MODES, default=default_gpu_mode(os.environ),
        help="nvml: lock clocks through NVML (needs root or CAP_SYS_ADMIN); dry-run: read "
        "only, measure the current clock; fake: the modelled GPU; zeusd: lock clocks through "
        "zeusd, read through NVML (default $PERSEUS_GPU, else zeusd where $ZEUSD_SOCK_PATH or "
        "$ZEUSD_HOST_PORT is set, else nvml)",
    )  # fmt: skip
    parser.add_argument("--gpu-index", type=int, default=0, help="NVML index (default 0)")
    parser.add_argument("--list-clocks", action="store_true", help="list the clocks and stop")
    size = parser.add_argument_group("the synthetic stage (defaults: GPU / CPU)")
    size.add_argument("--layers", type=int, help="transformer blocks (4 / 2)")
    size.add_argument("--hidden", type=int, help="hidden size (4096 / 128)")
    size.add_argument("--heads", type=int, help="attention heads (32 / 4)")
    size.add_argument("--sequence", type=int, help="tokens per sequence (2048 / 64)")
    size.add_argument("--microbatch-size", type=int, help="sequences per microbatch (2 / 2)")
    sweep = parser.add_argument_group("the sweep")
    sweep.add_argument(
        "--clocks", default="auto",
        help="auto (coarse then fine where plans go), all, every:N or 1980,1500,... (auto)",
    )  # fmt: skip
    sweep.add_argument("--window", type=float, default=1.0, help="seconds per loop (1.0)")
    sweep.add_argument("--settle", type=float, default=0.5, help="seconds after a change (0.5)")
    sweep.add_argument("--max-seconds", type=float, default=1800.0, help="budget (1800)")
    sweep.add_argument("--stage", type=int, default=0, help="stage number in the CSV (0)")


def run_profile(args: argparse.Namespace, out: Any = None) -> int:
    """Run ``perseus profile``.

    Returns:
        0 on success.

    Raises:
        PerseusError: The GPU cannot be read, or the measurement failed.
    """
    stream = out if out is not None else sys.stdout
    if not args.output.endswith((".csv", ".json")):
        raise SettingsError(f"--output: expected a .csv or .json file name, got {args.output!r}")
    refused = check_writable(args.output)
    if refused is not None:
        raise SettingsError(f"--output: {refused}")
    for name in ("window", "settle", "max_seconds"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= (0 if name == "settle" else 0.05)):
            raise SettingsError(f"--{name.replace('_', '-')}: must be a positive number")
    budget = ProfileBudget(
        window_s=args.window,
        settle_s=args.settle,
        clocks=args.clocks,
        max_s=args.max_seconds,
        clocks_setting="--clocks",
    )
    budget.check()  # a malformed --clocks fails before the GPU is opened
    gpu = open_gpu(args.gpu, args.gpu_index)
    clocks = gpu.supported_clocks_mhz()
    print(f"GPU {gpu.index}  {gpu.name} ({args.gpu})", file=stream)
    print(
        f"SM clocks      {len(clocks)}: {clocks[0]}-{clocks[-1]} MHz "
        f"({', '.join(map(str, clocks[:6]))}, ...)",
        file=stream,
    )
    memory = getattr(gpu, "supported_memory_clocks_mhz", None)
    if memory is not None:
        print(f"memory clocks  {', '.join(map(str, memory()))} MHz", file=stream)
    print(f"current clock  {gpu.current_clock_mhz()} MHz, power {gpu.power_w():.0f} W", file=stream)
    if args.list_clocks:
        print("\n".join(map(str, clocks)), file=stream)
        return 0

    budget.select(clocks)  # an unsupported clock in --clocks fails before any work
    workload = _synthetic_stage(args)
    print(f"stage          {workload.describe()}", file=stream)
    meter = EnergyMeter(gpu)
    meter.start()
    try:
        profile, idle_w, locked, swept_s = _measure(gpu, meter, workload, budget, stream)
    finally:
        meter.stop()
        with contextlib.suppress(PerseusError):
            gpu.reset_clock()
    _write(args.output, args.stage, profile, idle_w)
    print(
        _table(profile)
        + f"\nidle power {idle_w:.1f} W"
        + ("" if locked else f"  (measured at the current clock only: {_why_not(gpu)})")
        + f"\n{profile.stopped} in {swept_s:.0f} s; wrote {os.path.abspath(args.output)}",
        file=stream,
    )
    inverted = profile.inversions()
    if inverted:
        print(
            f"perseus: warning: {'; '.join(inverted)}: a lower clock never runs faster, so "
            "the measurements were disturbed (another process on the GPU"
            + (", or on the CPU that runs the fake GPU's work" if args.gpu == "fake" else "")
            + "); profile again on an idle machine",
            file=sys.stderr,
        )
    return 0


def _synthetic_stage(args: argparse.Namespace) -> SyntheticStage:
    try:
        import torch  # noqa: F401  (imported here to say which extra brings it)
    except ImportError as err:
        raise SettingsError(
            f"perseus profile needs torch ({err}); {install_hint('torch')}"
        ) from None
    return SyntheticStage.build(args)


def _measure(
    gpu: GpuControl,
    meter: EnergyMeter,
    workload: SyntheticStage,
    budget: ProfileBudget,
    stream: Any,
) -> tuple[StageProfile, float, bool, float]:
    """The profile, the idle power, whether clocks were locked, and the sweep's seconds."""
    work = device_work(gpu)
    workload.warm_up()
    idle_w = measure_idle_power(meter, time.sleep, max(1.2, budget.window_s), time.perf_counter)
    lock = gpu.can_set_clocks
    sweep = ClockSweep(gpu, meter, workload, budget, work, lock=lock)
    started = time.perf_counter()
    if lock:
        print(f"sweeping {sweep.describe()}: {budget.describe()}", file=stream, flush=True)
    try:
        while not sweep.done:
            measured = sweep.step()
            if measured is not None:
                print(
                    f"  {measured.frequency_mhz} MHz ({sweep.done_clocks} of "
                    f"{sweep.planned_clocks}, {time.perf_counter() - started:.0f} s)  forward "
                    f"{measured.forward_time_s * 1e3:.2f} ms "
                    f"{measured.forward_energy_j:.3f} J  backward "
                    f"{measured.backward_time_s * 1e3:.2f} ms {measured.backward_energy_j:.3f} J",
                    file=stream,
                    flush=True,
                )
    except NvmlPermissionError as err:
        print(f"cannot change clocks ({err}); measuring the current clock only", file=stream)
        lock = False
        sweep = ClockSweep(gpu, meter, workload, budget, work, lock=False)
        sweep.run()
    return sweep.result(), idle_w or 0.0, lock, time.perf_counter() - started


def _why_not(gpu: GpuControl) -> str:
    return "dry-run changes nothing" if not gpu.can_set_clocks else "no permission"


def _table(profile: StageProfile) -> str:
    lines = ["  MHz  forward ms  forward J  backward ms  backward J"]
    for m in profile.measurements:
        lines.append(
            f"{m.frequency_mhz:5d}  {m.forward_time_s * 1e3:10.3f}  {m.forward_energy_j:9.4f}  "
            f"{m.backward_time_s * 1e3:11.3f}  {m.backward_energy_j:10.4f}"
        )
    return "\n".join(lines)


def _write(path: str, stage: int, profile: StageProfile, idle_w: float) -> None:
    from perseus.core.profiles import profile_from_rows
    from perseus.formats.profiles import profile_to_csv, profile_to_json

    rows = [(stage, r.instruction, r.frequency_mhz, r.time_s, r.energy_j) for r in profile.rows()]
    # Stages before this one are not measured; the profile names only this stage's rows,
    # renumbered from 0 when written as a one-stage profile.
    built = profile_from_rows(
        [(0, *row[1:]) for row in rows], source=path, p_block_w=idle_w if idle_w > 0 else None
    )
    if path.endswith(".json"):
        data = profile_to_json(built)
        for row in data["rows"]:
            row["stage"] = stage
        text = json.dumps(data, indent=1) + "\n"
    else:
        text = profile_to_csv(built)
        if stage:
            text = (
                "\n".join(
                    line if i == 0 else f"{stage}{line[line.index(',') :]}"
                    for i, line in enumerate(text.splitlines())
                )
                + "\n"
            )
    try:
        write_files({path: text.encode("utf-8")})
    except OSError as err:
        raise SettingsError(f"--output: cannot write {path}: {err.strerror}") from err
