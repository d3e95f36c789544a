"""Whole-frontier planning: perseus.solver against lowtime 0.3.0 (as Perseus drives it).

    python benchmarks/solver.py            # default grid (lowtime cases take a few minutes)
    python benchmarks/solver.py --quick    # small grid

Each run (one case, one solver) happens in a fresh Python process, so its peak memory is its own:
"peak MiB" is the growth of the process's ru_maxrss over the solve (after imports and profile
loading), measured the same way for both solvers; "RSS MiB" is the whole process's peak.
"seconds" covers the planning work only: `compute_frontier` for perseus; spec fitting, DAG
construction and the Phillips-Dessouky run for lowtime. "process s" is the whole process, wall
clock, started to finished: `perseus plan` with default settings (plots off) for perseus, the
peer script (imports, profile, the same run) for lowtime; the ratio line compares those.

Savings are judged on equal terms: the fastest frontier point of each solver is replayed on the
raw profile values (longest path of the schedule's DAG, E = sum e_i + P_block (S T - sum t_i)),
and "saving" = 1 - E(fastest point) / E(every instruction at its minimum-time option). The
replay for 1F1B is `_lowtime_peer.replay_1f1b`, independent of both solvers; other schedules use
`perseus.solver.replay`. "stated s" is the iteration time the solver claims for that point,
"replayed s" what the plan really takes, "fastest s" the all-minimum-time iteration time.
Nothing is random; the seed is fixed anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _lowtime_peer import (
    PROFILES_DIR,
    replay_1f1b,
    run_lowtime_subprocess,
)

SEED = 0
REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600.0
LOWTIME_MAX_MICROBATCHES = 16

# label -> (file under ../shared/data/profiles, blocking power W)
PROFILES = {
    "bloom-a100": ("bloom+a100_sxm_bf16.csv", 83.64),
    "bloom-a40": ("bloom+a40_bf16.csv", 70.38),
    "gpt3-a40": ("gpt3-175b+a40_bf16.csv", 70.38),
}


@dataclass(frozen=True)
class Case:
    profile: str
    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int = 1
    lowtime: bool = False


def default_grid() -> list[Case]:
    cases = []
    for profile in PROFILES:
        for m in (12, 24, 96):
            cases.append(Case(profile, "1f1b", 8, m, lowtime=m <= LOWTIME_MAX_MICROBATCHES))
    cases.append(Case("gpt3-a40", "1f1b", 8, 16, lowtime=True))
    cases.append(Case("bloom-a100", "interleaved-1f1b", 8, 32, virtual_stages=2))
    cases.append(Case("gpt3-a40", "gpipe", 8, 12))
    return cases


def quick_grid() -> list[Case]:
    return [
        Case("bloom-a100", "1f1b", 8, 8, lowtime=True),
        Case("bloom-a100", "gpipe", 8, 8),
        Case("bloom-a100", "interleaved-1f1b", 8, 8, virtual_stages=2),
    ]


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _perseus_child(case: Case) -> dict[str, Any]:
    """One perseus run, in this (fresh) process."""
    random.seed(SEED)
    from perseus.solver import BaselineKey, compute_frontier, load_profile, make_schedule

    file_name, p_block_w = PROFILES[case.profile]
    profile = load_profile(PROFILES_DIR / file_name)
    schedule = make_schedule(case.schedule, case.stages, case.microbatches, case.virtual_stages)
    rss_before = _peak_rss_mib()
    started = time.perf_counter()
    frontier = compute_frontier(profile, schedule, p_block_w=p_block_w, resolution_s=1e-3)
    seconds = time.perf_counter() - started
    rss_after = _peak_rss_mib()

    fastest = frontier.point(0)  # times ascend
    base = frontier.baselines[BaselineKey.ALL_FASTEST]
    if case.schedule == "1f1b":
        fast_t, fast_e = _replay_1f1b_plan(profile, schedule, p_block_w, fastest.frequencies_mhz)
        base_t, base_e = _replay_1f1b_plan(profile, schedule, p_block_w, base.frequencies_mhz)
    else:
        from perseus.solver import replay

        fast = replay(profile, schedule, p_block_w, fastest.frequencies_mhz)
        all_fast = replay(profile, schedule, p_block_w, base.frequencies_mhz)
        fast_t, fast_e = fast.time_s, fast.energy_j
        base_t, base_e = all_fast.time_s, all_fast.energy_j
    return {
        "points": len(frontier),
        "seconds": seconds,
        "peak_mb": rss_after - rss_before,
        "rss_mb": rss_after,
        "instructions": schedule.num_instructions,
        "stated_time_s": float(fastest.time_s),
        "stated_energy_j": float(fastest.energy_j),
        "fastest_time_s": fast_t,
        "fastest_energy_j": fast_e,
        "all_fastest_time_s": base_t,
        "all_fastest_energy_j": base_e,
        "saving_no_slowdown": 1.0 - fast_e / base_e,
        "max_gap": float(max(frontier.gaps)),
    }


def _replay_1f1b_plan(
    profile: Any, schedule: Any, p_block_w: float, frequencies_mhz: Any
) -> tuple[float, float]:
    """Replay a perseus 1F1B plan with the peer's independent replay."""
    table = {
        (s, kind): {o.frequency_mhz: (o.time_s, o.energy_j) for o in options}
        for s, stage in enumerate(profile.stages)
        for kind, options in stage.items()
    }
    frequency_of = {
        (g, inst.kind, inst.microbatch): freq
        for g, (seq, freqs) in enumerate(zip(schedule.order, frequencies_mhz, strict=True))
        for inst, freq in zip(seq, freqs, strict=True)
    }
    return replay_1f1b(table, schedule.stages, schedule.microbatches, p_block_w, frequency_of)


def run_perseus_subprocess(case: Case) -> dict[str, Any]:
    """`_perseus_child` in a fresh process with a wall-clock limit; {"error": ...} on failure."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(asdict(case))]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {TIMEOUT_S:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {last}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def perseus_plan_seconds(case: Case) -> float | str:
    """Wall-clock seconds of one whole `perseus plan` process with default settings."""
    file_name, p_block_w = PROFILES[case.profile]
    argv = ["plan", str(PROFILES_DIR / file_name), "--microbatches", str(case.microbatches),
            "--p-block", repr(p_block_w), "--schedule", case.schedule]  # fmt: skip
    if case.virtual_stages > 1:
        argv += ["--virtual-stages", str(case.virtual_stages)]
    from perseus import cli

    if getattr(cli, "DEFAULT_POLISH_S", 0.0):  # a wall-clock polish is not a default we time
        argv += ["--polish", "0"]
    code = f"import sys; from perseus.cli import main; sys.exit(main({argv!r}))"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=TIMEOUT_S)  # fmt: skip
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return seconds


def run_lowtime_case(case: Case) -> dict[str, Any]:
    file_name, p_block_w = PROFILES[case.profile]
    started = time.perf_counter()
    result = run_lowtime_subprocess(
        str(PROFILES_DIR / file_name),
        p_block_w,
        case.stages,
        case.microbatches,
        unit_time_s=1e-3,
        timeout_s=TIMEOUT_S,
    )
    result["process_s"] = time.perf_counter() - started
    return result


HEADER = (
    "profile",
    "schedule",
    "S",
    "M",
    "V",
    "instr",
    "solver",
    "points",
    "seconds",
    "process s",
    "peak MiB",
    "RSS MiB",
    "stated s",
    "replayed s",
    "fastest s",
    "saving %",
    "max gap %",
)


def _row(case: Case, solver: str, res: dict[str, Any]) -> tuple[str, ...]:
    head = (
        case.profile,
        case.schedule,
        str(case.stages),
        str(case.microbatches),
        str(case.virtual_stages),
    )
    if "error" in res:
        return (*head, "-", solver, res["error"])
    gap = f"{100 * res['max_gap']:.3f}" if "max_gap" in res else "-"
    return (
        *head,
        str(res["instructions"]),
        solver,
        str(res["points"]),
        f"{res['seconds']:.2f}",
        f"{res['process_s']:.2f}" if "process_s" in res else "-",
        f"{res['peak_mb']:.1f}",
        f"{res['rss_mb']:.0f}",
        f"{res['stated_time_s']:.4f}",
        f"{res['fastest_time_s']:.4f}",
        f"{res['all_fastest_time_s']:.4f}",
        f"{100 * res['saving_no_slowdown']:.2f}",
        gap,
    )


def _print_table(rows: list[tuple[str, ...]]) -> None:
    # Error rows stop at the message, which runs on past the column widths.
    widths = [len(h) for h in HEADER]
    for r in rows:
        sized = r if len(r) == len(HEADER) else r[:-1]
        widths = [max(w, len(c)) for w, c in zip(widths, sized, strict=False)] + widths[
            len(sized) :
        ]
    left = {0, 1, 6}

    def fmt(cells: tuple[str, ...]) -> str:
        out = []
        for i, cell in enumerate(cells):
            if len(cells) < len(HEADER) and i == len(cells) - 1:
                out.append(cell)
            else:
                out.append(cell.ljust(widths[i]) if i in left else cell.rjust(widths[i]))
        return "  ".join(out).rstrip()

    print(fmt(HEADER))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(fmt(r))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small grid")
    parser.add_argument("--no-lowtime", action="store_true", help="perseus only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_perseus_child(Case(**json.loads(args.child)))))
        return

    random.seed(SEED)
    cases = quick_grid() if args.quick else default_grid()
    rows: list[tuple[str, ...]] = []
    ratios: list[str] = []
    for case in cases:
        label = f"{case.profile} {case.schedule} {case.stages}x{case.microbatches}"
        print(f"running perseus {label} ...", file=sys.stderr, flush=True)
        ours = run_perseus_subprocess(case)
        if "error" not in ours:
            whole = perseus_plan_seconds(case)
            if isinstance(whole, str):
                ours = {"error": f"perseus plan: {whole}"}
            else:
                ours["process_s"] = whole
        rows.append(_row(case, "perseus", ours))
        if case.lowtime and not args.no_lowtime:
            print(f"running lowtime {label} ...", file=sys.stderr, flush=True)
            peer = run_lowtime_case(case)
            rows.append(_row(case, "lowtime", peer))
            if "error" not in ours and "error" not in peer:
                ratio = peer["process_s"] / ours["process_s"]
                ratios.append(f"{case.profile} {case.stages}x{case.microbatches} {ratio:.1f}x")

    print(
        f"# perseus.solver vs lowtime 0.3.0, resolution 1 ms, {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}"
    )
    _print_table(rows)
    if ratios:
        print("lowtime process s / perseus plan process s: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
