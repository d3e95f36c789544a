"""A small GPT-style model trained with DeepSpeed pipeline parallelism, planned by perseus.

Run on CPU (gloo) with the fake GPU, against a planner started with ``perseus serve``::

    eval "$(perseus job create --server http://127.0.0.1:7787 --stages 4 --microbatches 8)"
    PERSEUS_GPU=fake PERSEUS_CLOCK_LOG=clocks \\
        torchrun --nproc-per-node 4 examples/deepspeed_pipeline.py --microbatches 8 --steps 200

On GPUs the same command uses NCCL and ``PERSEUS_GPU=nvml`` (or ``dry-run`` to change
nothing). Without ``PERSEUS_SERVER`` it trains without perseus. DeepSpeed's ``PipelineEngine``
runs one schedule, 1F1B (``TrainSchedule``), so ``--schedule`` takes only ``1f1b``. Every
process is one pipeline stage (no data parallelism here).

The two perseus lines are ``rank = perseus.client.connect()`` and
``perseus.client.integrations.deepspeed.instrument(rank, engine)``; every
``engine.train_batch()`` is then one planned iteration.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Iterator

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import PipelineModule
from torch import nn

import perseus.client
import perseus.client.integrations.deepspeed


class Embedding(nn.Module):
    """Token embedding (the first stage's first layer)."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens)


class Block(nn.Module):
    """A pre-norm transformer block (causal self-attention and an MLP)."""

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


class Head(nn.Module):
    """Final norm and LM head (the last stage's last layer)."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


def skip_shm_op_build() -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce op on CPU (about a minute).

    ``deepspeed.comm`` re-exports names that hide its ``torch`` submodule, hence importlib.
    Gloo does not need the op; without it DeepSpeed uses plain ``torch.distributed``.
    """
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    comm_torch.build_shm_op = lambda: None


def batches(
    args: argparse.Namespace, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless microbatches of random tokens; the same on every rank (first and last read)."""
    generator = torch.Generator().manual_seed(args.seed + 1)
    while True:
        tokens = torch.randint(
            0, args.vocab, (args.microbatch_size, args.sequence + 1), generator=generator
        )
        yield tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=["1f1b"], default="1f1b")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="training iterations (default 100)")
    parser.add_argument("--microbatch-size", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1, help="transformer blocks per stage")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loss-log", help="write each step's loss here (last stage)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    cuda = torch.cuda.is_available()
    if not cuda:
        skip_shm_op_build()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    world = dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)

    # Build every layer from the same seed so the model does not depend on the world size;
    # PipelineModule keeps this stage's layers (each stage gets --layers blocks).
    layers: list[nn.Module] = [Embedding(args.vocab, args.hidden)]
    layers += [Block(args.hidden, args.heads) for _ in range(args.layers * world)]
    layers.append(Head(args.hidden, args.vocab))

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, args.vocab), target.reshape(-1))

    module = PipelineModule(
        layers=layers, num_stages=world, loss_fn=loss_fn, partition_method="type:Block"
    )
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.05)
    config = {
        "train_micro_batch_size_per_gpu": args.microbatch_size,
        "gradient_accumulation_steps": args.microbatches,
        "train_batch_size": args.microbatch_size * args.microbatches,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)

    rank = perseus.client.connect()
    perseus.client.integrations.deepspeed.instrument(rank, engine)

    data = batches(args, device)
    last = engine.is_last_stage()
    loss_log = open(args.loss_log, "w") if args.loss_log and last else None  # noqa: SIM115
    started = time.monotonic()
    for step in range(args.steps):
        loss = engine.train_batch(data).item()
        if last:
            if loss_log is not None:
                print(f"{step} {loss:.6f}", file=loss_log, flush=True)
            if step % 10 == 0 or step == args.steps - 1:
                print(
                    f"step {step} loss {loss:.4f} plan {rank.plan_version} "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    rank.close()
    if loss_log is not None:
        loss_log.close()
    # Without this barrier a stage that finishes first can tear the groups down while a
    # peer's last gloo send is in flight (seen on CPU: "terminate called" in 2 of 10 runs).
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
