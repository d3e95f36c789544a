"""The rank-side client: perseus inside every pipeline-stage process of a training job.

::

    import perseus.client

    rank = perseus.client.connect()            # settings from arguments or PERSEUS_* variables
    with rank.iteration():
        with rank.instruction("forward", microbatch=j, chunk=c): ...
        with rank.instruction("backward", microbatch=j, chunk=c): ...
    rank.close()                               # also at exit and on SIGTERM/SIGINT

Framework integrations: :mod:`perseus.client.torch_pipelining` (needs torch),
:mod:`perseus.client.megatron` (megatron-core) and :mod:`perseus.client.deepspeed`. GPU control:
:mod:`perseus.client.gpu` (NVML, dry-run) and :mod:`perseus.client.fake` (a modelled GPU).
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
