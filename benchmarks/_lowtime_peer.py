"""Peer runner: the whole 1F1B time-energy frontier with lowtime 0.3.0, as Perseus drives it.

Used by `benchmarks/solver.py`; runnable alone:

    python benchmarks/_lowtime_peer.py                      # bloom A100, 8 x 12, prints a dict
    python benchmarks/_lowtime_peer.py --json --profile gpt3-175b+a40_bf16.csv --p-block-w 70.38

How Perseus drives lowtime (lowtime's `examples/perseus`, the offline script Zeus users run):

1. Per (stage, instruction) build `ExecutionOption(real_time=time, unit_time=tau, cost=energy,
   knob=frequency)` for every profiled clock, and filter them with `CandidateExecutionOptions`
   (Pareto filter on (time, energy), floor-quantize time to `tau`, keep one option per
   quantized time).
2. Re-map the cost to "effective computation energy" `energy - P_block * quant_time * tau`
   (E = sum e_i + P_block (S T - sum t_i) = sum (e_i - P_block t_i) + P_block S T, and the last
   term is fixed per deadline), filter again, and fit `ExponentialModel` (a exp(b t) + c, grid
   search over initial guesses) to the options. One `OperationSpec` per stage and instruction.
3. Build the activity-on-node DAG: `Synchronous1F1B(S, M, stage, specs)` yields each stage's
   `Forward`/`Backward` instructions in order, consecutive ones are chained, `DependencyResolver`
   with `forward_dep`/`backward_dep` adds the cross-stage edges, and `add_source_node` /
   `add_sink_node` add dummy entry and exit nodes (ids 0 and 1, instructions from 2).
4. `PhillipsDessouky(dag).run()` starts from all-slowest and yields one `IterationResult` per
   quantized time step down to the fastest; the operations on the DAG are mutated in place, and
   each one's `assigned_knob` (the slowest clock whose quantized time fits its duration) is the
   plan at that point.

To compare savings on equal terms, the plan at lowtime's fastest point is replayed on the raw
profile values (longest path of the 1F1B DAG, E = sum e_i + P_block (S T - sum t_i)).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROFILES_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiles"

_KIB = 1024.0


def _peak_rss_mib() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / _KIB


def _read_profile(path: str) -> dict[tuple[int, str], dict[int, tuple[float, float]]]:
    """(stage, instruction) -> {frequency_mhz: (time_s, energy_j)} from a Zeus CSV."""
    table: dict[tuple[int, str], dict[int, tuple[float, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (int(row["stage"]), row["instruction"])
            table.setdefault(key, {})[int(row["frequency"])] = (
                float(row["time"]),
                float(row["energy"]),
            )
    return table


def _background_1f1b_order(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Per stage, (kind, microbatch) in synchronous 1F1B order, as BACKGROUND.md states it."""
    orders = []
    for s in range(stages):
        warmup = min(stages - s, microbatches)
        order = [("forward", j) for j in range(warmup)]
        next_f, next_b = warmup, 0
        while next_b < microbatches:
            order.append(("backward", next_b))
            next_b += 1
            if next_f < microbatches:
                order.append(("forward", next_f))
                next_f += 1
        orders.append(order)
    return orders


def replay_1f1b(
    table: dict[tuple[int, str], dict[int, tuple[float, float]]],
    stages: int,
    microbatches: int,
    p_block_w: float,
    frequency_of: dict[tuple[int, str, int], int],
) -> tuple[float, float]:
    """Real (iteration time s, energy J) of a 1F1B plan on the raw profile values.

    `frequency_of[(stage, kind, microbatch)]` is the clock of each instruction. The iteration time
    is the longest path of the DAG (stage order, F(s,j) -> F(s+1,j), B(s+1,j) -> B(s,j)).
    """
    orders = _background_1f1b_order(stages, microbatches)
    finish: dict[tuple[int, str, int], float] = {}
    position = [0] * stages
    busy = 0.0
    compute_energy = 0.0
    remaining = sum(len(o) for o in orders)
    # Sweep stages round-robin, running each stage's next instruction once its cross-stage
    # dependency has finished; 1F1B is deadlock-free, so this terminates.
    while remaining:
        progressed = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                kind, j = orders[s][position[s]]
                if kind == "forward":
                    dep = (s - 1, "forward", j) if s > 0 else None
                else:
                    dep = (s + 1, "backward", j) if s < stages - 1 else None
                if dep is not None and dep not in finish:
                    break
                t, e = table[(s, kind)][frequency_of[(s, kind, j)]]
                prev = finish[(s, *orders[s][position[s] - 1])] if position[s] else 0.0
                start = max(prev, finish[dep] if dep is not None else 0.0)
                finish[(s, kind, j)] = start + t
                busy += t
                compute_energy += e
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("1F1B order deadlocked; the schedule is malformed")
    iteration_s = max(finish.values())
    return iteration_s, compute_energy + p_block_w * (stages * iteration_s - busy)


def run_lowtime(
    profile_csv: str,
    p_block_w: float,
    stages: int,
    microbatches: int,
    unit_time_s: float = 1e-3,
) -> dict[str, Any]:
    """Run lowtime's whole 1F1B frontier on a Zeus CSV profile and replay its fastest plan.

    Returns a dict with:
        points: frontier points lowtime yields (one per quantized time step).
        seconds: spec fitting, DAG construction and the Phillips-Dessouky run (CSV parsing and
            the replay excluded).
        peak_mb: ru_maxrss growth of this process during that work, MiB (meaningful in a fresh
            process); rss_mb: the process's ru_maxrss at the end, MiB.
        instructions: instructions in the DAG.
        stated_time_s, stated_energy_j: lowtime's own figures at its fastest point (quantized
            time x tau; fitted cost model plus blocking power).
        reached_min_time: that point is lowtime's quantized all-fastest time (no early stop).
        fastest_time_s, fastest_energy_j: that plan replayed on the raw profile values.
        all_fastest_time_s, all_fastest_energy_j: every instruction at its minimum-time
            option, replayed.
        saving_no_slowdown: 1 - fastest_energy_j / all_fastest_energy_j.
        order_matches_background: lowtime's 1F1B order equals BACKGROUND.md's.
    """
    import networkx as nx
    from lowtime.cost_model import ExponentialModel
    from lowtime.graph_utils import DependencyResolver, add_sink_node, add_source_node
    from lowtime.operation import (
        CandidateExecutionOptions,
        ExecutionOption,
        OperationSpec,
    )
    from lowtime.perseus.instruction import (
        Backward,
        Forward,
        Instruction,
        backward_dep,
        forward_dep,
    )
    from lowtime.perseus.schedule import Synchronous1F1B
    from lowtime.solver import PhillipsDessouky

    table = _read_profile(profile_csv)
    rss_before = _peak_rss_mib()
    started = time.perf_counter()

    # 1-2. Operation specs per stage and instruction type, cost = effective computation energy.
    op_spec_map: dict[int, dict[type[Instruction], OperationSpec[int]]] = {}
    for stage_id in range(stages):
        op_spec_map[stage_id] = {}
        for instruction in (Forward, Backward):
            rows = table[(stage_id, instruction.__name__.lower())]
            options = [
                ExecutionOption[int](real_time=t, unit_time=unit_time_s, cost=e, knob=freq)
                for freq, (t, e) in rows.items()
            ]
            cand = CandidateExecutionOptions[int](options=options)
            effective = [
                ExecutionOption[int](
                    real_time=o.quant_time * unit_time_s,
                    unit_time=unit_time_s,
                    cost=o.cost - p_block_w * o.quant_time * unit_time_s,
                    knob=o.knob,
                )
                for o in cand.options
            ]
            cand = CandidateExecutionOptions[int](options=effective)
            op_spec_map[stage_id][instruction] = OperationSpec[int](
                options=cand, cost_model=ExponentialModel(cand)
            )

    # 3. The activity-on-node DAG; 0 and 1 are reserved for the dummy source and sink.
    dag = nx.DiGraph()
    node_id = 2
    lowtime_orders: list[list[tuple[str, int]]] = []
    for stage_id in range(stages):
        stage_node_ids = []
        order = []
        for inst in Synchronous1F1B(stages, microbatches, stage_id, op_spec_map[stage_id]):
            dag.add_node(node_id, op=inst)
            stage_node_ids.append(node_id)
            order.append((type(inst).__name__.lower(), inst.micro_batch_id))
            node_id += 1
        lowtime_orders.append(order)
        for a, b in itertools.pairwise(stage_node_ids):
            dag.add_edge(a, b)
    resolver = DependencyResolver(
        dependency_rules=[forward_dep, backward_dep], node_type=Instruction
    )
    for (n1, a1), (n2, a2) in itertools.product(dag.nodes(data=True), repeat=2):
        if resolver.is_dependent(a1["op"], a2["op"]):
            dag.add_edge(n1, n2)
    add_source_node(dag, 0)
    add_sink_node(dag, 1)
    dag.graph["source_node"] = 0
    dag.graph["sink_node"] = 1
    instructions = [(node, op) for node, op in dag.nodes(data="op") if not op.is_dummy]

    # 4. The frontier. Operations are mutated in place, and a run that ends on an operation at
    # its speed limit may have half-applied its last step, so snapshot knobs at every yield.
    points = 0
    best_quant = None
    best_cost = 0.0
    best_knobs: dict[tuple[int, str, int], int] = {}
    for result in PhillipsDessouky(dag).run():
        points += 1
        if best_quant is None or result.quant_time < best_quant:
            best_quant = result.quant_time
            best_cost = result.cost
            best_knobs = {
                (op.stage_id, type(op).__name__.lower(), op.micro_batch_id): op.assigned_knob
                for _, op in instructions
            }
    seconds = time.perf_counter() - started
    rss_after = _peak_rss_mib()

    if best_quant is None:
        raise ValueError("lowtime yielded no frontier point")

    # lowtime's own quantized all-fastest time, to tell whether its run reached the end.
    quant_table = {}
    quickest_of = {}
    for s in range(stages):
        for instruction, spec in op_spec_map[s].items():
            kind = instruction.__name__.lower()
            quant_table[(s, kind)] = {
                o.knob: (o.quant_time * unit_time_s, 0.0) for o in spec.options.options
            }
            knob = min(spec.options.options, key=lambda o: o.quant_time).knob
            quickest_of.update({(s, kind, j): knob for j in range(microbatches)})
    quant_min_t, _ = replay_1f1b(quant_table, stages, microbatches, 0.0, quickest_of)

    fastest_of = {
        (s, kind, j): min(table[(s, kind)], key=lambda f, s=s, kind=kind: table[(s, kind)][f][0])
        for s in range(stages)
        for kind, j in _background_1f1b_order(stages, microbatches)[s]
    }
    base_t, base_e = replay_1f1b(table, stages, microbatches, p_block_w, fastest_of)
    fast_t, fast_e = replay_1f1b(table, stages, microbatches, p_block_w, best_knobs)
    stated_t = best_quant * unit_time_s
    return {
        "points": points,
        "seconds": seconds,
        "peak_mb": rss_after - rss_before,
        "peak_mb_kind": "ru_maxrss delta",
        "rss_mb": rss_after,
        "instructions": len(instructions),
        "stated_time_s": stated_t,
        "stated_energy_j": best_cost + p_block_w * stages * stated_t,
        "reached_min_time": abs(stated_t - quant_min_t) < unit_time_s / 2,
        "fastest_time_s": fast_t,
        "fastest_energy_j": fast_e,
        "all_fastest_time_s": base_t,
        "all_fastest_energy_j": base_e,
        "saving_no_slowdown": 1.0 - fast_e / base_e,
        "order_matches_background": lowtime_orders == _background_1f1b_order(stages, microbatches),
    }


def run_lowtime_subprocess(
    profile_csv: str,
    p_block_w: float,
    stages: int,
    microbatches: int,
    unit_time_s: float = 1e-3,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """`run_lowtime` in a fresh Python process (so peak_mb is its own) with a wall-clock limit.

    Returns the dict, or {"error": "..."} on a timeout or a failure.
    """
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--json",
        "--profile",
        profile_csv,
        "--p-block-w",
        repr(p_block_w),
        "--stages",
        str(stages),
        "--microbatches",
        str(microbatches),
        "--unit-time-s",
        repr(unit_time_s),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {last}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profile",
        default="bloom+a100_sxm_bf16.csv",
        help="CSV path, or a name under ../shared/data/profiles",
    )
    parser.add_argument("--p-block-w", type=float, default=83.64)
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=12)
    parser.add_argument("--unit-time-s", type=float, default=1e-3)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    path = Path(args.profile)
    if not path.exists():
        path = PROFILES_DIR / args.profile
    out = run_lowtime(str(path), args.p_block_w, args.stages, args.microbatches, args.unit_time_s)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>24}: {value}")


if __name__ == "__main__":
    main()
