"""A small GPT-style model trained with torch.distributed.pipelining, planned by perseus.

Run on CPU (gloo) with the fake GPU, against a planner started with ``perseus serve``::

    eval "$(perseus job create --server http://127.0.0.1:7787 --stages 4 --microbatches 8)"
    PERSEUS_GPU=fake PERSEUS_CLOCK_LOG=clocks \\
        torchrun --nproc-per-node 4 examples/torch_pipeline.py \\
            --schedule 1f1b --microbatches 8 --steps 200

On GPUs the same command uses NCCL and ``PERSEUS_GPU=nvml`` (or ``dry-run`` to change
nothing). Without ``PERSEUS_SERVER`` it trains without perseus. ``--schedule
interleaved-1f1b`` puts two model chunks on every rank (create the job with
``--schedule interleaved-1f1b --virtual-stages 2``); so do the zero-bubble schedules, which
split each backward into its input and weight halves: ``interleaved-zb`` (chunks placed like
interleaved-1f1b), ``zbv`` and ``dualpipev`` (rank ``r`` of ``R`` holds stages ``r`` and
``2R - 1 - r``, a V; DualPipeV needs at least ``2R`` microbatches). Create their jobs with the
same ``--schedule`` and ``--virtual-stages 2``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

import perseus.client
from perseus.client.integrations.torch_pipelining import instrument

SCHEDULES: dict[str, type] = {
    "1f1b": Schedule1F1B,
    "gpipe": ScheduleGPipe,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "interleaved-zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}


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


class StageModule(nn.Module):
    """One pipeline stage: the embedding on the first, the LM head on the last."""

    def __init__(self, index: int, stages: int, args: argparse.Namespace) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden) if index == 0 else None
        self.blocks = nn.ModuleList(Block(args.hidden, args.heads) for _ in range(args.layers))
        last = index == stages - 1
        self.norm = nn.LayerNorm(args.hidden) if last else None
        self.head = nn.Linear(args.hidden, args.vocab) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None and self.norm is not None:
            x = self.head(self.norm(x))
        return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="training iterations (default 100)")
    parser.add_argument("--microbatch-size", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1, help="transformer blocks per stage")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], help="default bfloat16 on GPUs, float32 on CPU"
    )
    parser.add_argument("--loss-log", help="write each step's loss here (last rank)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    world, me = dist.get_world_size(), dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))

    chunks = 1 if args.schedule in ("1f1b", "gpipe") else 2
    num_stages = world * chunks
    if args.schedule in ("zbv", "dualpipev"):
        indices = [me, num_stages - 1 - me]  # the V: down the ranks, then back up
    else:
        indices = [me + k * world for k in range(chunks)]
    # Build every stage from the same seed so the model does not depend on the world size.
    modules = {}
    for index in range(num_stages):
        module = StageModule(index, num_stages, args)
        if index in indices:
            modules[index] = module.to(device=device, dtype=dtype)
    stages = [PipelineStage(modules[i], i, num_stages, device) for i in indices]

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(
            logits.reshape(-1, args.vocab).float(), target.reshape(-1)
        )

    schedule_class = SCHEDULES[args.schedule]
    schedule = schedule_class(
        stages[0] if chunks == 1 else stages, n_microbatches=args.microbatches, loss_fn=loss_fn
    )

    rank = perseus.client.connect()
    instrument(rank, stages, schedule, microbatches=args.microbatches)

    parameters = [p for m in modules.values() for p in m.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.05)
    data = torch.Generator().manual_seed(args.seed + 1)
    batch = args.microbatches * args.microbatch_size
    first = 0 in indices
    last = num_stages - 1 in indices
    loss_log = open(args.loss_log, "w") if args.loss_log and last else None  # noqa: SIM115
    started = time.monotonic()
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (batch, args.sequence + 1), generator=data)
        x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        losses: list[torch.Tensor] = []
        with rank.iteration():
            if first and last:
                schedule.step(x, target=y, losses=losses)
            elif first:
                schedule.step(x)
            elif last:
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if last and losses:
            loss = torch.stack(losses).mean().item()
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
    dist.barrier()  # gloo can abort at exit when a peer tears down mid-transfer
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
