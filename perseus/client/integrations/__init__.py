"""Framework integrations: one ``instrument(rank, ...)`` per training framework.

- :mod:`perseus.client.integrations.torch_pipelining`: ``torch.distributed.pipelining``;
- :mod:`perseus.client.integrations.megatron`: megatron-core's pipeline schedules;
- :mod:`perseus.client.integrations.deepspeed`: DeepSpeed's ``PipelineEngine``;
- :mod:`perseus.client.integrations.tensors`: what they share (detaching, restoring state).

Each needs its framework and imports it only when imported itself; importing this package
imports none of them. They call the rank's public hooks only (``iteration``, ``instruction``,
``bind``).
"""

from __future__ import annotations

__all__: list[str] = []
