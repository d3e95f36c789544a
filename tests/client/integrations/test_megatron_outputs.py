"""ForwardOutputs, which names a Megatron backward by the forward output it is handed (the
common cases, with real tensors, are in tests/e2e/test_megatron.py): outputs that cannot be
weakly referenced, re-recorded outputs, and a forgotten iteration."""

from __future__ import annotations

import gc

from perseus.client.integrations.megatron_outputs import ForwardOutputs


class Output:
    """Weakly referenceable, like a tensor."""


def test_an_output_without_weak_references_is_held_until_matched() -> None:
    outputs = ForwardOutputs()
    plain = object()  # no weak references: held strongly
    outputs.record(plain, 3, None)
    assert outputs.match([plain]) == (3, None)
    assert outputs.match(plain) is None and len(outputs) == 0


def test_the_latest_record_of_an_output_names_it() -> None:
    outputs = ForwardOutputs()
    out = Output()
    outputs.record(out, 0, 0)
    outputs.record((out, "loss"), 1, 1)  # the same tensor first in a tuple: the same key
    assert len(outputs) == 1
    assert outputs.match(out) == (1, 1)


def test_a_dead_output_is_not_matched_by_whatever_takes_its_place() -> None:
    outputs = ForwardOutputs()
    outputs.record(Output(), 0, None)  # dropped at once
    gc.collect()
    for _ in range(100):  # new objects, some possibly at the dead one's address
        assert outputs.match(Output()) is None
    outputs.clear()
    assert len(outputs) == 0


def test_an_empty_list_is_its_own_key() -> None:
    outputs = ForwardOutputs()
    empty: list[object] = []
    outputs.record(empty, 4, 2)
    assert outputs.match([]) is None  # another empty list
    assert outputs.match(empty) == (4, 2)
