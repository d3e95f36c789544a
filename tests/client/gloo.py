"""A one-rank gloo process group on loopback, for tests of torch.distributed code in-process."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo process group of world size 1 for the block (skips if one is already up)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
