"""What the client takes from torch: the process group when one is up, and a recorder of CUDA
events at boundaries only where there is CUDA and a real GPU (CPU here; torch optional)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from perseus.client.settings import ClientSettings
from perseus.client.torch_env import cuda_events, distributed

from .gloo import one_rank_group

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def test_without_torch_there_is_neither(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch...` fail
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    assert distributed() is None
    assert cuda_events(ClientSettings(gpu="nvml")) is None


def test_the_fake_gpu_takes_the_host_call_as_the_boundary() -> None:
    assert cuda_events(ClientSettings(gpu="fake")) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_there_are_no_events() -> None:
    assert cuda_events(ClientSettings(gpu="nvml")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_with_cuda_each_boundary_records_an_event() -> None:
    record = cuda_events(ClientSettings(gpu="nvml"))
    assert record is not None
    event = record()
    event.synchronize()
    assert isinstance(event, torch.cuda.Event)


@pytest.fixture
def group() -> Iterator[None]:
    with one_rank_group():
        yield


def test_the_process_group_only_once_it_is_up(group: None) -> None:
    found = distributed()
    assert found is dist and found.get_rank() == 0 and found.get_world_size() == 1


def test_no_process_group_is_none() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    assert distributed() is None
