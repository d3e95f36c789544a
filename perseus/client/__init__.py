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

from perseus.client.rank import Rank, connect
from perseus.client.settings import ClientSettings, ProfileBudget, SettingsError, load_settings

__all__ = ["ClientSettings", "ProfileBudget", "Rank", "SettingsError", "connect", "load_settings"]
