"""The profiling workload of a Megatron rank (CPU, small modules standing in for model
chunks): each chunk's first call captured, every chunk rerun in order on it, with no gradient
reaching the parameters and the random-number state and buffers as they were."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from perseus.client.integrations.megatron_workload import ChunkWorkload  # noqa: E402


class Chunk(torch.nn.Module):
    """A model chunk: takes the previous stage's activation through ``set_input_tensor``."""

    def __init__(self, name: str, seen: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.name = name
        self.linear = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.dropout = torch.nn.Dropout(0.5)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.seen = seen
        self.input: Any = None
        self.scales: list[float] = []

    def set_input_tensor(self, tensors: list[Any]) -> None:
        self.seen.append((self.name, tensors))
        self.input = tensors[0]

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        h = x if self.input is None else self.input
        self.calls += 1  # a buffer the forward moves, as running statistics do
        self.scales.append(scale)
        return self.dropout(self.norm(self.linear(h))) * scale


def captured(chunks: list[Chunk], inputs: list[Any]) -> ChunkWorkload:
    """A workload that watched each chunk's first (real) call."""
    workload = ChunkWorkload()
    for i, (chunk, received) in enumerate(zip(chunks, inputs, strict=True)):
        assert workload.wants(i)
        handle = workload.watch(i, chunk, received)
        chunk(torch.randn(8, 4), scale=2.0)
        chunk(torch.randn(8, 4), scale=3.0)  # a later call is not captured
        handle.remove()
        assert not workload.wants(i)
    return workload


def test_ready_once_every_local_chunk_is_captured() -> None:
    seen: list[tuple[str, Any]] = []
    chunks = [Chunk("a", seen), Chunk("b", seen)]
    workload = ChunkWorkload()
    assert workload.ready() is None  # the chunk count is not known yet
    workload.chunks = 2
    workload.watch(0, chunks[0], None)
    chunks[0](torch.randn(8, 4))
    assert workload.ready() is None
    workload.watch(1, chunks[1], None)
    chunks[1](torch.randn(8, 4))
    assert workload.ready() is workload


def test_reruns_run_every_chunk_in_order_and_leave_no_trace() -> None:
    seen: list[tuple[str, Any]] = []
    chunks = [Chunk("first", seen), Chunk("second", seen)]
    activation = torch.randn(8, 4, requires_grad=True)  # what the second chunk received
    workload = captured(chunks, [None, [activation]])
    workload.chunks = 2
    for chunk in chunks:
        chunk.input = None
        chunk.train()
    seen.clear()
    calls = [int(c.calls) for c in chunks]
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    handle = workload.forward()
    workload.backward(handle)
    workload.synchronize()
    assert [name for name, _ in seen] == ["first", "second"]  # in chunk order
    first_input, second_input = seen[0][1], seen[1][1]
    assert first_input == [None]
    assert torch.equal(second_input[0], activation) and second_input[0].requires_grad
    assert second_input[0] is not activation  # a detached copy
    assert all(p.grad is None for c in chunks for p in c.parameters())
    assert activation.grad is None
    assert [int(c.calls) for c in chunks] == calls
    assert torch.equal(torch.rand(3), expected)  # training draws as if nothing had run
    assert [c.scales[-1] for c in chunks] == [2.0, 2.0]  # the first call's keywords


def test_a_chunk_whose_output_needs_no_gradient_is_skipped() -> None:
    seen: list[tuple[str, Any]] = []
    chunk = Chunk("frozen", seen)
    for p in chunk.parameters():
        p.requires_grad_(False)
    workload = captured([chunk], [None])
    workload.chunks = 1
    chunk.input = None
    workload.backward(workload.forward())  # nothing to differentiate: no error


def test_a_batch_norm_in_training_mode_reruns() -> None:
    # The buffers put back after the forward are tensors the BatchNorm saved for its
    # backward: the rerun's backward still runs, and the statistics end as training left them.
    class Normed(Chunk):
        def __init__(self, seen: list[tuple[str, Any]]) -> None:
            super().__init__("normed", seen)
            self.norm = torch.nn.BatchNorm1d(4)  # type: ignore[assignment]

    chunk = Normed([])
    workload = captured([chunk], [None])
    workload.chunks = 1
    chunk.input = None
    before = {name: b.clone() for name, b in chunk.named_buffers()}
    workload.backward(workload.forward())
    for name, b in chunk.named_buffers():
        assert torch.equal(b, before[name]), name
    assert all(p.grad is None for p in chunk.parameters())
