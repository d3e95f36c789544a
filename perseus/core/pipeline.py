"""What a pipeline runs: the instruction kinds and the named schedules.

:class:`InstructionKind` is the one type of an instruction's kind everywhere: the solver's
schedules and DAG, the profiles, the wire's plans and the ranks' hooks. The schedule names are
the ones :func:`perseus.solver.make_schedule` builds (the wire's ``ScheduleName`` restates
them; tests keep the three equal).

Imports nothing but the standard library: a rank names kinds without loading the solver.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "BACKWARD",
    "BACKWARD_INPUT",
    "BACKWARD_WEIGHT",
    "CHUNKED_SCHEDULES",
    "FORWARD",
    "INSTRUCTIONS",
    "KINDS",
    "SCHEDULE_NAMES",
    "SPLIT_BACKWARD_SCHEDULES",
    "SPLIT_INSTRUCTIONS",
    "Action",
    "InstructionKind",
]


class InstructionKind(StrEnum):
    """What a pipeline instruction does."""

    # A string, so `kind == "forward"` and the wire's and files' values stay as they are (its
    # docstring is the OpenAPI document's description). A new kind (a split backward, say) is
    # a new member here; the profile then measures it and the DAG gives it its dependencies.

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward_input"
    """The input-gradient half of a split backward (torch's ``I``); the loss's gradient flows
    on to the previous stage once it is done."""
    BACKWARD_WEIGHT = "backward_weight"
    """The weight-gradient half of a split backward (torch's ``W``); nothing waits for it but
    the end of the iteration."""


FORWARD = InstructionKind.FORWARD
BACKWARD = InstructionKind.BACKWARD
BACKWARD_INPUT = InstructionKind.BACKWARD_INPUT
BACKWARD_WEIGHT = InstructionKind.BACKWARD_WEIGHT
KINDS: tuple[InstructionKind, ...] = tuple(InstructionKind)
"""Every kind, in the order of the DAG's kind numbers (forward 0, backward 1, ...)."""
INSTRUCTIONS: tuple[InstructionKind, ...] = (FORWARD, BACKWARD)
"""The instruction kinds every profile measures (strings: ``("forward", "backward")``)."""
SPLIT_INSTRUCTIONS: tuple[InstructionKind, ...] = (BACKWARD_INPUT, BACKWARD_WEIGHT)
"""The halves of a split backward: optional in a profile, both or neither on a stage."""

Action = tuple[int, InstructionKind, int]
"""``(stage, kind, microbatch)``: one action of a per-GPU list, ``stage`` the model stage."""

SCHEDULE_NAMES: tuple[str, ...] = (
    "1f1b",
    "gpipe",
    "interleaved-1f1b",
    "interleaved-zb",
    "zbv",
    "dualpipev",
    "looped-bfs",
)
"""Every named schedule, in the order the command line lists them."""
CHUNKED_SCHEDULES = frozenset(
    {"interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev", "looped-bfs"}
)
"""Schedules that run more than one model chunk per GPU (``virtual_stages`` >= 2)."""
SPLIT_BACKWARD_SCHEDULES = frozenset({"interleaved-zb", "zbv", "dualpipev"})
"""Schedules that split the backward into ``backward_input`` and ``backward_weight``."""
