"""The pure planning core: profiles -> schedule DAG -> time-energy frontier -> plans.

Imports only the standard library, numpy, highspy (HiGHS) and the ground floor
(:mod:`perseus.core`, whose types it names here too, as do the profile files of
:mod:`perseus.formats.profiles`). See ``docs/solver-api.md``.
"""

from __future__ import annotations

from perseus.core.baselines import BaselineKey
from perseus.solver.baselines import Baseline, baselines_at, default_time
from perseus.solver.costs import CostTable, build_costs
from perseus.solver.dag import PipelineDag, build_dag
from perseus.solver.deadlines import MAX_CELLS, deadline_count, default_resolution
from perseus.solver.frontier import FRONTIER_FORMAT, Frontier, Point, compute_frontier
from perseus.solver.policies import POLICY_KINDS, Policy, choose_point, straggler_point
from perseus.solver.profiles import (
    INSTRUCTIONS,
    Option,
    Profile,
    ProfileRow,
    effective_options,
    load_profile,
    profile_from_rows,
    profile_to_json,
)
from perseus.solver.schedules import (
    SCHEDULE_NAMES,
    Instruction,
    InstructionKind,
    Schedule,
    make_schedule,
    schedule_from_actions,
)
from perseus.solver.simulate import Replay, instruction_times_s, replay

__all__ = [
    "FRONTIER_FORMAT",
    "INSTRUCTIONS",
    "MAX_CELLS",
    "POLICY_KINDS",
    "SCHEDULE_NAMES",
    "Baseline",
    "BaselineKey",
    "CostTable",
    "Frontier",
    "Instruction",
    "InstructionKind",
    "Option",
    "PipelineDag",
    "Point",
    "Policy",
    "Profile",
    "ProfileRow",
    "Replay",
    "Schedule",
    "baselines_at",
    "build_costs",
    "build_dag",
    "choose_point",
    "compute_frontier",
    "deadline_count",
    "default_resolution",
    "default_time",
    "effective_options",
    "instruction_times_s",
    "load_profile",
    "make_schedule",
    "profile_from_rows",
    "profile_to_json",
    "replay",
    "schedule_from_actions",
    "straggler_point",
]
