"""A cluster power budget: the throughput kept at each budget by three ways of shedding power.

    python benchmarks/cluster_budget.py [--jobs 24] [--budgets 8] [--keep FOLDER]

Makes a folder of job files (``perseus cluster simulate``'s input) from the shared profiles
(../shared/data/profiles: bloom and GPT-3 on A100 and A40) and synthetic H200-shaped ones
(perseus.solver.synthetic, seeds 0..), with 1F1B, GPipe and interleaved shapes of 4-16
microbatches, 1-8 replicas and priorities 1-3 drawn from a fixed seed, then runs
``perseus cluster simulate`` on it in this process and prints its table: at each budget,
from the least power the jobs can draw to what their own policies draw, the priority-weighted
throughput kept (against default clocks) by

- frontiers: each job's point chosen on its frontier under the budget (this planner);
- power limit: one power limit on every GPU, the highest that fits (what operators do today);
- per-job: every job at one common slowdown limit on its own frontier (no coordination).

Without ../shared only synthetic profiles are used. Deterministic but for the wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from perseus.cli.cluster_simulate import default_budgets, load_jobs, plan_jobs, simulate, table
from perseus.solver.synthetic import synthetic_profile, to_csv

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "profiles"
P_BLOCK_W = {"a100": 83.64, "a40": 70.38}


def make_folder(folder: Path, jobs: int, seed: int = 0) -> None:
    """Write ``jobs`` job files (and the synthetic profiles they use) into ``folder``."""
    rng = random.Random(seed)
    profiles: list[tuple[str, float]] = []
    if SHARED.is_dir():
        for path in sorted(SHARED.glob("*.csv")):
            gpu = "a100" if "a100" in path.name else "a40"
            profiles.append((str(path.resolve()), P_BLOCK_W[gpu]))
    for s in range(3):
        path = folder / f"synthetic-h200-{s}.csv"
        path.write_text(to_csv(synthetic_profile(stages=4, seed=s, split_backward=False)))
        profiles.append((path.name, 130.0))
    for j in range(jobs):
        profile, p_block = profiles[j % len(profiles)]
        schedule = rng.choice(["1f1b", "1f1b", "gpipe", "interleaved-1f1b"])
        job = {
            "profile": profile,
            "p_block_w": p_block,
            "schedule": schedule,
            "microbatches": rng.choice([4, 8, 12, 16]),
            "replicas": rng.choice([1, 2, 4, 8]),
            "priority": rng.choice([1, 1, 2, 3]),
        }
        if schedule == "interleaved-1f1b":
            job["virtual_stages"] = 2
            job["microbatches"] = 8  # a multiple of the stages
        (folder / f"job{j:02d}.json").write_text(json.dumps(job))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--budgets", type=int, default=8)
    parser.add_argument("--keep", type=Path, help="write the job folder here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        make_folder(folder, args.jobs)
        started = time.monotonic()
        jobs = plan_jobs(folder, load_jobs(folder))
        planned_s = time.monotonic() - started
        curves = simulate(jobs, default_budgets(jobs, args.budgets))
        print(table(jobs, curves), end="")
        print(
            f"planned {len(jobs)} frontiers in {planned_s:.1f} s; "
            f"compared in {time.monotonic() - started - planned_s:.1f} s"
        )


if __name__ == "__main__":
    main()
