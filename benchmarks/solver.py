"""Whole-frontier planning: perseus.solver against lowtime 0.3.0 (as Perseus drives it).

    python benchmarks/solver.py            # default grid (lowtime cases take a few minutes)
    python benchmarks/solver.py --quick    # small grid
    python benchmarks/solver.py --scale    # doubling series up to 32 x 256 (synthetic H200)
    python benchmarks/solver.py --versus /tmp/perseus-base  # planning call against older code
    python benchmarks/solver.py --matrix --base old=/tmp/perseus-old --repeat 3  # cold and warm

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

``--scale`` prints one table instead: whole `perseus plan` processes with default settings on
the synthetic H200-shaped profile (``perseus.solver.synthetic``, 110 clocks from 1980 down to
345 MHz, blocking power 100 W), 1F1B doubling stages and microbatches from 4 x 8 up to
32 x 256, plus 16 x 128 interleaved (V=2). "seconds" is the whole process's wall clock (the
median of ``--repeat`` runs), "peak MiB" its ru_maxrss, "cells" instructions x clocks; the last
lines fit time and memory to ``a * cells^b`` over the 1F1B series (least squares in log-log)
and print ``b``. With ``--gaps`` each case is planned once more in the same fresh process (not
timed; `compute_frontier` with the CLI's defaults) for the gap each frontier reports at the
deadlines the policies name, 1, 1.01, 1.02 and 1.05 x the default plan's time (the point's
energy against the relaxation's lower bound at that deadline), and the largest over all points.

``--versus DIR`` times the planning call (`compute_frontier` with default settings, in a fresh
process each run, as a planner server's worker makes it: after that checkout's worker's
``perseus.server.planning.worker.warm_up`` (here, loading the solver's compiled kernels, with which
every DAG is then planned) and planning the same profile at 8 microbatches) of this
checkout against the perseus in DIR (an older commit, e.g. from
`git worktree add /tmp/perseus-base <commit>`), on 8 x 12 and 8 x 96 1F1B (gpt3-175b+a40 and
bloom+a100), the two alternating run by run so that both see the same load; it prints the
medians of ``--repeat`` runs, their ratio, and the two frontiers compared point by point: at
every deadline where either has a point, the least energy each takes within it ("worse" is
this checkout's largest excess over the older, "better" its largest saving).

``--matrix`` times whole `perseus plan` processes (default settings) of this checkout and of
each ``--base LABEL=DIR`` (older code, e.g. ``git archive 45a2241 | tar -x -C DIR``) on every
shared profile and three synthetic 8-stage ones with 20, 38 and 110 clocks (the A100's and
H200's shapes, ``perseus.solver.synthetic``, blocking power 100 W), at 1F1B 8 x 12, 24, 48 and
96, interleaved 1F1B 8 x 32 (V=2) and ZBV 8 x 24 (V=2; on the synthetic profiles alone, with
the backward's halves: the artifact's have none; skipped for code without ZBV). Each
cell is run **cold** (an empty kernel cache, as after an install: ``PERSEUS_CACHE_DIR`` and
``NUMBA_CACHE_DIR`` point at a new empty folder) and **warm** (the checkout's kernels cached
first by its ``warm_kernels``); code without compiled kernels runs once, for both. Where a
cold run starts compiling the kernels for the next process, the next run waits until that
has finished. Checkouts alternate run by run; the table holds the medians of ``--repeat``
runs and this checkout's time over each base's; ``--profiles`` and ``--sizes`` pick a subset.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
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


SCALE_CLOCKS_MHZ = tuple(range(1980, 344, -15))  # 110 clocks
SCALE_P_BLOCK_W = 100.0
SCALE_SERIES = [(4, 8), (8, 16), (8, 32), (16, 32), (16, 64), (16, 128), (32, 128), (32, 256)]


def scale_cases() -> list[Case]:
    cases = [Case("synthetic-h200", "1f1b", s, m) for s, m in SCALE_SERIES]
    cases.insert(-2, Case("synthetic-h200", "interleaved-1f1b", 16, 128, virtual_stages=2))
    return cases


def _scale_run(case: Case, profile_path: Path) -> dict[str, Any]:
    """One whole `perseus plan` process under /usr/bin/time-like accounting: wall seconds
    and the child's peak RSS (ru_maxrss of the waited child)."""
    argv = ["plan", str(profile_path), "--microbatches", str(case.microbatches),
            "--p-block", repr(SCALE_P_BLOCK_W), "--schedule", case.schedule]  # fmt: skip
    if case.virtual_stages > 1:
        argv += ["--virtual-stages", str(case.virtual_stages)]
    code = f"import sys; from perseus.cli import main; sys.exit(main({argv!r}))"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"timeout after {TIMEOUT_S:.0f} s"}
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the largest child so far
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {(err.strip().splitlines() or ['?'])[-1]}"}
    points = next(
        (line.split()[1] for line in out.splitlines() if line.startswith("frontier")), "?"
    )
    return {"seconds": seconds, "peak_mib": usage.ru_maxrss / 1024.0, "points": points}


SCALE_GAP_FACTORS = (1.0, 1.01, 1.02, 1.05)


def _scale_gaps(case: Case, profile_path: Path) -> list[float]:
    """The gaps the frontier reports at SCALE_GAP_FACTORS x the default plan's time."""
    from perseus.core.baselines import BaselineKey
    from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S
    from perseus.solver import compute_frontier, load_profile, make_schedule

    profile = load_profile(profile_path)
    schedule = make_schedule(case.schedule, case.stages, case.microbatches, case.virtual_stages)
    frontier = compute_frontier(profile, schedule, p_block_w=SCALE_P_BLOCK_W,
                                clock_change_margin_s=CLOCK_CHANGE_MARGIN_S)  # fmt: skip
    default_s = frontier.baselines[BaselineKey.DEFAULT].time_s
    gaps = []
    for factor in SCALE_GAP_FACTORS:
        fits = [i for i in range(len(frontier))
                if frontier.times_s[i] <= factor * default_s * (1 + 1e-12)]  # fmt: skip
        gaps.append(float(frontier.gaps[fits[-1]]) if fits else math.nan)
    return [*gaps, float(frontier.gaps.max())]


def _fit_exponent(xs: list[float], ys: list[float]) -> float:
    import math

    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def run_scale(repeat: int, gaps: bool = False, only: list[str] | None = None) -> None:
    """The doubling series (see the module's docstring), one table."""
    import statistics
    import tempfile

    from perseus.solver import make_schedule
    from perseus.solver.synthetic import synthetic_profile, to_csv

    rows: list[tuple[str, ...]] = []
    fit: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in scale_cases():
            name = f"{case.stages}x{case.microbatches}" + (
                f"v{case.virtual_stages}" if case.virtual_stages > 1 else ""
            )
            if only and name not in only:
                continue
            path = Path(tmp) / f"h200_{case.stages}.csv"
            if not path.exists():
                path.write_text(to_csv(synthetic_profile(case.stages, SCALE_CLOCKS_MHZ, SEED)))
            schedule = make_schedule(
                case.schedule, case.stages, case.microbatches, case.virtual_stages
            )
            n = schedule.num_instructions
            cells = n * len(SCALE_CLOCKS_MHZ)
            label = f"{case.schedule} {case.stages}x{case.microbatches}"
            print(f"running {label} ...", file=sys.stderr, flush=True)
            runs = []
            # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: run each case in a
            # fresh interpreter that runs it once, so every figure is the case's own
            for _ in range(repeat):
                child = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--scale-child",
                     json.dumps([asdict(case), str(path), gaps and not runs])],
                    capture_output=True, text=True, cwd=REPO,
                )  # fmt: skip
                lines = child.stdout.strip().splitlines()
                runs.append(json.loads(lines[-1]) if lines else {"error": child.stderr[-200:]})
            ok = [r for r in runs if "error" not in r]
            head = (case.schedule, str(case.stages), str(case.microbatches),
                    str(case.virtual_stages), f"{n:,}", f"{cells:,}")  # fmt: skip
            if not ok:
                rows.append((*head, runs[0]["error"]))
                continue
            seconds = statistics.median(r["seconds"] for r in ok)
            peak = max(r["peak_mib"] for r in ok)
            found = [f"{100 * g:.2f}" for g in ok[0].get("gaps", [])]
            rows.append((*head, str(ok[0]["points"]), f"{seconds:.1f}", f"{peak:.0f}", *found))
            if case.virtual_stages == 1:
                fit.append((float(cells), seconds, peak))
    header = ("schedule", "S", "M", "V", "instr", "instr x clocks", "points", "seconds",
              "peak MiB")  # fmt: skip
    if gaps:
        header += (*(f"gap {f:g}x %" for f in SCALE_GAP_FACTORS), "max gap %")
    widths = [max([len(h)] + [len(r[i]) for r in rows if i < len(r)]) for i, h in enumerate(header)]
    print(
        f"# perseus plan, default settings, synthetic H200 profile ({len(SCALE_CLOCKS_MHZ)} "
        f"clocks), whole process, median of {repeat}; {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}"
    )
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in
                    enumerate(zip(header, widths, strict=True))))  # fmt: skip
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                        for i, c in enumerate(r)))  # fmt: skip
    if len(fit) >= 2:
        xs = [c for c, _, _ in fit]
        print(f"time ~ (instr x clocks)^{_fit_exponent(xs, [s for _, s, _ in fit]):.2f}, "
              f"memory ~ (instr x clocks)^{_fit_exponent(xs, [m for _, _, m in fit]):.2f} "
              "(1F1B series, log-log least squares)")  # fmt: skip
        big = [f for f in fit if f[0] >= fit[-1][0] / 8]
        if len(big) >= 2:
            xs = [c for c, _, _ in big]
            time_b = _fit_exponent(xs, [s for _, s, _ in big])
            print(f"the largest 8x of the series: time ^{time_b:.2f}, "
                  f"memory ^{_fit_exponent(xs, [m for _, _, m in big]):.2f}")  # fmt: skip


VERSUS_CASES = [
    Case("gpt3-a40", "1f1b", 8, 12),
    Case("bloom-a100", "1f1b", 8, 12),
    Case("gpt3-a40", "1f1b", 8, 96),
    Case("bloom-a100", "1f1b", 8, 96),
]


def _versus_child(case: Case, root: str) -> dict[str, Any]:
    """One planning call of the perseus under ``root``, in this (fresh) process, warmed up."""
    sys.path.insert(0, root)
    from perseus.solver import compute_frontier, load_profile, make_schedule

    file_name, p_block_w = PROFILES[case.profile]
    profile = load_profile(PROFILES_DIR / file_name)
    # as a planner server's worker plans: what that checkout's worker does ahead of its jobs
    # (perseus.server.planning.worker.warm_up: here, load the solver's compiled kernels), and a job
    from perseus.server.planning.worker import warm_up

    warm_up()
    first_job = make_schedule(case.schedule, case.stages, 8, case.virtual_stages)
    compute_frontier(profile, first_job, p_block_w=p_block_w)
    schedule = make_schedule(case.schedule, case.stages, case.microbatches, case.virtual_stages)
    started = time.perf_counter()
    frontier = compute_frontier(profile, schedule, p_block_w=p_block_w)
    seconds = time.perf_counter() - started
    points = [frontier.point(i) for i in range(len(frontier))]
    return {
        "seconds": seconds,
        "time_s": [float(p.time_s) for p in points],
        "energy_j": [float(p.energy_j) for p in points],
        "max_gap": float(max(frontier.gaps)),
    }


def _least_energy_within(times: list[float], energies: list[float], deadlines: Any) -> Any:
    import numpy as np

    at = np.searchsorted(np.asarray(times), deadlines * (1 + 1e-12), side="right") - 1
    return np.asarray(energies)[at]


def run_versus(base: str, repeat: int) -> None:
    """This checkout's planning call against the one under ``base`` (see the docstring)."""
    import statistics

    import numpy as np

    rows = []
    for case in VERSUS_CASES:
        label = f"{case.profile} {case.stages}x{case.microbatches}"
        print(f"running {label} ...", file=sys.stderr, flush=True)
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
        for _ in range(repeat):
            for key, root in (("base", base), ("new", str(REPO))):
                child = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--versus-child",
                     json.dumps([asdict(case), root])],
                    capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT_S,
                )  # fmt: skip
                lines = child.stdout.strip().splitlines()
                if child.returncode != 0 or not lines:
                    raise SystemExit(f"{label} ({key}): {child.stderr.strip()[-300:]}")
                runs[key].append(json.loads(lines[-1]))
        old, new = runs["base"][0], runs["new"][0]
        deadlines = np.union1d(old["time_s"], new["time_s"])
        deadlines = deadlines[deadlines >= max(old["time_s"][0], new["time_s"][0])]
        excess = (
            _least_energy_within(new["time_s"], new["energy_j"], deadlines)
            / (_least_energy_within(old["time_s"], old["energy_j"], deadlines))
            - 1.0
        )
        base_s = statistics.median(r["seconds"] for r in runs["base"])
        new_s = statistics.median(r["seconds"] for r in runs["new"])
        rows.append((case.profile, f"{case.stages}x{case.microbatches}",
                     f"{case.stages * 2 * case.microbatches:,}", f"{base_s:.2f}", f"{new_s:.2f}",
                     f"{base_s / new_s:.2f}x", str(len(old["time_s"])),
                     str(len(new["time_s"])), f"{100 * max(excess.max(), 0.0):.4f}",
                     f"{100 * max(-excess.min(), 0.0) + 0.0:.4f}", f"{100 * old['max_gap']:.3f}",
                     f"{100 * new['max_gap']:.3f}"))  # fmt: skip
    header = ("profile", "case", "instr", "before s", "after s", "speedup", "points before",
              "points after", "worse %", "better %", "max gap before %",
              "max gap after %")  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"# compute_frontier, default settings: {base} (before) against this checkout "
          f"(after), median of {repeat} alternating runs each; {os.cpu_count()} CPUs")  # fmt: skip
    print("  ".join(h.ljust(w) if i < 2 else h.rjust(w)
                    for i, (h, w) in enumerate(zip(header, widths, strict=True))))  # fmt: skip
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(widths[i]) if i < 2 else c.rjust(widths[i])
                        for i, c in enumerate(r)))  # fmt: skip


# --matrix: every shared profile and synthetic ones of the A100's and H200's shapes
MATRIX_SYNTHETIC = {  # label -> clocks (MHz); blocking power SCALE_P_BLOCK_W, 8 stages
    "synthetic-20": tuple(range(1410, 839, -30)),
    "synthetic-38": tuple(range(1410, 854, -15)),
    "synthetic-110": SCALE_CLOCKS_MHZ,
}
MATRIX_SIZES = [  # (schedule, stages, microbatches, virtual stages)
    ("1f1b", 8, 12, 1),
    ("1f1b", 8, 24, 1),
    ("1f1b", 8, 48, 1),
    ("1f1b", 8, 96, 1),
    ("interleaved-1f1b", 8, 32, 2),
    ("zbv", 8, 24, 2),
]


def _matrix_profiles(folder: Path) -> dict[str, tuple[Path, float]]:
    """Label -> (CSV file, blocking power W): the shared profiles and synthetic ones written
    into ``folder`` (without split backward rows, which older checkouts do not read)."""
    from perseus.solver.synthetic import synthetic_profile, to_csv

    profiles = {label: (PROFILES_DIR / name, power) for label, (name, power) in PROFILES.items()}
    for label, clocks in MATRIX_SYNTHETIC.items():
        path = folder / f"{label}.csv"
        path.write_text(to_csv(synthetic_profile(8, clocks, SEED, split_backward=False)))
        split = folder / f"{label}-split.csv"  # the zero-bubble schedules' (see _profile_for)
        split.write_text(to_csv(synthetic_profile(8, clocks, SEED, split_backward=True)))
        profiles[label] = (path, SCALE_P_BLOCK_W)
    return profiles


def _profile_for(profile: Path, schedule: str) -> Path | None:
    """The file to plan ``schedule`` on: zero-bubble schedules need the backward's halves
    measured (the synthetic profiles' split file; None for the artifact's, which have none)."""
    if schedule not in ("zbv", "dualpipev", "interleaved-zb"):
        return profile
    split = profile.with_name(profile.stem + "-split.csv")
    return split if split.exists() else None


def _matrix_env(root: str, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = root
    # the kernels' cache: this checkout's folder (PERSEUS_CACHE_DIR), older ones' numba default
    # moved there too (NUMBA_CACHE_DIR), so that an empty folder is a cold start for each
    env["PERSEUS_CACHE_DIR"] = str(cache)
    env["NUMBA_CACHE_DIR"] = str(cache / "numba-default")
    env.pop("PERSEUS_COMPILE_KERNELS", None)
    return env


def _matrix_plan(root: str, cache: Path, profile: Path, p_block_w: float,
                 size: tuple[str, int, int, int]) -> float:  # fmt: skip
    """Wall seconds of one whole `perseus plan` process of the checkout under ``root``, default
    settings, with its kernels' cache in ``cache``."""
    schedule, _, microbatches, chunks = size
    argv = ["plan", str(profile), "--microbatches", str(microbatches), "--p-block",
            repr(p_block_w), "--schedule", schedule]  # fmt: skip
    if chunks > 1:
        argv += ["--virtual-stages", str(chunks)]
    code = (f"import sys; sys.path.insert(0, {root!r}); from perseus.cli import main; "
            f"sys.exit(main({argv!r}))")  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_matrix_env(root, cache), cwd=tempfile.gettempdir(),
                          timeout=TIMEOUT_S)  # fmt: skip
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{root}: perseus {' '.join(argv)}: {proc.stderr.strip()[-400:]}")
    return seconds


def _await_compile_for_later(cache: Path, limit_s: float = 600.0) -> None:
    """Where a cold run started compiling the kernels for the next process (this checkout's
    kernel_cache.compile_later), wait until that has finished, so that it shares no core with
    the next timed run."""
    folder = cache / "numba"
    if not folder.is_dir():
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if any(folder.glob("ready-*")) and not (folder / "compiling").exists():
            return
        time.sleep(0.5)


def _warm_cache(root: str, cache: Path) -> bool:
    """Fill ``cache`` with the checkout's compiled kernels (its warm_kernels, as a planner
    server's worker calls it); False where the checkout has none."""
    code = (f"import sys; sys.path.insert(0, {root!r})\n"
            "try:\n    from perseus.solver.planner import warm_kernels\n"
            "except ImportError:\n    sys.exit(3)\nwarm_kernels()")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_matrix_env(root, cache), timeout=TIMEOUT_S)  # fmt: skip
    if proc.returncode == 3:
        return False
    if proc.returncode != 0:
        raise SystemExit(f"{root}: warm_kernels: {proc.stderr.strip()[-400:]}")
    return True


def _supports(root: str, schedule: str) -> bool:
    text = (Path(root) / "perseus" / "solver" / "schedules.py").read_text()
    return f'"{schedule}"' in text


def run_matrix(bases: list[tuple[str, str]], repeat: int, only_profiles: list[str] | None,
               only_sizes: list[str] | None) -> None:  # fmt: skip
    """The matrix (see the module's docstring): every profile and size, each checkout cold
    and warm, runs alternating checkout by checkout; medians of ``repeat``."""
    import shutil
    import statistics

    from perseus.solver import build_dag, make_schedule

    checkouts = [*bases, ("this", str(REPO))]
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory(prefix="perseus-matrix-") as tmp:
        scratch = Path(tmp)
        profiles = _matrix_profiles(scratch)
        warm: dict[str, Path | None] = {}
        for label, root in checkouts:
            cache = scratch / f"warm-{label}"
            warm[label] = cache if _warm_cache(root, cache) else None
        for label, (profile, power) in profiles.items():
            if only_profiles and label not in only_profiles:
                continue
            for size in MATRIX_SIZES:
                schedule, stages, microbatches, chunks = size
                name = f"{stages}x{microbatches}" + (f"v{chunks}" if chunks > 1 else "")
                if only_sizes and name not in only_sizes:
                    continue
                planned_on = _profile_for(profile, schedule)
                if planned_on is None:
                    continue  # no backward halves measured: no zero-bubble plan
                print(f"running {label} {schedule} {name} ...", file=sys.stderr, flush=True)
                times: dict[tuple[str, str], list[float]] = {}
                for _ in range(repeat):
                    for key, root in checkouts:
                        if not _supports(root, schedule):
                            continue
                        if warm[key] is not None:  # cold: an empty cache, as after an install
                            cold = Path(tempfile.mkdtemp(dir=scratch, prefix="cold-"))
                            seconds = _matrix_plan(root, cold, planned_on, power, size)
                            times.setdefault((key, "cold"), []).append(seconds)
                            _await_compile_for_later(cold)
                            shutil.rmtree(cold, ignore_errors=True)
                        cache = warm[key] or scratch / "no-kernels"
                        seconds = _matrix_plan(root, cache, planned_on, power, size)
                        times.setdefault((key, "warm"), []).append(seconds)
                        if warm[key] is None:  # no kernels: a cold start is a warm one
                            times.setdefault((key, "cold"), []).append(seconds)
                medians = {k: statistics.median(v) for k, v in times.items()}
                n = build_dag(make_schedule(schedule, stages, microbatches, chunks)).size
                row = [label, schedule, name, f"{n:,}"]
                for key, _ in checkouts:
                    for state in ("cold", "warm"):
                        value = medians.get((key, state))
                        row.append("-" if value is None else f"{value:.2f}")
                for key, _ in bases:
                    for state in ("cold", "warm"):
                        ours, theirs = medians.get(("this", state)), medians.get((key, state))
                        row.append("-" if not (ours and theirs) else f"{ours / theirs:.2f}")
                rows.append(tuple(row))
                print("  ".join(row), file=sys.stderr, flush=True)  # as it comes
    header = ["profile", "schedule", "size", "instr"]
    header += [f"{key} {state}" for key, _ in checkouts for state in ("cold", "warm")]
    header += [f"/{key} {state}" for key, _ in bases for state in ("cold", "warm")]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"# perseus plan, default settings, whole process (s), median of {repeat} runs "
          f"alternating checkout by checkout; cold: an empty kernel cache (as after an "
          f"install), warm: the kernels cached; /base: this checkout's time over that "
          f"one's; {os.cpu_count()} CPUs")  # fmt: skip
    for key, root in bases:
        print(f"# {key}: {root}")
    print("  ".join(h.ljust(w) if i < 3 else h.rjust(w)
                    for i, (h, w) in enumerate(zip(header, widths, strict=True))))  # fmt: skip
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(widths[i]) if i < 3 else c.rjust(widths[i])
                        for i, c in enumerate(r)))  # fmt: skip


MARGIN_GAP_SIZES = [  # (schedule, stages, microbatches, virtual stages); no zero-bubble case:
    # the artifact profiles have no backward halves measured
    ("1f1b", 8, 12, 1),
    ("1f1b", 8, 24, 1),
    ("1f1b", 8, 48, 1),
    ("1f1b", 8, 96, 1),
    ("interleaved-1f1b", 8, 32, 2),
]


def _margin_gap_child(label: str, size: list[Any]) -> dict[str, float]:
    """One artifact case's frontier at the default margin: its largest reported gap, and per
    point the same plan's gap without transitions and the transitions' energy over the bound."""
    import numpy as np

    from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S
    from perseus.solver import build_dag, compute_frontier, load_profile, make_schedule
    from perseus.solver.transitions import clock_tables, evaluate_plans

    file_name, p_block_w = PROFILES[label]
    profile = load_profile(PROFILES_DIR / file_name)
    schedule = make_schedule(*size)
    frontier = compute_frontier(profile, schedule, p_block_w=p_block_w,
                                clock_change_margin_s=CLOCK_CHANGE_MARGIN_S)  # fmt: skip
    bound = frontier.energies_j / (1.0 + frontier.gaps)
    plans = np.asarray(frontier.frequencies_mhz).T.astype(np.int64)
    tables, dag = clock_tables(profile, schedule), build_dag(schedule)
    _, without = evaluate_plans(tables, dag, p_block_w, plans, 0.0)
    share = (frontier.energies_j - without) / bound
    return {
        "points": len(frontier),
        "max_gap": float(frontier.gaps.max()),
        "max_gap_without": float((without / bound - 1.0).max()),
        "max_share": float(share.max()),
        "over_1": int((frontier.gaps > 0.01).sum()),
    }


def run_margin_gaps(only_profiles: list[str] | None, only_sizes: list[str] | None) -> None:
    """The artifact cases' gaps at the default clock-change margin, one fresh process each."""
    rows = []
    for label in PROFILES:
        if only_profiles and label not in only_profiles:
            continue
        for schedule, stages, microbatches, chunks in MARGIN_GAP_SIZES:
            name = f"{stages}x{microbatches}" + (f"v{chunks}" if chunks > 1 else "")
            if only_sizes and name not in only_sizes:
                continue
            print(f"running {label} {schedule} {name} ...", file=sys.stderr, flush=True)
            child = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--margin-gap-child",
                 json.dumps([label, [schedule, stages, microbatches, chunks]])],
                capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT_S,
            )  # fmt: skip
            lines = child.stdout.strip().splitlines()
            if child.returncode != 0 or not lines:
                raise SystemExit(f"{label} {name}: {child.stderr.strip()[-300:]}")
            r = json.loads(lines[-1])
            rows.append((label, schedule, name, str(r["points"]),
                         f"{100 * r['max_gap']:.3f}", f"{100 * r['max_gap_without']:.3f}",
                         f"{100 * r['max_share']:.3f}", str(r["over_1"])))  # fmt: skip
    header = ("profile", "schedule", "size", "points", "max gap %", "max gap w/o transitions %",
              "max transitions' share %", "points over 1 %")  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("# compute_frontier, default settings (5 ms clock-change margin): the largest gap "
          "reported; the same plans' gap without transitions and the transitions' energy, "
          "each over the point's bound")  # fmt: skip
    print("  ".join(h.ljust(w) if i < 3 else h.rjust(w)
                    for i, (h, w) in enumerate(zip(header, widths, strict=True))))  # fmt: skip
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(widths[i]) if i < 3 else c.rjust(widths[i])
                        for i, c in enumerate(row)))  # fmt: skip


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
    parser.add_argument("--scale", action="store_true", help="doubling series up to 32 x 256")
    parser.add_argument(
        "--gaps",
        action="store_true",
        help="--scale: also the gaps at 1-1.05 x (plans each case twice)",
    )
    parser.add_argument("--only", nargs="+", metavar="SxM[vV]",
                        help="--scale: only these cases (e.g. 16x128v2 32x256)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1,
                        help="--scale, --versus: runs per case (median)")  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--versus", metavar="DIR", help="planning call against the perseus in DIR")
    parser.add_argument(
        "--matrix", action="store_true", help="cold and warm process times against --base"
    )
    parser.add_argument(
        "--base", action="append", default=[], metavar="LABEL=DIR",
        help="--matrix: an older checkout to compare with (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--profiles", nargs="+", metavar="LABEL",
        help="--matrix: only these profiles (e.g. gpt3-a40 synthetic-110)",
    )  # fmt: skip
    parser.add_argument(
        "--sizes", nargs="+", metavar="SxM[vV]",
        help="--matrix: only these sizes (e.g. 8x12 8x96 8x32v2 8x24v2)",
    )  # fmt: skip
    parser.add_argument(
        "--margin-gaps", action="store_true", help="the artifact cases' gaps at the default margin"
    )
    parser.add_argument("--margin-gap-child", help=argparse.SUPPRESS)
    parser.add_argument("--scale-child", help=argparse.SUPPRESS)
    parser.add_argument("--versus-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.versus_child:
        case_fields, root = json.loads(args.versus_child)
        print(json.dumps(_versus_child(Case(**case_fields), root)))
        return
    if args.versus:
        run_versus(args.versus, args.repeat)
        return
    if args.margin_gap_child:
        label, size = json.loads(args.margin_gap_child)
        print(json.dumps(_margin_gap_child(label, size)))
        return
    if args.margin_gaps:
        run_margin_gaps(args.profiles, args.sizes)
        return
    if args.matrix:
        bases = [tuple(b.split("=", 1)) for b in args.base]
        if any(len(b) != 2 for b in bases):
            parser.error("--base: LABEL=DIR")
        run_matrix([(k, v) for k, v in bases], args.repeat, args.profiles, args.sizes)
        return
    if args.scale_child:
        case_fields, path, with_gaps = json.loads(args.scale_child)
        result = _scale_run(Case(**case_fields), Path(path))
        if with_gaps and "error" not in result:
            result["gaps"] = _scale_gaps(Case(**case_fields), Path(path))
        print(json.dumps(result))
        return
    if args.scale:
        run_scale(args.repeat, args.gaps, args.only)
        return
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
