"""The rank-side client: perseus inside every pipeline-stage process of a training job.

::

    import perseus.client

    rank = perseus.client.connect()            # settings from arguments or PERSEUS_* variables
    with rank.iteration():
        with rank.instruction("forward", microbatch=j, chunk=c): ...
        with rank.instruction("backward", microbatch=j, chunk=c): ...
    rank.close()                               # also at exit and on SIGTERM/SIGINT

Framework integrations live in :mod:`perseus.client.integrations` (``torch_pipelining`` needs
torch, ``megatron`` megatron-core, ``deepspeed`` DeepSpeed; the old paths
``perseus.client.torch_pipelining`` etc. still work, with a DeprecationWarning). GPU control:
:mod:`perseus.client.gpu.control` (NVML, dry-run; ``open_gpu`` also makes the modelled GPU of
:mod:`perseus.client.gpu.fake`). The rank's own pieces: :mod:`~perseus.client.rank` (the training
thread's hooks), :mod:`~perseus.client.lifecycle` (``connect``, exit and signal hooks),
:mod:`~perseus.client.session`, :mod:`~perseus.client.reporter`,
:mod:`~perseus.client.profiling.online`.
Importing this package imports neither torch nor any training framework.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus.client.lifecycle import connect
    from perseus.client.rank import Rank
    from perseus.client.settings import (
        ClientSettings,
        ProfileBudget,
        SettingsError,
        load_settings,
    )

__all__ = ["ClientSettings", "ProfileBudget", "Rank", "SettingsError", "connect", "load_settings"]

# Imported on first use (PEP 562), so that the command line can build the parsers of its
# client commands (``perseus job --help``) where the client's extras (httpx) are missing.
_WHERE = {
    "Rank": "perseus.client.rank",
    "connect": "perseus.client.lifecycle",
    "ClientSettings": "perseus.client.settings",
    "ProfileBudget": "perseus.client.settings",
    "SettingsError": "perseus.client.settings",
    "load_settings": "perseus.client.settings",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
