"""examples/torch_pipeline.py with a CUDA-event trace of every instruction (a diagnostic).

Run under torchrun exactly like the example; with ``PERSEUS_TRACE_DIR`` set, each rank writes
``DIR/trace{R}.json``: per iteration and instruction, the device time from the previous
instruction's end to this one's start (the gap) and the instruction's own duration, both from
CUDA events (read after the run, so the trace adds no synchronization to the training
thread). ``benchmarks/gpu_validation.py pipeline`` uses it to see where a pipeline's time goes
that the profile does not hold.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import perseus.client.torch_pipelining as tp
import torch

_events: list[tuple[str, int, Any, Any]] = []
_wrap = tp._wrap


class _HostEvent:
    """The CPU stand-in for a CUDA event (the host is the device there)."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.at - self.at) * 1e3


Event: Any = torch.cuda.Event if torch.cuda.is_available() else _HostEvent


def _traced_wrap(rank: Any, stage: Any, chunk: int | None) -> None:
    _wrap(rank, stage, chunk)
    forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

    def traced(kind: str, inner: Any) -> Any:
        def call(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            start, end = Event(enable_timing=True), Event(enable_timing=True)
            start.record()
            try:
                return inner(chunk_id, *args, **kwargs)
            finally:
                end.record()
                _events.append((kind, chunk_id, start, end))

        return call

    stage.forward_one_chunk = traced("forward", forward)
    stage.backward_one_chunk = traced("backward", backward)


def _dump() -> None:
    directory = os.environ.get("PERSEUS_TRACE_DIR")
    if not directory or not _events:
        return
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    rows = []
    previous_end = None
    for kind, microbatch, start, end in _events:
        rows.append(
            {
                "instruction": kind,
                "microbatch": microbatch,
                "gap_ms": None if previous_end is None else previous_end.elapsed_time(start),
                "duration_ms": start.elapsed_time(end),
            }
        )
        previous_end = end
    rank = os.environ.get("RANK", "0")
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"trace{rank}.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    tp._wrap = _traced_wrap
    example = Path(__file__).resolve().parents[1] / "examples" / "torch_pipeline.py"
    sys.argv = [str(example), *sys.argv[1:]]
    try:
        runpy.run_path(str(example), run_name="__main__")
    except SystemExit as done:
        _dump()
        raise SystemExit(done.code) from None
    _dump()
