"""Zero-bubble schedules: frontiers truthful against an independent replay, near the exact MILP.

The reference here imports no perseus code for the schedule or the DAG: the order comes from
torch's own ``get_schedule_ops`` and the dependencies are rebuilt from BACKGROUND.md's rules
(``F(s, j) -> F(s+1, j)``; ``F(last, j) -> B/I(last, j)``; ``B/I(s+1, j) -> B/I(s, j)``;
``I(s, j) -> W(s, j)``; the output of a forward issued with a backward in one ``OVERLAP_F_B``
leaves for another rank with the backward's, as torch sends after the whole action) into a
:class:`reference.Dag`, so :func:`reference.replay`, :func:`reference.replay_with_margin` and
:func:`reference.milp_min_energy` apply unchanged. Skipped without torch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.solver import compute_frontier, make_schedule, profile_from_rows

from . import reference as ref
from .cases import CLOCKS, NEAR, RTOL, examples, grid, query, rel
from .test_schedules_torch import torch_overlapped

pipelining = pytest.importorskip("torch.distributed.pipelining.schedules")
visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")

KIND = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}
CLASSES = {
    "zbv": "ScheduleZBVZeroBubble",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
# (schedule, ranks, microbatches): small enough for an exact sweep
SIZES = [("zbv", 2, 2), ("zbv", 2, 3), ("interleaved-zb", 2, 2), ("dualpipev", 2, 4)]


def torch_order(name: str, ranks: int, microbatches: int) -> tuple[ref.Order, list[list[int]]]:
    """torch's per-rank (kind, microbatch, chunk) lists and each rank's stages (its chunks)."""
    cls = getattr(pipelining, CLASSES[name])
    actions = []
    for row in visualizer.get_schedule_ops(cls, ranks, microbatches, num_stages_per_rank=2):
        seq = []
        for action in row:
            for part in (action.sub_actions or (action,)) if action is not None else ():
                seq.append(
                    (part.stage_index, KIND[part.computation_type.value], part.microbatch_index)
                )
        actions.append(seq)
    placement = [sorted({u for u, _k, _j in seq}) for seq in actions]
    order = [[(k, j, placement[g].index(u)) for u, k, j in seq] for g, seq in enumerate(actions)]
    return order, placement


def zb_dag(
    order: ref.Order, placement: list[list[int]], overlapped: set[tuple[int, int]] | None = None
) -> ref.Dag:
    """The DAG by the rules above; a forward in ``overlapped`` hands its output to another
    rank only once the backward issued with it is done (torch sends after the action)."""
    overlapped = overlapped or set()
    last = sum(len(p) for p in placement) - 1
    where = {}
    for g, seq in enumerate(order):
        for k, (kind, j, c) in enumerate(seq):
            where[kind, placement[g][c], j] = (g, k)
    nodes = list(where.values())
    preds: dict[tuple[int, int], list[tuple[int, int]]] = {n: [] for n in nodes}
    for g, seq in enumerate(order):
        for k in range(1, len(seq)):
            preds[g, k].append((g, k - 1))

    def gradient(u: int, j: int) -> tuple[int, int]:
        return where.get(("backward", u, j)) or where["backward_input", u, j]

    for (kind, u, j), node in where.items():
        if kind == "forward" and u > 0:
            source = where["forward", u - 1, j]
            if source in overlapped and source[0] != node[0]:
                source = (source[0], source[1] + 1)
            preds[node].append(source)
        elif kind in ("backward", "backward_input"):
            preds[node].append(where["forward", u, j] if u == last else gradient(u + 1, j))
        elif kind == "backward_weight":
            preds[node].append(where["backward_input", u, j])
    indeg = {n: len(p) for n, p in preds.items()}
    succs: dict[tuple[int, int], list[tuple[int, int]]] = {n: [] for n in nodes}
    for n, ps in preds.items():
        for p in ps:
            succs[p].append(n)
    ready, topo = [n for n in nodes if indeg[n] == 0], []
    while ready:
        n = ready.pop()
        topo.append(n)
        for m in succs[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    assert len(topo) == len(nodes), "torch's order deadlocks under the rules"
    return ref.Dag(order, 2, nodes, preds, topo)


@st.composite
def split_rows(draw: st.DrawFn, stages: int, n_opt: int) -> tuple[tuple, ...]:
    clocks = sorted(draw(st.lists(st.sampled_from(CLOCKS), min_size=n_opt, max_size=n_opt,
                                  unique=True)), reverse=True)  # fmt: skip
    rows = []
    for s in range(stages):
        for kind in KIND.values():
            ts = draw(st.lists(st.floats(0.01, 0.2), min_size=n_opt, max_size=n_opt))
            ps = draw(st.lists(st.floats(20.0, 400.0), min_size=n_opt, max_size=n_opt))
            rows += [(s, kind, f, t, t * p) for f, t, p in zip(clocks, ts, ps, strict=True)]
    return tuple(rows)


def check(frontier, table, dag, p_block_w: float, margin: float) -> None:
    times, energies = frontier.times_s, frontier.energies_j
    assert (np.diff(times) > 0).all() and (np.diff(energies) < 0).all()
    fastest = ref.all_fastest_time(table, dag)
    if margin == 0:
        assert rel(float(times[0]), fastest) <= RTOL
    for i in range(len(frontier)):  # every point replays exactly
        plan = [list(row) for row in frontier.point(i).frequencies_mhz]
        t, e, _ = ref.replay_with_margin(table, dag, p_block_w, plan, margin)
        assert rel(float(times[i]), t) <= RTOL, (i, times[i], t)
        assert rel(float(energies[i]), e) <= RTOL, (i, energies[i], e)


@pytest.mark.parametrize(("name", "ranks", "microbatches"), SIZES)
def test_order_is_torchs(name: str, ranks: int, microbatches: int) -> None:
    order, placement = torch_order(name, ranks, microbatches)
    schedule = make_schedule(name, ranks, microbatches, 2)
    assert ref.as_tuples(schedule.order) == order
    assert [list(p) for p in schedule.placement] == placement


@examples(12)
@given(st.sampled_from(SIZES), st.data())
def test_every_point_replays_with_and_without_transitions(size, data) -> None:
    name, ranks, microbatches = size
    rows = data.draw(split_rows(ranks, data.draw(st.integers(2, 4))))
    p_block_w = data.draw(st.floats(10.0, 150.0))
    note(repr((size, rows, p_block_w)))
    table = {(s, k, f): (t, e) for s, k, f, t, e in rows}
    overlapped = set(torch_overlapped(ranks, microbatches)) if name == "dualpipev" else set()
    dag = zb_dag(*torch_order(name, ranks, microbatches), overlapped)
    schedule = make_schedule(name, ranks, microbatches, 2)
    for margin in (0.0, 0.005):
        frontier = compute_frontier(profile_from_rows(rows), schedule, p_block_w=p_block_w,
                                    clock_change_margin_s=margin)  # fmt: skip
        check(frontier, table, dag, p_block_w, margin)


@examples(8)
@given(st.sampled_from(SIZES), st.data())
def test_small_zero_bubble_fast_equals_the_milp(size, data) -> None:
    """Fast within 0.5 % of the exact sweep everywhere; both ends equal an independent MILP."""
    name, ranks, microbatches = size
    rows = data.draw(split_rows(ranks, 2))
    p_block_w = data.draw(st.floats(10.0, 150.0))
    note(repr((size, rows, p_block_w)))
    table = {(s, k, f): (t, e) for s, k, f, t, e in rows}
    overlapped = set(torch_overlapped(ranks, microbatches)) if name == "dualpipev" else set()
    dag = zb_dag(*torch_order(name, ranks, microbatches), overlapped)
    profile, schedule = profile_from_rows(rows), make_schedule(name, ranks, microbatches, 2)
    fast = compute_frontier(profile, schedule, p_block_w=p_block_w)
    exact = compute_frontier(profile, schedule, p_block_w=p_block_w, exact=True)
    check(fast, table, dag, p_block_w, 0.0)
    check(exact, table, dag, p_block_w, 0.0)
    t_min = ref.all_fastest_time(table, dag)
    end = max(float(exact.times_s[-1]), float(fast.times_s[-1]))
    for d in grid(t_min, end, 1e-3):
        e_exact = float(exact.energies_j[query(exact, d)])  # type: ignore[index]
        e_fast = float(fast.energies_j[query(fast, d)])  # type: ignore[index]
        assert e_exact <= e_fast * (1 + RTOL), (d, e_exact, e_fast)
        assert e_fast <= e_exact * (1 + NEAR), (d, e_exact, e_fast, e_fast / e_exact - 1)
    slowest = ref.milp_min_energy(table, dag, p_block_w)
    assert slowest is not None
    assert rel(float(exact.energies_j[-1]), slowest[1]) <= 1e-7
    assert rel(float(fast.energies_j[-1]), slowest[1]) <= 1e-7
    fastest = ref.milp_min_energy(table, dag, p_block_w, t_min * (1 + 1e-12))
    assert fastest is not None
    if fastest[0] <= t_min * (1 + RTOL):
        assert rel(float(exact.energies_j[0]), fastest[1]) <= 1e-7
    else:  # HiGHS' feasibility tolerance let the reference overrun: only a lower bound
        assert exact.energies_j[0] >= fastest[1] * (1 - 1e-7)
    assert math.isfinite(float(fast.gaps.max()))
