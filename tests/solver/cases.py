"""Generated test cases (hypothesis strategies) and small helpers shared by the solver tests."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from . import reference as ref

# Deterministic, modest example counts: the whole solver suite runs in a couple of minutes on
# two cores. ``derandomize`` makes every run check the same cases (no flaky CI); the database
# is off so a local failure does not silently change what CI sees.
SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    # no "explain" phase: it is slow and garbles the printed Case
    "phases": [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
}


def examples(n: int) -> settings:
    return settings(max_examples=n, **SETTINGS)


RTOL = 1e-9  # truthfulness: stated vs replayed
NEAR = 0.005  # near-optimality: fast mode within 0.5 % of the exact optimum
CLOCKS = tuple(range(1980, 344, -15))  # the H200's supported SM clocks
# The real profiles: $PERSEUS_TEST_PROFILES, else ../shared/data/profiles beside the checkout.
SHARED_PROFILES = Path(
    os.environ.get("PERSEUS_TEST_PROFILES")
    or Path(__file__).resolve().parents[2].parent / "shared" / "data" / "profiles"
)


Row = tuple[int, str, int, float, float]


@dataclass(frozen=True)
class Case:
    """A generated pipeline: profile rows, sizes, schedule and blocking power."""

    rows: tuple[Row, ...]
    stages: int
    microbatches: int
    p_block_w: float
    schedule_name: str = "1f1b"
    chunks: int = 1

    @cached_property
    def table(self) -> dict[tuple[int, str, int], tuple[float, float]]:
        return {(s, k, f): (t, e) for s, k, f, t, e in self.rows}

    @cached_property
    def order(self) -> ref.Order:
        return ref.reference_order(self.schedule_name, self.stages, self.microbatches, self.chunks)

    @cached_property
    def dag(self) -> ref.Dag:
        return ref.build_dag(self.order, self.chunks)

    @cached_property
    def t_min(self) -> float:
        return ref.all_fastest_time(self.table, self.dag)

    def profile(self):
        from perseus.solver import profile_from_rows

        return profile_from_rows(self.rows)

    def schedule(self):
        from perseus.solver import make_schedule

        return make_schedule(self.schedule_name, self.stages, self.microbatches, self.chunks)

    def replay(self, frequencies: Sequence[Sequence[int]]) -> tuple[float, float]:
        return ref.replay(self.table, self.dag, self.p_block_w, frequencies)

    def __repr__(self) -> str:  # what hypothesis prints for a failing example: paste-able
        return (
            f"Case(rows={self.rows!r}, stages={self.stages}, microbatches={self.microbatches}, "
            f"p_block_w={self.p_block_w!r}, schedule_name={self.schedule_name!r}, "
            f"chunks={self.chunks})"
        )


times = st.floats(0.01, 0.2, allow_nan=False, allow_infinity=False)
powers = st.floats(20.0, 400.0, allow_nan=False, allow_infinity=False)
round_times = st.sampled_from([0.0625, 0.125, 0.1875, 0.25])
round_powers = st.sampled_from([32.0, 64.0, 128.0])


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    stages: tuple[int, int] = (1, 4),
    microbatches: tuple[int, int] = (1, 5),
    options: tuple[int, int] = (1, 5),
    schedules: Sequence[str] = ("1f1b",),
    chunks: int = 2,
    ragged: bool = False,
    monotone: bool = False,
    round_numbers: bool = False,
    max_plans: int | None = None,
) -> Case:
    """A random pipeline.

    Every (stage, instruction) is measured at the same clocks (like a real GPU) unless
    ``ragged``, where each keeps a random subset that includes the top clock. ``monotone``
    makes a higher clock never slower. ``round_numbers`` draws times and powers from a few
    exact binary fractions, so that plans tie in time and in energy. ``max_plans`` bounds the
    number of per-instruction plans (for brute force).
    """
    name = draw(st.sampled_from(list(schedules)))
    s = draw(st.integers(*stages))
    v = chunks if name == "interleaved-1f1b" else 1
    if name == "interleaved-1f1b":  # Megatron needs M to be a multiple of S
        multiples = [m for m in range(microbatches[0], microbatches[1] + 1) if m % s == 0]
        m = draw(st.sampled_from(multiples or [s]))
    else:
        m = draw(st.integers(*microbatches))
    n_instr = 2 * s * m * v
    hi = options[1]
    if max_plans is not None:
        hi = max(1, min(hi, math.floor(max_plans ** (1 / n_instr) + 1e-9)))
    n_opt = draw(st.integers(min(options[0], hi), hi))
    clocks = sorted(
        draw(st.lists(st.sampled_from(CLOCKS), min_size=n_opt, max_size=n_opt, unique=True)),
        reverse=True,
    )
    rows: list[Row] = []
    for stage in range(s):
        for kind in (ref.F, ref.B):
            mine = clocks
            if ragged:  # a random subset, always with the top clock (a global clock exists)
                extra = []
                if n_opt > 1:
                    extra = draw(st.lists(st.sampled_from(clocks[1:]), unique=True))
                mine = sorted({clocks[0], *extra}, reverse=True)
            ts = draw(st.lists(round_times if round_numbers else times,
                               min_size=len(mine), max_size=len(mine)))  # fmt: skip
            if monotone:
                ts = sorted(ts)  # clocks descending -> times ascending
            ps = draw(st.lists(round_powers if round_numbers else powers,
                               min_size=len(mine), max_size=len(mine)))  # fmt: skip
            rows += [(stage, kind, f, t, t * p) for f, t, p in zip(mine, ts, ps, strict=True)]
    p_block = draw(st.sampled_from([16.0, 32.0]) if round_numbers
                   else st.floats(10.0, 150.0, allow_nan=False))  # fmt: skip
    return Case(tuple(rows), s, m, p_block, name, v)


# ----------------------------------------------------------------------------- frontier helpers


def query(frontier, deadline: float, rtol: float = RTOL) -> int | None:
    """Index of the point with the largest time_s <= deadline (None when none fits)."""
    fits = [i for i, t in enumerate(frontier.times_s) if t <= deadline * (1 + rtol)]
    return fits[-1] if fits else None


def grid(t_min: float, t_end: float, resolution_s: float) -> list[float]:
    """Deadlines t_min + k * resolution up to one step past t_end."""
    steps = math.floor((t_end - t_min) / resolution_s + 1e-9) + 1
    return [t_min + k * resolution_s for k in range(steps + 1)]


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def frequencies(point) -> list[list[int]]:
    return [list(seq) for seq in point.frequencies_mhz]


def split_rows(
    stages: int = 2, split: bool = True, skip: tuple[int, str] | None = None
) -> list[tuple[int, str, int, float, float]]:
    """Profile rows at 1400 and 1000 MHz with a split backward (``backward_input`` 55 % and
    ``backward_weight`` 45 % of it) unless ``split`` is False; ``skip``: one (stage, kind) left
    out."""
    out = []
    for s in range(stages):
        for kind, t in (("forward", 1.0), ("backward", 2.0)):
            out += [(s, kind, f, t * 1400 / f, 100 * t) for f in (1400, 1000)]
        if split:
            for kind, share in (("backward_input", 0.55), ("backward_weight", 0.45)):
                if (s, kind) != skip:
                    out += [(s, kind, f, 2.0 * share * 1400 / f, 200 * share) for f in (1400, 1000)]
    return out
