"""The synthetic transformer stage ``perseus profile`` measures, built tiny on the CPU: its
sizes and their checks, and a forward and backward that leave no gradients behind."""

from __future__ import annotations

import argparse

import pytest

from perseus.client.profiling.standalone import SyntheticStage
from perseus.client.settings import SettingsError

torch = pytest.importorskip("torch")

TINY = {
    "gpu": "fake",  # on the CPU even where there is CUDA
    "gpu_index": 0,
    "layers": 2,
    "hidden": 16,
    "heads": 2,
    "sequence": 8,
    "microbatch_size": 3,
}


def build(**sizes: object) -> SyntheticStage:
    return SyntheticStage.build(argparse.Namespace(**(TINY | sizes)))


def test_a_tiny_stage_runs_forward_and_backward_on_the_cpu() -> None:
    stage = build()
    assert stage.describe() == "2 blocks, hidden 16, 2 heads, 3 x 8 tokens, float32 on cpu"
    assert tuple(stage.batch.shape) == (3, 8, 16)
    assert len(stage.module) == 2
    out = stage.forward()
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (3, 8, 16)
    assert out.requires_grad
    stage.backward(out)
    assert all(p.grad is None for p in stage.module.parameters())  # nothing accumulates
    stage.warm_up()
    stage.synchronize()


def test_the_same_sizes_build_the_same_stage() -> None:
    a, b = build(), build()
    for pa, pb in zip(a.module.parameters(), b.module.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert torch.equal(a.batch, b.batch)


def test_sizes_left_out_take_the_cpu_defaults() -> None:
    stage = build(layers=None, hidden=None, heads=None, sequence=None, microbatch_size=None)
    assert stage.describe() == "2 blocks, hidden 128, 4 heads, 2 x 64 tokens, float32 on cpu"


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"hidden": 18, "heads": 4}, "--hidden 18 is not a multiple of --heads 4"),
        ({"layers": -1}, "--layers: must be at least 1"),
        ({"sequence": -2}, "--sequence: must be at least 1"),
        ({"microbatch_size": -3}, "--microbatch-size: must be at least 1"),
    ],
)
def test_sizes_out_of_range_are_a_settings_error(sizes: dict[str, int], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        build(**sizes)
