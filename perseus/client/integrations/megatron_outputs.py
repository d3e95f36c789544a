"""Which microbatch and model chunk a Megatron backward step belongs to.

Megatron's ``backward_step`` gets no ids, only the object its forward returned; the adapter
(:mod:`perseus.client.integrations.megatron`) records each forward's output here and looks
the backward's up.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

__all__ = ["ForwardOutputs"]


class ForwardOutputs:
    """Which microbatch and chunk produced a forward output, to name its backward.

    The schedules hand ``backward_step`` the very object ``forward_step`` returned (a tensor,
    or a list whose first element is the tensor). Entries are keyed by the ``id`` of that
    tensor and hold a weak reference, so a recycled id never matches a dead tensor and an
    entry never keeps an activation alive. O(1) per call.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Callable[[], object], int, int | None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, output: object, microbatch: int, chunk: int | None) -> None:
        """Remember that ``output`` is the forward output of ``(microbatch, chunk)``."""
        key = _key(output)
        try:
            ref: Callable[[], object] = weakref.ref(key)
        except TypeError:  # not weak-referenceable: hold it until its backward or clear()
            ref = functools.partial(_same, key)
        self._entries[id(key)] = (ref, microbatch, chunk)

    def match(self, output: object) -> tuple[int, int | None] | None:
        """``(microbatch, chunk)`` of the forward that returned ``output`` (forgotten after)."""
        key = _key(output)
        entry = self._entries.pop(id(key), None)
        if entry is None or entry[0]() is not key:
            return None
        return entry[1], entry[2]

    def clear(self) -> None:
        """Forget everything (at each iteration start: an aborted one leaves entries)."""
        self._entries.clear()


def _key(output: object) -> object:
    if isinstance(output, (list, tuple)) and output:
        return output[0]
    return output


def _same(value: object) -> object:
    return value
