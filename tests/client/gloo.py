"""A one-rank gloo process group on loopback, for tests of torch.distributed code in-process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo process group of world size 1 for the block (skips if one is already up)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    # An in-process store: no port to pick (one looked up free may be taken before the
    # group's TCP store binds it).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
