"""A small GPT-style model trained with megatron-core's pipeline schedules, planned by perseus.

Run on CPU (gloo) with the fake GPU, against a planner started with ``perseus serve``::

    eval "$(perseus job create --server http://127.0.0.1:7787 --stages 4 --microbatches 8)"
    PERSEUS_GPU=fake PERSEUS_CLOCK_LOG=clocks \\
        torchrun --nproc-per-node 4 examples/megatron_pipeline.py \\
            --schedule 1f1b --microbatches 8 --steps 200

On GPUs the same command uses NCCL and ``PERSEUS_GPU=nvml`` (or ``dry-run`` to change
nothing). Without ``PERSEUS_SERVER`` it trains without perseus. ``--schedule
interleaved-1f1b`` puts two model chunks on every rank (create the job with
``--schedule interleaved-1f1b --virtual-stages 2``).

The model is plain torch modules (the same blocks as ``examples/torch_pipeline.py``) driven by
megatron-core's own schedules: ``get_forward_backward_func()`` picks 1F1B or interleaved 1F1B
from ``parallel_state``. The perseus lines are ``perseus.client.connect()`` and
``perseus.client.integrations.megatron.instrument(rank)``; nothing else in the loop knows about
perseus.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.enums import ModelType
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer import TransformerConfig
from torch import nn

import perseus.client
import perseus.client.integrations.megatron


class Block(nn.Module):
    """A pre-norm transformer block (causal self-attention and an MLP), batch first."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class StageModule(nn.Module):
    """One model chunk: the embedding on the first, the LM head on the last.

    Megatron's schedules pass activations between stages as ``[sequence, batch, hidden]``
    through ``set_input_tensor``; they read ``config`` and ``model_type`` from the module.
    """

    def __init__(
        self, index: int, stages: int, args: argparse.Namespace, config: TransformerConfig
    ) -> None:
        super().__init__()
        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        self.input_tensor: torch.Tensor | None = None
        self.embed = nn.Embedding(args.vocab, args.hidden) if index == 0 else None
        self.blocks = nn.ModuleList(Block(args.hidden, args.heads) for _ in range(args.layers))
        last = index == stages - 1
        self.norm = nn.LayerNorm(args.hidden) if last else None
        self.head = nn.Linear(args.hidden, args.vocab) if last else None

    def set_input_tensor(self, input_tensor: list[torch.Tensor | None] | torch.Tensor) -> None:
        self.input_tensor = input_tensor[0] if isinstance(input_tensor, list) else input_tensor

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(tokens)
        else:
            assert self.input_tensor is not None  # set by the schedule on every later stage
            x = self.input_tensor.transpose(0, 1)
        for block in self.blocks:
            x = block(x)
        if self.head is not None and self.norm is not None:
            return self.head(self.norm(x))  # logits [batch, sequence, vocab]
        return x.transpose(0, 1).contiguous()


def cpu_only_test_shim() -> None:
    """CPU-ONLY TEST SUPPORT, never needed on GPUs: run megatron's schedules without CUDA.

    megatron-core 0.16's schedules create their token counter with ``device="cuda"``, and its
    point-to-point layer asks ``torch.cuda.current_device()`` and calls
    ``torch.cuda.synchronize()``. On a machine without CUDA those three become CPU (no-op)
    equivalents; nothing else changes.
    """
    from megatron.core.pipeline_parallel import schedules

    class CpuTorch:
        """``torch`` as ``schedules`` sees it, with "cuda" tensors made on the CPU."""

        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        @staticmethod
        def zeros(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
            return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)

    schedules.torch = CpuTorch()  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=["1f1b", "interleaved-1f1b"], default="1f1b")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="training iterations (default 100)")
    parser.add_argument("--microbatch-size", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1, help="transformer blocks per chunk")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loss-log", help="write each step's loss here (last stage)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    world = dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        cpu_only_test_shim()
    torch.manual_seed(args.seed)

    chunks = 2 if args.schedule == "interleaved-1f1b" else 1
    parallel_state.initialize_model_parallel(
        pipeline_model_parallel_size=world,
        virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None,
    )
    stage = parallel_state.get_pipeline_model_parallel_rank()
    # The schedules read the parallel sizes, the activation shape and dtype from here.
    config = TransformerConfig(
        num_layers=world * chunks * args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        pipeline_model_parallel_size=world,
        virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None,
        pipeline_dtype=torch.float32,
    )

    rank = perseus.client.connect()
    perseus.client.integrations.megatron.instrument(
        rank, config=config, microbatches=args.microbatches
    )

    # Megatron's placement: chunk c of pipeline rank g is virtual stage c * world + g. Build
    # every virtual stage from the same seed so the model does not depend on the world size.
    num_stages = world * chunks
    indices = [stage + c * world for c in range(chunks)]
    built = {}
    for index in range(num_stages):
        module = StageModule(index, num_stages, args, config)
        if index in indices:
            built[index] = module.to(device)
    model = [built[i] for i in indices]
    last = num_stages - 1 in indices

    def loss_func(
        target: torch.Tensor, logits: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), target.reshape(-1))
        return loss, {"loss": loss.detach().clone()}  # the schedule scales loss in place

    def forward_step(data: Iterator[tuple[torch.Tensor, torch.Tensor]], chunk: nn.Module) -> Any:
        tokens, target = next(data)
        return chunk(tokens), partial(loss_func, target)

    parameters = [p for m in model for p in m.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.05)
    generator = torch.Generator().manual_seed(args.seed + 1)
    batch = args.microbatches * args.microbatch_size
    loss_log = open(args.loss_log, "w") if args.loss_log and last else None  # noqa: SIM115
    started = time.monotonic()
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (batch, args.sequence + 1), generator=generator)
        x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        microbatches = list(
            zip(x.split(args.microbatch_size), y.split(args.microbatch_size), strict=True)
        )
        forward_backward = get_forward_backward_func()
        losses = forward_backward(
            forward_step_func=forward_step,
            data_iterator=[iter(microbatches) for _ in model] if chunks > 1 else iter(microbatches),
            model=model if chunks > 1 else model[0],
            num_microbatches=args.microbatches,
            seq_length=args.sequence,
            micro_batch_size=args.microbatch_size,
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if last and losses:
            loss = torch.stack([item["loss"] for item in losses]).mean().item()
            if loss_log is not None:
                print(f"{step} {loss!r}", file=loss_log, flush=True)
            if step % 10 == 0 or step == args.steps - 1:
                print(
                    f"step {step} loss {loss:.4f} plan {rank.plan_version} "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    rank.close()
    if loss_log is not None:
        loss_log.close()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
