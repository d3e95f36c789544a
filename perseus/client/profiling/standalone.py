"""A synthetic transformer stage to profile outside training (``perseus profile``).

A stack of GPT-style blocks (pre-norm causal self-attention and a 4x MLP) in bf16 on a GPU
(float32 on the CPU): the workload that ``perseus profile`` (:mod:`perseus.cli.profile`) and
``benchmarks/gpu_validation.py`` measure. Needs torch, imported when a stage is built.

On a GPU the forward and the backward each run as one CUDA graph
(``torch.cuda.make_graphed_callables``) unless ``cuda_graphs`` is False. A small stage is
otherwise launch-bound: hundreds of short kernels whose pace is the host's, so its time and
power follow whatever else the host does (on an H200 a 16-block hidden-512 stage ran its
forward 42 % slower beside NVML reads). Graphed, one launch per instruction keeps the GPU busy
and the measurement repeatable.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from perseus.client.settings import SettingsError

__all__ = ["SyntheticStage"]

_log = logging.getLogger("perseus.client")


class SyntheticStage:
    """A GPT-style stage on one device: the profiling workload of ``perseus profile``."""

    def __init__(self, module: Any, batch: Any, device: Any, text: str) -> None:
        self._module = module
        self._batch = batch
        self._device = device
        self._text = text

    @property
    def module(self) -> Any:
        """The stack of blocks (an ``nn.Module``; graphed when built with CUDA graphs)."""
        return self._module

    @property
    def batch(self) -> Any:
        """The microbatch every forward runs on."""
        return self._batch

    @classmethod
    def build(cls, args: argparse.Namespace) -> SyntheticStage:
        """A stage sized by ``args`` as ``perseus profile`` parses them (``gpu``,
        ``gpu_index``, ``layers``, ``hidden``, ``heads``, ``sequence``, ``microbatch_size``;
        a size left None takes the GPU or CPU default; ``cuda_graphs``, if present and
        False, runs the module eagerly on a GPU too).

        Raises:
            ModuleNotFoundError: torch is not installed.
            SettingsError: A size is out of range.
        """
        import torch
        from torch import nn

        cuda = torch.cuda.is_available() and args.gpu != "fake"
        device = torch.device("cuda", args.gpu_index) if cuda else torch.device("cpu")
        dtype = torch.bfloat16 if cuda else torch.float32
        layers = args.layers or (4 if cuda else 2)
        hidden = args.hidden or (4096 if cuda else 128)
        heads = args.heads or (32 if cuda else 4)
        sequence = args.sequence or (2048 if cuda else 64)
        micro = args.microbatch_size or 2
        if hidden % heads:
            raise SettingsError(f"--hidden {hidden} is not a multiple of --heads {heads}")
        for name, value in (("layers", layers), ("sequence", sequence), ("microbatch-size", micro)):
            if value < 1:
                raise SettingsError(f"--{name}: must be at least 1")

        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.norm1 = nn.LayerNorm(hidden)
                self.attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
                self.norm2 = nn.LayerNorm(hidden)
                self.mlp = nn.Sequential(
                    nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
                )

            def forward(self, x: Any) -> Any:
                h = self.norm1(x)
                x = x + self.attention(h, h, h, need_weights=False, is_causal=False)[0]
                return x + self.mlp(self.norm2(x))

        torch.manual_seed(0)
        module: Any = nn.Sequential(*(Block() for _ in range(layers))).to(
            device=device, dtype=dtype
        )
        batch = torch.randn(micro, sequence, hidden, device=device, dtype=dtype)
        graphed = cuda and getattr(args, "cuda_graphs", True) is not False
        note = ", CUDA graphs" if graphed else ""
        if graphed:
            # One graph for the forward, one for the backward; the module's forward now
            # replays them (the sample's requires_grad must match every later input's).
            try:
                module = torch.cuda.make_graphed_callables(
                    module, (batch.detach().requires_grad_(True),)
                )
            except Exception as err:  # a build that cannot capture still profiles, eagerly
                torch.cuda.synchronize(device)
                note = f", eager (CUDA graph capture failed: {type(err).__name__}: {err})"
                _log.warning("perseus: stage runs eagerly%s", note)
        text = (
            f"{layers} blocks, hidden {hidden}, {heads} heads, {micro} x {sequence} tokens, "
            f"{str(dtype).removeprefix('torch.')} on {device}{note}"
        )
        return cls(module, batch, device, text)

    def describe(self) -> str:
        return self._text

    def warm_up(self) -> None:
        for _ in range(3):
            self.backward(self.forward())
        self.synchronize()

    def forward(self) -> object:
        x = self._batch.detach().requires_grad_(True)
        return self._module(x)

    def backward(self, handle: object) -> None:
        import torch

        out: Any = handle
        torch.autograd.backward(out, torch.ones_like(out))
        for p in self._module.parameters():
            p.grad = None

    def synchronize(self) -> None:
        import torch

        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
