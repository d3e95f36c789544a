"""The schedule DAG of :mod:`perseus.solver.dag`."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.solver import make_schedule

ALL_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")


@pytest.mark.parametrize("name", ALL_SCHEDULES)
def test_levels_order_the_dag(name: str) -> None:
    """Every node sits in a later level than its predecessors and an earlier back level than
    its successors' (sinks first), and the levels hold every node once."""
    from perseus.solver import build_dag

    dag = build_dag(make_schedule(name, 4, 8, 2 if name == "interleaved-1f1b" else 1))
    n = dag.size
    for levels, links in ((dag.levels, dag.pred), (dag.back_levels, dag.succ)):
        assert sorted(np.concatenate(levels).tolist()) == list(range(n))
        rank = np.full(n + 1, -1)
        for k, level in enumerate(levels):
            rank[level] = k
        for j in range(n):
            for other in links[j]:
                if other != n:
                    assert rank[other] < rank[j], (j, other)


def _longest_path_by_networkx(schedule, durations: np.ndarray) -> float:
    """The iteration time from every edge, written out here: each GPU's order, each data
    dependency, and an overlapped forward's output leaving with its backward's (torch sends
    both after the whole ``OVERLAP_F_B``) when its consumer is on another GPU."""
    nx = pytest.importorskip("networkx")
    node: dict[tuple[str, int, int], int] = {}
    gpu_of: list[int] = []
    for g, seq in enumerate(schedule.order):
        for inst in seq:
            node[str(inst.kind), schedule.virtual_stage(g, inst), inst.microbatch] = len(gpu_of)
            gpu_of.append(g)
    with_backward = {}
    offsets = np.cumsum([0] + [len(seq) for seq in schedule.order])
    for g, k in schedule.overlapped:
        with_backward[int(offsets[g]) + k] = int(offsets[g]) + k + 1
    last = schedule.stages * schedule.virtual_stages - 1
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(gpu_of)))
    for g in range(schedule.stages):
        for k in range(int(offsets[g]) + 1, int(offsets[g + 1])):
            graph.add_edge(k - 1, k)
    for (kind, u, j), v in node.items():
        if kind == "forward":
            source = node.get(("forward", u - 1, j))
        elif kind == "backward_weight":
            continue
        elif u == last:
            source = node[("forward", u, j)]
        else:
            source = node.get(("backward", u + 1, j), node.get(("backward_input", u + 1, j)))
        if source is None:
            continue
        if source in with_backward and gpu_of[source] != gpu_of[v]:
            source = with_backward[source]
        graph.add_edge(source, v)
    finish = {}
    for v in nx.topological_sort(graph):
        finish[v] = max((finish[p] for p in graph.predecessors(v)), default=0.0) + durations[v]
    return max(finish.values())


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (2, 8), (3, 9), (4, 8), (4, 16)])
def test_dualpipev_overlapped_outputs_leave_with_the_backward(
    stages: int, microbatches: int
) -> None:
    """On DualPipeV the DAG's iteration time equals a longest path over every edge written
    out independently (networkx), for random durations; at most two successors per node;
    and an overlapped forward's consumer on another GPU starts after the backward issued
    with it, never right after the forward."""
    from perseus.solver import build_dag

    schedule = make_schedule("dualpipev", stages, microbatches, 2)
    dag = build_dag(schedule)
    assert dag.succ.shape == (dag.size, 2) and dag.pred.shape == (dag.size, 2)
    rng = np.random.default_rng(stages * 100 + microbatches)
    for _ in range(5):
        durations = rng.uniform(0.001, 0.05, dag.size)
        expected = _longest_path_by_networkx(schedule, durations)
        assert float(dag.iteration_time(durations)) == pytest.approx(expected, rel=1e-12)
    # a forward's consumer elsewhere waits for the backward after it: make that backward
    # long, and the consumer starts after it
    checked = 0
    for g, k in schedule.overlapped:
        inst = schedule.order[g][k]
        u = schedule.virtual_stage(g, inst)
        consumers = [
            int(dag.offsets[h]) + m
            for h, seq in enumerate(schedule.order)
            for m, other in enumerate(seq)
            if h != g and other.kind == inst.kind and other.microbatch == inst.microbatch
            and schedule.virtual_stage(h, other) == u + 1
        ]  # fmt: skip
        backward = int(dag.offsets[g]) + k + 1
        durations = np.full(dag.size, 0.01)
        durations[backward] = 1.0
        finish = dag.finish_times(durations)
        start = finish - durations
        for c in consumers:
            assert start[c] >= finish[backward] - 1e-12 > finish[backward - 1]
            checked += 1
    assert checked >= len(schedule.overlapped) // 2


def test_overlapped_positions_are_checked() -> None:
    import dataclasses

    from perseus.core.errors import ScheduleError
    from perseus.solver import build_dag

    schedule = make_schedule("dualpipev", 2, 8, 2)
    g, k = schedule.overlapped[0]
    bad = dataclasses.replace(schedule, overlapped=((g, k + 1),))  # a backward, not a forward
    with pytest.raises(ScheduleError, match=f"overlapped: GPU {g} position {k + 1}"):
        build_dag(bad)
    with pytest.raises(ScheduleError, match="overlapped: GPU 5"):
        build_dag(dataclasses.replace(schedule, overlapped=((5, 0),)))
