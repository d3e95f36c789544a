"""The integrations' tensor helpers: reruns of a stage leave no trace (random-number states,
buffers and extra state put back), inputs are detached copies, fresh leaves for each rerun."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from perseus.client.integrations.tensors import (  # noqa: E402
    detached,
    flatten_tensors,
    preserved,
    with_grad,
)


def draws() -> tuple[float, float, float]:
    return torch.rand(()).item(), random.random(), float(np.random.random())


def test_preserved_puts_every_random_state_back() -> None:
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    state = torch.random.get_rng_state(), random.getstate(), np.random.get_state()
    expected = draws()
    torch.random.set_rng_state(state[0])
    random.setstate(state[1])
    np.random.set_state(state[2])
    with preserved([]):
        assert draws() == expected  # the reruns draw from the same states...
        draws()
    assert draws() == expected  # ...and training draws as if they never ran


def test_preserved_puts_buffers_and_extra_state_back_even_after_an_error() -> None:
    norm = torch.nn.BatchNorm1d(3)
    before = norm.running_mean.clone(), norm.num_batches_tracked.clone()
    tracker = {"state": 5}
    hook = (lambda: tracker["state"], lambda value: tracker.update(state=value))
    with pytest.raises(RuntimeError), preserved([norm], [hook]):
        norm.train()
        norm(torch.randn(8, 3) + 10)  # moves the running statistics
        tracker["state"] = 6
        assert not torch.equal(norm.running_mean, before[0])
        raise RuntimeError("a rerun failed")
    assert torch.equal(norm.running_mean, before[0])
    assert torch.equal(norm.num_batches_tracked, before[1])
    assert tracker["state"] == 5


def test_a_backward_after_preserved_runs_on_a_batch_norm_in_training_mode() -> None:
    # The workloads rerun a forward in one preserved block and its backward in another. A
    # BatchNorm in training mode saves its running statistics for the backward; put back in
    # place between the two, they must not fail autograd's check of saved tensors.
    norm = torch.nn.BatchNorm1d(4)
    norm.train()
    norm(torch.randn(8, 4))  # training's own step moved the statistics
    before = {name: b.clone() for name, b in norm.named_buffers()}
    x = torch.randn(8, 4, requires_grad=True)
    with preserved([norm]):
        out = norm(x)
        assert not torch.equal(norm.running_mean, before["running_mean"])
    with preserved([norm]):
        (grad,) = torch.autograd.grad(out.sum(), [x])
    assert grad.shape == x.shape
    for name, b in norm.named_buffers():
        assert torch.equal(b, before[name]), name


def test_detached_copies_nested_values_keeping_float_gradients() -> None:
    x = torch.ones(2, requires_grad=True)
    ids = torch.arange(3)
    value = {"a": (x * 2, [ids, "text"]), "b": 7}
    copy = detached(value)
    y, (ids_copy, text) = copy["a"]
    assert y.requires_grad and y.is_leaf and y.grad_fn is None
    assert torch.equal(y, x * 2) and y.data_ptr() != value["a"][0].data_ptr()
    assert not ids_copy.requires_grad and torch.equal(ids_copy, ids)
    assert text == "text" and copy["b"] == 7
    assert isinstance(copy["a"], tuple) and isinstance(copy["a"][1], list)
    ids_copy += 1  # a copy: the training's tensor is untouched
    assert torch.equal(ids, torch.arange(3))


def test_with_grad_makes_fresh_leaves_with_the_captured_flags() -> None:
    upstream = torch.ones(2, requires_grad=True)  # a parameter of an earlier stage
    activation = upstream * 3
    tokens = torch.arange(2)
    leaf, same_tokens, flag = with_grad((activation, tokens, True))
    assert leaf.is_leaf and leaf.requires_grad and torch.equal(leaf, activation)
    assert not same_tokens.requires_grad and flag is True
    (leaf * 2).sum().backward()
    assert leaf.grad is not None and upstream.grad is None  # the rerun's graph ends at its leaf


def test_flatten_finds_every_tensor_in_order() -> None:
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    found = flatten_tensors({"x": [a, ("skip", b)], "y": {"z": c}, "n": None})
    assert [t.item() for t in found] == [0.0, 1.0, 2.0]
    assert flatten_tensors(3) == [] and flatten_tensors(a) == [a]
