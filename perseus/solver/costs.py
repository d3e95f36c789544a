"""Per-instruction cost tables: the options each DAG node may run at.

Nodes of one cost class (GPU, instruction kind; see :class:`perseus.solver.dag.PipelineDag`)
share the stage's profile. Only options that are
not dominated once blocking power is counted are kept (see
:func:`perseus.solver.profiles.effective_options`), time ascending. With interleaved schedules a
GPU holds ``V`` model chunks, each a ``1/V`` share of the stage's layers, so a chunk's instruction
costs the stage's time and energy divided by ``V``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.core.errors import ProfileError
from perseus.core.profiles import Profile
from perseus.solver.profiles import effective_options
from perseus.solver.schedules import Schedule

__all__ = ["CostTable", "build_costs"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class CostTable:
    """Options of every cost class, concatenated.

    Class ``c`` owns the flat slice ``start[c]:start[c + 1]``, time ascending (so effective
    energy ``energy_j - p_block_w * time_s`` strictly descending).
    """

    p_block_w: float
    num_gpus: int
    start: IntArray
    time_s: FloatArray
    energy_j: FloatArray
    frequency_mhz: IntArray

    @property
    def effective_j(self) -> FloatArray:
        """Energy minus what the GPU would draw while blocked for the same time."""
        return np.asarray(self.energy_j - self.p_block_w * self.time_s)

    def times_of(self, cost_class: int) -> FloatArray:
        """Option times of one class, ascending."""
        return self.time_s[self.start[cost_class] : self.start[cost_class + 1]]


def build_costs(profile: Profile, schedule: Schedule, p_block_w: float) -> CostTable:
    """Build the cost table of ``schedule`` on ``profile``.

    Raises:
        ProfileError: The profile's stage count differs from the schedule's, or a stage lacks
            a kind the schedule runs (the split backward's halves).
    """
    if profile.num_stages != schedule.stages:
        raise ProfileError(
            f"{profile.source}: stage: the profile has {profile.num_stages} stages but the "
            f"schedule has {schedule.stages}"
        )
    scale = 1.0 / schedule.virtual_stages
    starts = [0]
    times: list[float] = []
    energies: list[float] = []
    freqs: list[int] = []
    for g in range(profile.num_stages):
        for instruction in schedule.kinds:
            for opt in effective_options(profile.options(g, instruction), p_block_w):
                times.append(opt.time_s * scale)
                energies.append(opt.energy_j * scale)
                freqs.append(opt.frequency_mhz)
            starts.append(len(times))
    return CostTable(
        p_block_w=p_block_w,
        num_gpus=schedule.stages,
        start=np.asarray(starts, dtype=np.int64),
        time_s=np.asarray(times),
        energy_j=np.asarray(energies),
        frequency_mhz=np.asarray(freqs, dtype=np.int64),
    )
