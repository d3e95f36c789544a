"""A synthetic, H200-like GPU model: the example profile perseus ships for its demo.

Nothing here is measured. The model is small enough to read in one go and produces the shape
that real pipeline profiles have: time grows as the clock drops, energy first falls (lower
voltage) and then rises again (static power over a longer run), and the first and last stages
differ from the identical middle ones.

Per stage and instruction type, at SM clock ``f`` (MHz), with ``F_MAX`` the top clock:

    time(f)   = t_compute * F_MAX / f + t_memory

    V(f)      = V_MIN                                                 f <= F_KNEE
              = V_MIN + (1 - V_MIN) * (f - F_KNEE) / (F_MAX - F_KNEE)  above the knee
    P_dyn(f)  = P_DYN_MAX * (f / F_MAX) * V(f)**2                      (dynamic power ~ f V^2)

    energy(f) = (P_STATIC + P_dyn(f)) * t_compute * F_MAX / f
              + (P_STATIC + MEMORY_ACTIVITY * P_dyn(f)) * t_memory

``t_compute`` is the compute-bound part of the instruction at ``F_MAX`` (scales with the clock)
and ``t_memory`` the memory-bound part (HBM-bound: does not). Voltage is relative to its value
at ``F_MAX``. Each time and energy is then multiplied by ``1 + u`` with ``u`` drawn uniformly
from ``[-TIME_NOISE, TIME_NOISE]`` (``ENERGY_NOISE`` for energy) by a generator with a fixed
seed, like the scatter of real measurements, and rounded (time to 0.1 us, energy to 0.1 mJ).

The stages are imbalanced the way a GPT-style model split into equal blocks of layers is: stage 0
also does the token embedding (memory-bound lookups forward, a scatter-add backward), the last
stage also runs the LM head and the loss (a large vocabulary GEMM, compute-bound), and the
stages in between are identical. At ``F_MAX`` a middle stage draws ``P_STATIC + P_DYN_MAX``
= 620 W while compute-bound, close to an H200 running a large bf16 GEMM.

The backward is also "measured" split, for zero-bubble schedules: ``backward_input`` does
:data:`INPUT_SHARE` of the backward's compute and memory work and ``backward_weight`` the rest,
so at every clock the halves take the full backward's time and energy (up to their own noise,
drawn by a second generator so that the forward and backward rows stay as they were).

The demo plans this profile with a blocking power of :data:`EXAMPLE_P_BLOCK_W` watts.

Regenerate the shipped file with::

    python -c "from perseus.solver.synthetic import synthetic_profile, to_csv; \\
        print(to_csv(synthetic_profile()), end='')" > perseus/data/example_profile.csv

The test suite checks that the shipped file equals this output byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from perseus.core.pipeline import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    InstructionKind,
)
from perseus.core.profiles import Profile, profile_from_rows

__all__ = [
    "EXAMPLE_PROFILE",
    "EXAMPLE_P_BLOCK_W",
    "H200_CLOCKS_MHZ",
    "INPUT_SHARE",
    "StageWork",
    "example_profile",
    "split_backward",
    "stage_work",
    "synthetic_profile",
    "to_csv",
]

F_MAX_MHZ = 1980
F_KNEE_MHZ = 1200
V_MIN = 0.70
P_STATIC_W = 120.0
P_DYN_MAX_W = 500.0
MEMORY_ACTIVITY = 0.35
TIME_NOISE = 0.002
ENERGY_NOISE = 0.005

#: H200-like supported SM clocks, 1980 MHz down to 1005 MHz in 15 MHz steps (66 clocks).
H200_CLOCKS_MHZ: tuple[int, ...] = tuple(range(1980, 1004, -15))

#: The split backward: backward_input's share of the backward's work (backward_weight: the rest).
INPUT_SHARE = 0.55

#: Blocking power (W) to plan the example profile with: a GPU waiting on a peer draws this much.
EXAMPLE_P_BLOCK_W = 100.0
EXAMPLE_PROFILE = "data/example_profile.csv"  # the shipped file, inside the perseus package


def example_profile() -> Profile:
    """The shipped example profile (``perseus/data/example_profile.csv``), as loaded from it."""
    from importlib import resources

    from perseus.formats.profiles import load_profile

    with resources.as_file(resources.files("perseus") / EXAMPLE_PROFILE) as path:
        return load_profile(path)


Row = tuple[int, str, int, float, float]


@dataclass(frozen=True, slots=True)
class StageWork:
    """Work of one instruction type on one stage, at the top clock.

    Attributes:
        compute_s: Compute-bound seconds at ``F_MAX``; scales as ``F_MAX / f``.
        memory_s: Memory-bound seconds; independent of the SM clock.
    """

    compute_s: float
    memory_s: float


# A middle stage: a block of transformer layers. Backward does about twice the FLOPs of forward.
_MIDDLE = {FORWARD: StageWork(0.040, 0.008), BACKWARD: StageWork(0.080, 0.014)}
# Stage 0 adds the embedding: a lookup forward, a scatter-add of its gradient backward.
_EMBEDDING = {FORWARD: StageWork(0.0, 0.006), BACKWARD: StageWork(0.002, 0.010)}
# The last stage adds the LM head and the loss over the vocabulary: GEMMs plus a softmax.
_HEAD = {FORWARD: StageWork(0.006, 0.002), BACKWARD: StageWork(0.010, 0.003)}


def stage_work(stage: int, stages: int) -> dict[InstructionKind, StageWork]:
    """Return the per-instruction work of ``stage`` in a pipeline of ``stages`` stages."""
    work = dict(_MIDDLE)
    extras = ([_EMBEDDING] if stage == 0 else []) + ([_HEAD] if stage == stages - 1 else [])
    for extra in extras:
        work = {
            kind: StageWork(w.compute_s + extra[kind].compute_s, w.memory_s + extra[kind].memory_s)
            for kind, w in work.items()
        }
    return work


def synthetic_profile(
    stages: int = 4,
    clocks_mhz: Iterable[int] = H200_CLOCKS_MHZ,
    seed: int = 0,
    split_backward: bool = True,
) -> list[Row]:
    """Generate profile rows from the model in the module docstring.

    Args:
        stages: Number of pipeline stages, >= 1 (with one stage it carries embedding and head).
        clocks_mhz: SM clocks to "measure", each in ``(0, F_MAX]``; rows follow this order.
        seed: Seed of the measurement noise; the same seed gives the same rows.
        split_backward: Also give ``backward_input`` and ``backward_weight`` rows.

    Returns:
        Rows ``(stage, instruction, frequency_mhz, time_s, energy_j)``: per stage, per clock,
        forward, backward (then backward_input, backward_weight); the shape
        :func:`perseus.solver.profile_from_rows` takes.

    Raises:
        ValueError: ``stages < 1``, no clocks, or a clock outside ``(0, F_MAX]``.
    """
    clocks = [int(f) for f in clocks_mhz]
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if not clocks or any(not 0 < f <= F_MAX_MHZ for f in clocks):
        raise ValueError(f"clocks must be non-empty and within (0, {F_MAX_MHZ}] MHz")
    # Only uniform draws (Generator.random) and + - * /: the same bytes on every platform.
    rng = np.random.default_rng(seed)
    freq = np.asarray(clocks, dtype=float)
    slow = F_MAX_MHZ / freq
    volt = V_MIN + (1.0 - V_MIN) * np.clip(freq - F_KNEE_MHZ, 0.0, None) / (F_MAX_MHZ - F_KNEE_MHZ)
    p_dyn = P_DYN_MAX_W * (freq / F_MAX_MHZ) * volt * volt

    def measure(work: StageWork, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        compute_s = work.compute_s * slow
        time_s = compute_s + work.memory_s
        energy_j = (P_STATIC_W + p_dyn) * compute_s + (
            P_STATIC_W + MEMORY_ACTIVITY * p_dyn
        ) * work.memory_s
        time_s = time_s * (1.0 + rng.uniform(-TIME_NOISE, TIME_NOISE, len(clocks)))
        energy_j = energy_j * (1.0 + rng.uniform(-ENERGY_NOISE, ENERGY_NOISE, len(clocks)))
        return np.round(time_s, 7), np.round(energy_j, 4)

    split_rng = np.random.default_rng([seed, 1])
    kinds: tuple[InstructionKind, ...] = (FORWARD, BACKWARD)
    if split_backward:
        kinds += (BACKWARD_INPUT, BACKWARD_WEIGHT)
    per_stage: list[dict[InstructionKind, tuple[np.ndarray, np.ndarray]]] = []
    for stage in range(stages):
        works = stage_work(stage, stages)
        measured = {kind: measure(work, rng) for kind, work in works.items()}
        if split_backward:
            whole = works[BACKWARD]
            for kind, share in ((BACKWARD_INPUT, INPUT_SHARE), (BACKWARD_WEIGHT, 1 - INPUT_SHARE)):
                half = StageWork(whole.compute_s * share, whole.memory_s * share)
                measured[kind] = measure(half, split_rng)
        per_stage.append(measured)

    return [
        (stage, kind, clock, float(measured[kind][0][i]), float(measured[kind][1][i]))
        for stage, measured in enumerate(per_stage)
        for i, clock in enumerate(clocks)
        for kind in kinds
    ]


def split_backward(profile: Profile, input_share: float = INPUT_SHARE) -> Profile:
    """``profile`` with every stage's backward also given as its halves: ``backward_input`` at
    ``input_share`` of the backward's time and energy at every clock, ``backward_weight`` at
    the rest (what the benchmarks use for profiles that measured the backward whole). A
    profile that already has the halves keeps its own."""
    rows: list[Row] = [
        (stage, kind, o.frequency_mhz, o.time_s, o.energy_j)
        for stage, per_kind in enumerate(profile.stages)
        for kind, options in per_kind.items()
        for o in options
    ]
    for stage, per_kind in enumerate(profile.stages):
        if BACKWARD_INPUT in per_kind:
            continue
        for o in per_kind[BACKWARD]:
            for kind, share in ((BACKWARD_INPUT, input_share), (BACKWARD_WEIGHT, 1 - input_share)):
                rows.append((stage, kind, o.frequency_mhz, o.time_s * share, o.energy_j * share))
    return profile_from_rows(rows, source=profile.source, p_block_w=profile.p_block_w)


def to_csv(rows: Iterable[Row]) -> str:
    """Format rows as the Zeus CSV ``stage,instruction,frequency,time,energy`` (``\\n`` lines)."""
    lines = ["stage,instruction,frequency,time,energy"]
    lines += [f"{s},{kind},{f},{t:.7f},{e:.4f}" for s, kind, f, t, e in rows]
    return "\n".join(lines) + "\n"
