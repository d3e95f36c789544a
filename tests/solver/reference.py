"""Slow, obviously-correct references for the solver tests.

Nothing here imports :mod:`perseus`: every reference is rebuilt from
``../shared/docs/BACKGROUND.md``, so the tests compare the solver against an independent reading
of the rules.

- Schedules: 1F1B (DeepSpeed/Megatron), GPipe, Megatron's interleaved 1F1B.
- DAG: consecutive instructions of one GPU in order; ``F(u, j) -> F(u+1, j)``;
  ``B(u+1, j) -> B(u, j)``; ``F(U-1, j) -> B(U-1, j)``, where ``u = chunk * S + gpu`` is the
  virtual stage (Megatron's placement) and ``U = S * V``.
- Replay: longest path by a plain topological pass; ``E = sum e_i + P_block * (S*T - sum t_i)``.
- Replay with a clock-change margin ``m``: between consecutive instructions on a GPU (its last,
  then its first of the next iteration) whose clocks differ, the one with the lower clock runs
  ``m`` seconds next to that boundary at the higher clock (a raise lands ``m`` early, a lowering
  ``m`` late), at its own kind's measurement there (else at its nearest measured clock, the
  higher of two). It runs ``x`` seconds at its own pace and ``m`` at each higher neighbour's,
  ``x / t + sum m / t_h = 1``, drawing ``e / t`` then ``e_h / t_h`` watts; if no ``x >= 0``
  fits, it runs only at the higher clocks, the same ``s`` seconds at each,
  ``sum s / t_h = 1``.
- Brute force over every plan of a tiny case, and an independent MILP for small ones.

An order is a list (per GPU) of ``(kind, microbatch, chunk)`` tuples. A table maps
``(stage, kind, frequency_mhz) -> (time_s, energy_j)``; with ``V`` chunks per GPU each chunk's
instruction costs ``1/V`` of the stage's time and energy.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import numpy as np

F, B = "forward", "backward"
Inst = tuple[str, int, int]
Order = list[list[Inst]]
Table = Mapping[tuple[int, str, int], tuple[float, float]]


# ----------------------------------------------------------------------------- schedules


def order_1f1b(stages: int, microbatches: int) -> Order:
    """Stage ``s`` runs ``min(S - s, M)`` forwards, then alternates backward, forward."""
    order = []
    for s in range(stages):
        warmup = min(stages - s, microbatches)
        seq: list[Inst] = [(F, j, 0) for j in range(warmup)]
        for j in range(microbatches):
            seq.append((B, j, 0))
            if warmup + j < microbatches:
                seq.append((F, warmup + j, 0))
        order.append(seq)
    return order


def order_gpipe(stages: int, microbatches: int) -> Order:
    """All forwards, then all backwards, microbatch ascending (torch ``ScheduleGPipe``)."""
    seq = [(F, j, 0) for j in range(microbatches)] + [(B, j, 0) for j in range(microbatches)]
    return [list(seq) for _ in range(stages)]


def order_interleaved(stages: int, microbatches: int, chunks: int) -> Order:
    """Megatron-core 0.16 ``forward_backward_pipelining_with_interleaving``.

    Transcribed from ``get_schedule_table`` and ``get_pp_rank_microbatches`` with the default
    ``microbatch_group_size_per_vp_stage = pipeline_parallel_size``: the k-th forward runs
    ``table[k]``, the k-th backward the same microbatch on the mirrored chunk; rank ``r`` runs
    ``min(2 * (S - r - 1) + (V - 1) * S, M * V)`` warm-up forwards, then forward/backward pairs,
    then the remaining backwards.
    """
    group = stages
    table: list[tuple[int, int]] = []
    for low in range(0, microbatches, group):
        high = microbatches if low + group >= microbatches else low + group
        table.extend((mb, c) for c in range(chunks) for mb in range(low, high))
    total = microbatches * chunks
    forwards = [(F, mb, c) for mb, c in table]
    backwards = [(B, mb, chunks - 1 - c) for mb, c in table]
    order = []
    for rank in range(stages):
        warmup = min(2 * (stages - rank - 1) + (chunks - 1) * stages, total)
        seq = forwards[:warmup]
        for k in range(total - warmup):
            seq += [forwards[warmup + k], backwards[k]]
        seq += backwards[total - warmup :]
        order.append(seq)
    return order


def reference_order(name: str, stages: int, microbatches: int, chunks: int = 1) -> Order:
    if name == "1f1b":
        return order_1f1b(stages, microbatches)
    if name == "gpipe":
        return order_gpipe(stages, microbatches)
    if name == "interleaved-1f1b":
        return order_interleaved(stages, microbatches, chunks)
    raise ValueError(name)


def as_tuples(order: Sequence[Sequence[object]]) -> Order:
    """Turn a perseus ``Schedule.order`` (Instruction objects) into reference tuples."""
    return [
        [(inst.kind, inst.microbatch, inst.chunk) for inst in seq]  # type: ignore[attr-defined]
        for seq in order
    ]


# ----------------------------------------------------------------------------- DAG


@dataclass(frozen=True)
class Dag:
    """Nodes ``(gpu, position)``; ``preds[n]`` lists predecessors; ``topo`` a topological order."""

    order: Order
    chunks: int
    nodes: list[tuple[int, int]]
    preds: dict[tuple[int, int], list[tuple[int, int]]]
    topo: list[tuple[int, int]]


def dag_edges(order: Order, chunks: int) -> tuple[list[tuple[int, int]], list[tuple]]:
    """Nodes and edges implied by an order and BACKGROUND.md's rules (raises on a missing dep)."""
    stages = len(order)
    last = stages * chunks - 1
    where: dict[tuple[str, int, int], tuple[int, int]] = {}
    nodes = []
    for g, seq in enumerate(order):
        for k, (kind, mb, c) in enumerate(seq):
            key = (kind, c * stages + g, mb)
            if key in where:
                raise ValueError(f"duplicate instruction {key}")
            where[key] = (g, k)
            nodes.append((g, k))
    edges = []
    for g, seq in enumerate(order):
        edges += [((g, k - 1), (g, k)) for k in range(1, len(seq))]
    for (kind, u, mb), node in where.items():
        if kind == F and u > 0:
            edges.append((where[(F, u - 1, mb)], node))
        elif kind == B and u < last:
            edges.append((where[(B, u + 1, mb)], node))
        elif kind == B and u == last:
            edges.append((where[(F, u, mb)], node))
    return nodes, edges


def nx_graph(order: Order, chunks: int) -> nx.DiGraph:
    nodes, edges = dag_edges(order, chunks)
    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    return graph


def build_dag(order: Order, chunks: int) -> Dag:
    """Plain Kahn topological sort (no networkx), so the replay depends on nothing shared."""
    nodes, edges = dag_edges(order, chunks)
    preds: dict[tuple[int, int], list[tuple[int, int]]] = {n: [] for n in nodes}
    succs: dict[tuple[int, int], list[tuple[int, int]]] = {n: [] for n in nodes}
    for a, b in edges:
        preds[b].append(a)
        succs[a].append(b)
    indeg = {n: len(p) for n, p in preds.items()}
    ready = [n for n in nodes if indeg[n] == 0]
    topo = []
    while ready:
        n = ready.pop()
        topo.append(n)
        for m in succs[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    if len(topo) != len(nodes):
        raise ValueError("cyclic")
    return Dag(order, chunks, nodes, preds, topo)


# ----------------------------------------------------------------------------- replay


def durations(
    table: Table, dag: Dag, frequencies: Sequence[Sequence[int]]
) -> dict[tuple[int, int], tuple[float, float]]:
    """Time and energy of every node under a plan (KeyError if a clock was not measured)."""
    out = {}
    for g, seq in enumerate(dag.order):
        if len(frequencies[g]) != len(seq):
            raise ValueError(f"GPU {g}: {len(frequencies[g])} clocks for {len(seq)} instructions")
        for k, (kind, _mb, _c) in enumerate(seq):
            t, e = table[(g, kind, int(frequencies[g][k]))]
            out[(g, k)] = (t / dag.chunks, e / dag.chunks)
    return out


def longest_path(dag: Dag, time_of: Mapping[tuple[int, int], float]) -> float:
    finish: dict[tuple[int, int], float] = {}
    for n in dag.topo:
        start = max((finish[p] for p in dag.preds[n]), default=0.0)
        finish[n] = start + time_of[n]
    return max(finish.values())


def timeline(
    dag: Dag, time_of: Mapping[tuple[int, int], float], rtol: float = 1e-9
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], bool]]:
    """As-soon-as-possible start of every node, and whether it lies on a longest path.

    A node is critical when the longest path into it plus the longest path out of it (both
    including itself once) equals the iteration time.
    """
    start: dict[tuple[int, int], float] = {}
    finish: dict[tuple[int, int], float] = {}
    for n in dag.topo:
        start[n] = max((finish[p] for p in dag.preds[n]), default=0.0)
        finish[n] = start[n] + time_of[n]
    total = max(finish.values())
    succs: dict[tuple[int, int], list[tuple[int, int]]] = {n: [] for n in dag.topo}
    for n in dag.topo:
        for p in dag.preds[n]:
            succs[p].append(n)
    tail: dict[tuple[int, int], float] = {}  # longest path from the node's start to the end
    for n in reversed(dag.topo):
        tail[n] = time_of[n] + max((tail[m] for m in succs[n]), default=0.0)
    critical = {n: abs(start[n] + tail[n] - total) <= rtol * max(total, 1.0) for n in dag.topo}
    return start, critical


def replay(
    table: Table, dag: Dag, p_block_w: float, frequencies: Sequence[Sequence[int]]
) -> tuple[float, float]:
    """(iteration time, energy) of a plan: E = sum e + P_block * (S * T - sum t)."""
    te = durations(table, dag, frequencies)
    time = longest_path(dag, {n: t for n, (t, _e) in te.items()})
    busy = math.fsum(t for t, _e in te.values())
    energy = math.fsum(e for _t, e in te.values()) + p_block_w * (len(dag.order) * time - busy)
    return time, energy


def with_margin(
    table: Table, dag: Dag, frequencies: Sequence[Sequence[int]], margin: float
) -> dict[tuple[int, int], tuple[float, float]]:
    """Time and energy of every node when each clock change lets the lower-clocked
    instruction of its pair run ``margin`` seconds next to the boundary at the higher clock."""
    own = durations(table, dag, frequencies)
    out = {}
    for g, seq in enumerate(dag.order):
        for k, (kind, _mb, _c) in enumerate(seq):
            t, e = own[(g, k)]
            here = int(frequencies[g][k])
            neighbours = (int(frequencies[g][k - 1]), int(frequencies[g][(k + 1) % len(seq)]))
            measured = [f for (s, kd, f) in table if s == g and kd == kind]
            higher = []  # (time, energy) at each higher neighbour's clock
            for there in neighbours:
                if there > here and margin > 0:
                    near = sorted(measured, key=lambda f: (abs(f - there), -f))[0]
                    higher.append(tuple(v / dag.chunks for v in table[(g, kind, near)]))
            x = t * (1 - sum(margin / th for th, _eh in higher))  # seconds at its own clock
            if x > 0:
                out[(g, k)] = (
                    x + margin * len(higher),
                    x * e / t + sum(margin * eh / th for th, eh in higher),
                )
            else:
                s = 1 / sum(1 / th for th, _eh in higher)  # seconds at each higher clock
                out[(g, k)] = (s * len(higher), sum(s * eh / th for th, eh in higher))
    return out


def replay_with_margin(
    table: Table, dag: Dag, p_block_w: float, frequencies: Sequence[Sequence[int]], margin: float
) -> tuple[float, float, dict[tuple[int, int], float]]:
    """(iteration time, energy, every node's duration) with clock changes ``margin`` early."""
    te = with_margin(table, dag, frequencies, margin)
    time_of = {n: t for n, (t, _e) in te.items()}
    time = longest_path(dag, time_of)
    busy = math.fsum(time_of.values())
    energy = math.fsum(e for _t, e in te.values()) + p_block_w * (len(dag.order) * time - busy)
    return time, energy, time_of


def options_of(table: Table, stage: int, kind: str) -> list[tuple[int, float, float]]:
    """(frequency, time, energy) of every measured option, frequency descending."""
    return sorted(
        ((f, t, e) for (s, k, f), (t, e) in table.items() if s == stage and k == kind),
        reverse=True,
    )


def all_fastest_time(table: Table, dag: Dag) -> float:
    """Longest path with every instruction at its minimum-time option."""
    fastest = {
        n: min(t for _f, t, _e in options_of(table, n[0], dag.order[n[0]][n[1]][0])) / dag.chunks
        for n in dag.nodes
    }
    return longest_path(dag, fastest)


# ----------------------------------------------------------------------------- brute force


@dataclass(frozen=True)
class BruteForce:
    """Every plan's (time, energy); ``best(deadline)`` is the least energy of plans that fit."""

    times: np.ndarray
    energies: np.ndarray
    _sorted_times: np.ndarray
    _prefix_min: np.ndarray

    @property
    def t_min(self) -> float:
        return float(self._sorted_times[0])

    @property
    def e_min(self) -> float:
        return float(self._prefix_min[-1])

    def best(self, deadline: float, rtol: float = 1e-9) -> float:
        k = int(np.searchsorted(self._sorted_times, deadline * (1 + rtol), side="right"))
        if k == 0:
            return math.inf
        return float(self._prefix_min[k - 1])


def count_plans(table: Table, dag: Dag) -> int:
    return math.prod(len(options_of(table, g, dag.order[g][k][0])) for g, k in dag.nodes)


def brute_force(table: Table, dag: Dag, p_block_w: float) -> BruteForce:
    """Enumerate every per-instruction plan (vectorised over plans, plain topological pass)."""
    index = {n: i for i, n in enumerate(dag.nodes)}
    per_node = [options_of(table, g, dag.order[g][k][0]) for g, k in dag.nodes]
    grids = np.stack(
        [a.ravel() for a in np.meshgrid(*[np.arange(len(o)) for o in per_node], indexing="ij")]
    )  # (n, P)
    t = np.stack([np.array([o[1] for o in opts])[grids[i]] for i, opts in enumerate(per_node)])
    e = np.stack([np.array([o[2] for o in opts])[grids[i]] for i, opts in enumerate(per_node)])
    t = t / dag.chunks
    e = e / dag.chunks
    finish: dict[tuple[int, int], np.ndarray] = {}
    for n in dag.topo:
        start = np.zeros(t.shape[1])
        for p in dag.preds[n]:
            start = np.maximum(start, finish[p])
        finish[n] = start + t[index[n]]
    time = np.max(np.stack(list(finish.values())), axis=0)
    energy = e.sum(axis=0) + p_block_w * (len(dag.order) * time - t.sum(axis=0))
    order = np.argsort(time, kind="stable")
    return BruteForce(time, energy, time[order], np.minimum.accumulate(energy[order]))


# ----------------------------------------------------------------------------- MILP


def milp_min_energy(
    table: Table, dag: Dag, p_block_w: float, deadline: float | None = None
) -> tuple[float, float, list[list[int]]] | None:
    """Least-energy plan with time <= deadline, by an MILP written from scratch.

    Variables: one binary per (node, option), a start time per node, the iteration time T.
    Minimise sum (e - P t) x + P S T subject to one option per node, precedence and
    finish <= T <= deadline.

    Returns:
        (time, energy) of the optimal plan replayed exactly, and its clocks; None if infeasible.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    per_node = [options_of(table, g, dag.order[g][k][0]) for g, k in dag.nodes]
    index = {n: i for i, n in enumerate(dag.nodes)}
    n_nodes = len(per_node)
    offs = np.cumsum([0] + [len(o) for o in per_node])
    n_x = int(offs[-1])
    n_var = n_x + n_nodes + 1
    t_var = n_var - 1
    stages = len(dag.order)
    c = np.zeros(n_var)
    for i, opts in enumerate(per_node):
        for k, (_f, t, e) in enumerate(opts):
            c[offs[i] + k] = (e - p_block_w * t) / dag.chunks
    c[t_var] = p_block_w * stages
    rows, lo, hi = [], [], []

    def row() -> np.ndarray:
        return np.zeros(n_var)

    for i in range(n_nodes):  # exactly one option
        r = row()
        r[offs[i] : offs[i + 1]] = 1
        rows.append(r)
        lo.append(1)
        hi.append(1)
    for n in dag.nodes:  # start_b >= start_a + dur_a ; T >= start_n + dur_n
        b = index[n]
        for p in dag.preds[n]:
            a = index[p]
            r = row()
            r[n_x + b] = 1
            r[n_x + a] = -1
            for k, (_f, t, _e) in enumerate(per_node[a]):
                r[offs[a] + k] = -t / dag.chunks
            rows.append(r)
            lo.append(0)
            hi.append(np.inf)
        r = row()
        r[t_var] = 1
        r[n_x + b] = -1
        for k, (_f, t, _e) in enumerate(per_node[b]):
            r[offs[b] + k] = -t / dag.chunks
        rows.append(r)
        lo.append(0)
        hi.append(np.inf)
    integrality = np.zeros(n_var)
    integrality[:n_x] = 1
    upper = np.full(n_var, np.inf)
    upper[:n_x] = 1
    if deadline is not None:
        upper[t_var] = deadline
    res = milp(
        c,
        constraints=LinearConstraint(np.array(rows), lo, hi),
        integrality=integrality,
        bounds=Bounds(np.zeros(n_var), upper),
        options={"mip_rel_gap": 1e-9},
    )
    if res.status != 0:
        return None
    plan = [[0] * len(seq) for seq in dag.order]
    for i, (g, k) in enumerate(dag.nodes):
        choice = int(np.argmax(res.x[offs[i] : offs[i + 1]]))
        plan[g][k] = per_node[i][choice][0]
    time, energy = replay(table, dag, p_block_w, plan)
    return time, energy, plan


# ----------------------------------------------------------------------------- files


def read_csv_table(path: Path) -> dict[tuple[int, str, int], tuple[float, float]]:
    """A Zeus CSV as a reference table (no validation: for known-good shared profiles)."""
    with path.open(newline="") as fh:
        return {
            (int(r["stage"]), r["instruction"], int(r["frequency"])): (
                float(r["time"]),
                float(r["energy"]),
            )
            for r in csv.DictReader(fh)
        }
