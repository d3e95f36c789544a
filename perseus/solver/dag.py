"""The computation DAG of one training iteration, as flat typed arrays.

Nodes are the schedule's instructions, numbered GPU by GPU in execution order. Every node has
at most two predecessors (the previous instruction on its GPU and its data dependency, see
:mod:`perseus.solver.schedules`), so predecessors are stored as two index arrays padded with a
sentinel node that finishes at time 0. That keeps the longest-path passes plain vectorised numpy
over many plans at once.
"""

from __future__ import annotations

import graphlib
import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.core.errors import ScheduleError
from perseus.solver.schedules import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    KINDS,
    InstructionKind,
    Schedule,
)

__all__ = ["PipelineDag", "build_dag"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PipelineDag:
    """A schedule's DAG.

    Attributes:
        schedule: The schedule it was built from.
        gpu: GPU of each node.
        kind: The kind's position in :data:`~perseus.solver.schedules.KINDS`: 0 forward,
            1 backward, 2 backward_input, 3 backward_weight.
        cost_class: ``K * gpu + k`` for the ``k``-th of the ``K`` kinds the schedule runs
            (``schedule.kinds``; ``2 * gpu + kind`` for forward/backward schedules): nodes of
            one class share one profile entry.
        pred: ``(n, 2)`` predecessor indices; ``n`` (the sentinel) where there is none.
        succ: ``(n, 2)`` successor indices; ``n`` where there is none.
        topo: Nodes in a topological order.
        offsets: ``offsets[g]`` is the first node of GPU ``g``; ``offsets[-1] == n``.
        levels: The nodes grouped by their longest chain of predecessors (sources first):
            the nodes of one level do not depend on each other, so a longest-path pass
            handles a whole level with one vectorised step.
        back_levels: The same by the longest chain of successors (sinks first).
    """

    schedule: Schedule
    gpu: IntArray
    kind: IntArray
    cost_class: IntArray
    pred: IntArray
    succ: IntArray
    topo: IntArray
    offsets: IntArray
    levels: tuple[IntArray, ...]
    back_levels: tuple[IntArray, ...]

    @property
    def size(self) -> int:
        """Number of instructions."""
        return int(self.gpu.shape[0])

    @property
    def sinks(self) -> IntArray:
        """Nodes without successors."""
        return np.flatnonzero((self.succ == self.size).all(axis=1))

    def finish_times(self, durations: FloatArray) -> FloatArray:
        """Earliest finish time of every node, for one plan or many.

        Args:
            durations: ``(n,)`` or ``(n, P)`` instruction durations (P plans side by side).

        Returns:
            Finish times of the same shape. O(n * P).
        """
        finish = np.zeros((self.size + 1, *durations.shape[1:]))
        pred = self.pred
        for level in self.levels:
            finish[level] = (
                np.maximum(finish[pred[level, 0]], finish[pred[level, 1]]) + durations[level]
            )
        return finish[:-1]

    def latest_starts(self, durations: FloatArray, deadline: FloatArray | float) -> FloatArray:
        """Latest start time of every node such that everything finishes by ``deadline``."""
        start = np.empty((self.size + 1, *durations.shape[1:]))
        start[-1] = deadline
        succ = self.succ
        for level in self.back_levels:
            start[level] = (
                np.minimum(start[succ[level, 0]], start[succ[level, 1]]) - durations[level]
            )
        return start[:-1]

    def iteration_time(self, durations: FloatArray) -> FloatArray:
        """Longest path length (iteration time) for one plan or many."""
        return np.asarray(self.finish_times(durations).max(axis=0))

    def critical(self, durations: FloatArray, rtol: float = 1e-9) -> npt.NDArray[np.bool_]:
        """Nodes on a longest path of a single plan (``durations`` of shape ``(n,)``)."""
        finish = self.finish_times(durations)
        total = float(finish.max())
        latest = self.latest_starts(durations, total) + durations
        return np.asarray(np.abs(latest - finish) <= rtol * max(total, 1.0))


def build_dag(schedule: Schedule) -> PipelineDag:
    """Build and check the DAG of ``schedule``.

    The edges are each GPU's order plus the data dependencies of
    :mod:`perseus.solver.schedules`. ``backward_input -> backward_weight`` of one stage and
    microbatch is an edge of the GPU's order already (both run where the stage runs), so it is
    checked, not added: no node then has more than two predecessors or successors.

    Args:
        schedule: Per-GPU instruction order.

    Returns:
        The DAG, in O(n) (the acyclicity check is the standard library's topological sort).

    Raises:
        ScheduleError: Instructions missing or repeated (named), a ``backward_weight`` before
            its ``backward_input``, or an order that deadlocks (the cycle's actions named).
    """
    stages, microbatches = schedule.stages, schedule.microbatches
    model_stages = stages * schedule.virtual_stages
    last_virtual = model_stages - 1
    class_of = {kind: k for k, kind in enumerate(schedule.kinds)}
    index: dict[tuple[InstructionKind, int, int], int] = {}
    gpu: list[int] = []
    kind: list[int] = []
    offsets = [0]
    for g, seq in enumerate(schedule.order):
        for inst in seq:
            key = (inst.kind, schedule.virtual_stage(g, inst), inst.microbatch)
            if key in index:
                raise ScheduleError(f"GPU {g} runs {_name(key)} twice")
            if key[2] >= microbatches:
                raise ScheduleError(
                    f"GPU {g} runs {_name(key)} but the schedule has {microbatches} microbatches"
                )
            index[key] = len(gpu)
            gpu.append(g)
            kind.append(KINDS.index(inst.kind))
        offsets.append(len(gpu))
    n = len(gpu)
    _check_complete(index, model_stages, microbatches)

    def gradient(u: int, j: int) -> int | None:
        """The node that hands stage ``u - 1`` its input gradient of microbatch ``j``."""
        found = index.get((BACKWARD, u, j))
        return found if found is not None else index.get((BACKWARD_INPUT, u, j))

    pred = np.full((n, 2), n, dtype=np.int64)
    edges: list[tuple[int, int]] = []
    for g in range(stages):
        edges.extend((j - 1, j) for j in range(offsets[g] + 1, offsets[g + 1]))
    for (name, u, j), node in index.items():
        if name == FORWARD:
            source = index.get((FORWARD, u - 1, j)) if u > 0 else None
        elif name == BACKWARD_WEIGHT:
            if index[BACKWARD_INPUT, u, j] > node:
                raise ScheduleError(
                    f"GPU {gpu[node]} runs {_name((name, u, j))} before "
                    f"{_name((BACKWARD_INPUT, u, j))}"
                )
            continue
        elif u == last_virtual:
            source = index.get((FORWARD, u, j))
        else:
            source = gradient(u + 1, j)
        if source is not None:
            edges.append((source, node))
    if schedule.overlapped:
        edges = _send_with_backward(schedule, edges, offsets, gpu)

    graph: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for j in range(n):
        graph.add(j)
    for a, b in edges:
        graph.add(b, a)
    try:
        topo = np.fromiter(graph.static_order(), dtype=np.int64, count=n)
    except graphlib.CycleError as err:
        # err.args[1] lists the cycle's nodes, each a predecessor of the next, the first again
        # at the end
        names = {node: f"GPU {gpu[node]} {_name(key)}" for key, node in index.items()}
        cycle = [names[v] for v in err.args[1]]
        shown = " -> ".join(cycle if len(cycle) <= 9 else [*cycle[:8], "..."])
        raise ScheduleError(
            f"the schedule deadlocks: dependency cycle (each must finish before the next "
            f"starts): {shown}"
        ) from None
    succ = np.full((n, 2), n, dtype=np.int64)
    pred_count = np.zeros(n, dtype=np.int64)
    succ_count = np.zeros(n, dtype=np.int64)
    for a, b in set(edges):
        if pred_count[b] == 2 or succ_count[a] == 2:
            raise ScheduleError("an instruction has more than two dependencies")
        pred[b, pred_count[b]] = a
        succ[a, succ_count[a]] = b
        pred_count[b] += 1
        succ_count[a] += 1
    depth = np.zeros(n + 1, dtype=np.int64)  # the sentinel n stays at 0
    for j in topo:
        depth[j] = max(depth[pred[j, 0]], depth[pred[j, 1]]) + 1
    height = np.zeros(n + 1, dtype=np.int64)
    for j in topo[::-1]:
        height[j] = max(height[succ[j, 0]], height[succ[j, 1]]) + 1
    gpu_arr = np.asarray(gpu, dtype=np.int64)
    kind_arr = np.asarray(kind, dtype=np.int64)
    local = np.asarray([class_of[KINDS[k]] for k in kind], dtype=np.int64)
    return PipelineDag(
        schedule=schedule,
        gpu=gpu_arr,
        kind=kind_arr,
        cost_class=len(class_of) * gpu_arr + local,
        pred=pred,
        succ=succ,
        topo=topo,
        offsets=np.asarray(offsets, dtype=np.int64),
        levels=_group(depth[:n]),
        back_levels=_group(height[:n]),
    )


def _send_with_backward(
    schedule: Schedule, edges: list[tuple[int, int]], offsets: list[int], gpu: list[int]
) -> list[tuple[int, int]]:
    """The edges with each overlapped forward's output leaving with its backward's.

    Torch runs an ``OVERLAP_F_B`` action's halves one after the other and sends both outputs
    after the whole action (``_add_send_recv`` puts the sends after it), so a forward's
    consumer on another GPU waits for the backward issued with it too: its edge leaves from
    the backward. Edges implied by others are dropped, so that no node gets more than two
    successors: the backward's edges to later instructions of its own GPU (its GPU's order
    implies them) and, of its edges to one other GPU, all but the one to the earliest there
    (that GPU's order implies the rest). Every path keeps its length. O(edges).

    Raises:
        ScheduleError: An overlapped position that is not a forward followed by a full
            backward on its GPU.
    """
    moved: dict[int, int] = {}  # forward node -> the backward issued with it
    for g, k in schedule.overlapped:
        seq = schedule.order[g] if 0 <= g < schedule.stages else ()
        if not (0 <= k < len(seq) - 1 and seq[k].kind == FORWARD and seq[k + 1].kind == BACKWARD):
            raise ScheduleError(
                f"overlapped: GPU {g} position {k} is not a forward followed by a full backward"
            )
        moved[offsets[g] + k] = offsets[g] + k + 1
    backwards = set(moved.values())
    kept: list[tuple[int, int]] = []
    leaving: dict[int, dict[int, int]] = {}  # backward -> other GPU -> its earliest consumer
    for a, b in edges:
        source = moved.get(a, a) if gpu[b] != gpu[a] else a
        if source not in backwards or b == source + 1:
            kept.append((source, b))
        elif gpu[b] != gpu[source]:
            first = leaving.setdefault(source, {})
            first[gpu[b]] = min(first.get(gpu[b], b), b)
        # else: a later instruction of the backward's own GPU, implied by its order
    kept.extend((a, b) for a, firsts in leaving.items() for b in firsts.values())
    return kept


def _name(key: tuple[InstructionKind, int, int]) -> str:
    kind, stage, microbatch = key
    return f"{kind} {microbatch} of stage {stage}"


def _check_complete(
    index: dict[tuple[InstructionKind, int, int], int], model_stages: int, microbatches: int
) -> None:
    """Every stage and microbatch runs one forward and one backward, whole or split."""
    problems: list[str] = []
    for u in range(model_stages):
        for j in range(microbatches):
            has = {kind for kind in KINDS if (kind, u, j) in index}
            if FORWARD not in has:
                problems.append(f"no {_name((FORWARD, u, j))}")
            split = has & {BACKWARD_INPUT, BACKWARD_WEIGHT}
            if BACKWARD in has and split:
                problems.append(f"both {_name((BACKWARD, u, j))} and {' and '.join(sorted(split))}")
            elif BACKWARD not in has and len(split) < 2:
                missing = (
                    [BACKWARD]
                    if not split
                    else [k for k in (BACKWARD_INPUT, BACKWARD_WEIGHT) if k not in split]
                )
                problems.extend(f"no {_name((k, u, j))}" for k in missing)
    if problems:
        shown = "; ".join(problems[:6]) + (
            f"; and {len(problems) - 6} more" if len(problems) > 6 else ""
        )
        raise ScheduleError(f"the schedule is incomplete: {shown}")


def _group(rank: IntArray) -> tuple[IntArray, ...]:
    """Nodes grouped by ``rank`` (1, 2, ...), each group in ascending node order."""
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(1, int(rank.max(initial=0)) + 2))
    return tuple(order[a:b] for a, b in itertools.pairwise(bounds.tolist()))
