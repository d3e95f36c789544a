"""The client's cost per instruction on the training thread.

    python benchmarks/client_overhead.py            # 5 runs of 100,000 instructions per mode
    python benchmarks/client_overhead.py --quick    # 3 runs of 20,000

Times `with rank.instruction(kind, microbatch): pass` (the call, enter and exit) one
instruction at a time with `time.perf_counter_ns`, in four modes:

- `off`: perseus off, `Rank(ClientSettings())` (no server): the hooks are a shared nullcontext;
- `plan, host`: a real `Rank` following a plan whose clock alternates 1980/1200 MHz, so every
  instruction changes the clock; the hook stamps the host time and queues the instruction for
  the controller thread (as for a CPU or fake GPU), which requests the next clock ahead;
- `plan, event`: the same with a boundary event: the hook records one (a trivial object here;
  a `torch.cuda.Event` on a GPU) and the controller thread waits for it;
- `nullcontext`: a bare `with contextlib.nullcontext(): pass`, the peer baseline (what any
  context manager costs, timer included).

The ranks are the real thing: their planner is a `PlannerClient` over `httpx.MockTransport`
answering what the session thread asks (job, registration, the saved example profile, a plan,
then long polls that wait like the server's) and the reporter's iteration reports; the meter
thread reads the GPU every 0.1 s. The GPU is a do-nothing `GpuControl` whose setters store the
value (a memory write, like the fake's). A plan iteration is 10,000 instructions, so the
reporter posts about ten reports per run, not one per few milliseconds. Iteration boundaries are
not timed. The figures are the medians over the runs of each run's median and 99th percentile;
modes are interleaved run by run so that a change of host load hits them alike. "GPU sets /
instr" counts the clock locks the GPU received per timed instruction. "cuda sync" counts calls
to `torch.cuda.synchronize` and `torch.cuda.Stream.synchronize` (wrapped with a counter) during
the timed instructions: the hooks must issue none ("n/a" without torch).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

import httpx

from perseus.client.api.client import PlannerClient
from perseus.client.rank import Rank
from perseus.client.settings import ClientSettings
from perseus.schemas import (
    IterationAccepted,
    JobCounts,
    JobCreate,
    JobView,
    NoSlowdownPolicy,
    PlanInstruction,
    PlanResponse,
    ProfileAccepted,
    RankRegistered,
)

SEED = 0
MICROBATCHES = 5_000  # 10,000 instructions per iteration
CLOCKS_MHZ = (1980, 1200)
TARGET_MEDIAN_US = 20.0
TARGET_P99_US = 100.0
JOB = "bench"
SERVER = "http://planner.bench"


class StoreGpu:
    """A GpuControl that does nothing: setters store the value, the counter is 150 W."""

    index = 0
    name = "do-nothing GPU"
    can_set_clocks = True

    def __init__(self) -> None:
        self.locked_mhz: int | None = None
        self.locks = 0
        self._origin_s = time.perf_counter()

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return tuple(range(1980, 344, -15))

    def default_clock_mhz(self) -> int:
        return 1980

    def current_clock_mhz(self) -> int:
        return self.locked_mhz or 1980

    def applied_clock_mhz(self) -> int:
        return self.locked_mhz or 1980

    def lock_clock(self, frequency_mhz: int) -> None:
        self.locked_mhz = frequency_mhz
        self.locks += 1

    def reset_clock(self) -> None:
        self.locked_mhz = None

    def energy_j(self) -> float:
        return 150.0 * (time.perf_counter() - self._origin_s)

    def power_w(self) -> float:
        return 150.0


class TrivialEvent:
    """A boundary event that is always reached."""

    __slots__ = ()

    def synchronize(self) -> None:
        pass


def _plan() -> PlanResponse:
    instructions: list[PlanInstruction] = []
    for j in range(MICROBATCHES):
        for kind in ("forward", "backward"):
            k = len(instructions)
            instructions.append(
                PlanInstruction(instruction=kind, microbatch=j, frequency_mhz=CLOCKS_MHZ[k % 2])
            )
    return PlanResponse(
        job_id=JOB, version=1, stage=0, time_s=1.0, energy_j=1.0, instructions=instructions
    )


class MockPlanner:
    """Answers the rank's session and reporter threads the way the planner server would."""

    def __init__(self) -> None:
        self.released = threading.Event()
        spec = JobCreate(
            schedule="1f1b",
            stages=1,
            microbatches=MICROBATCHES,
            data_parallel=1,
            tensor_parallel=1,
        )
        self._job = JobView(
            job_id=JOB,
            name=None,
            state="ready",
            reason=None,
            spec=spec,
            policy=NoSlowdownPolicy(kind="no-slowdown"),
            straggler=None,
            version=1,
            counts=JobCounts(
                ranks_expected=1,
                ranks_registered=1,
                profiles_reported=1,
                stages_profiled=1,
                iterations_reported=0,
            ),
            frontier_points=None,
            planning_s=None,
            chosen=None,
            telemetry=None,
        ).model_dump_json()
        self._plan = _plan().model_dump_json()

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix(f"/v1/jobs/{JOB}")
        if request.method == "GET" and path == "":
            return httpx.Response(200, text=self._job)
        if request.method == "POST" and path == "/ranks":
            body = RankRegistered(rank=0, state="profiling", ranks_registered=1)
            return httpx.Response(200, text=body.model_dump_json())
        if request.method == "POST" and path == "/profiles":
            body2 = ProfileAccepted(rank=0, state="ready", profiles_reported=1, planning=False)
            return httpx.Response(200, text=body2.model_dump_json())
        if request.method == "GET" and path == "/plan":
            if "If-None-Match" not in request.headers:
                return httpx.Response(200, text=self._plan, headers={"ETag": '"1"'})
            self.released.wait(float(request.url.params.get("wait_s", "0")))  # a long poll
            return httpx.Response(304)
        if request.method == "POST" and path == "/iterations":
            body3 = IterationAccepted(rank=0, iteration=0, version=1)
            return httpx.Response(200, text=body3.model_dump_json())
        return httpx.Response(404, json={"detail": "no such route", "error": "JobNotFound"})


class PlanRank:
    """A Rank following the benchmark plan, with its GPU and planner."""

    def __init__(self, event_mode: bool, profile_path: str) -> None:
        self.gpu = StoreGpu()
        self.planner = MockPlanner()
        http = httpx.Client(base_url=SERVER, transport=httpx.MockTransport(self.planner.handle))
        settings = ClientSettings(
            server=SERVER, job=JOB, token="t", rank=0, stage=0, profile_path=profile_path
        )
        self.rank = Rank(
            settings,
            gpu=self.gpu,
            planner=PlannerClient(http, JOB, "t"),
            record_event=TrivialEvent if event_mode else None,
        )

    def wait_for_plan(self, keys: list[tuple[str, int]]) -> None:
        deadline = time.monotonic() + 30.0
        while self.rank.plan_version is None:
            if time.monotonic() > deadline or self.rank.failure is not None:
                raise SystemExit(f"the rank took no plan: {self.rank.failure}")
            time.sleep(0.01)
            _iterate(self.rank, keys, None)
        _iterate(self.rank, keys, None)  # one full iteration on the plan
        while True:  # let an event-mode controller catch up with the warm-up's boundaries
            locks = self.gpu.locks
            time.sleep(0.05)
            if self.gpu.locks == locks:
                return

    def close(self) -> None:
        self.planner.released.set()
        self.rank.close()


def _iterate(rank: Rank, keys: list[tuple[str, int]], samples: list[int] | None) -> None:
    clock = time.perf_counter_ns
    with rank.iteration():
        if samples is None:
            for kind, j in keys:
                with rank.instruction(kind, j):
                    pass
            return
        append = samples.append
        for kind, j in keys:
            t0 = clock()
            with rank.instruction(kind, j):
                pass
            append(clock() - t0)


def _bare(keys: list[tuple[str, int]], samples: list[int]) -> None:
    clock = time.perf_counter_ns
    append = samples.append
    for _kind, _j in keys:
        t0 = clock()
        with contextlib.nullcontext():
            pass
        append(clock() - t0)


@contextlib.contextmanager
def _counting_cuda_syncs() -> Iterator[list[int] | None]:
    """Count ``torch.cuda.synchronize`` and ``Stream.synchronize`` calls inside (None: no torch)."""
    try:
        import torch
    except ImportError:
        yield None
        return
    count = [0]
    device_sync = torch.cuda.synchronize
    stream_sync = torch.cuda.Stream.synchronize

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return original(*args, **kwargs)

        return wrapper

    torch.cuda.synchronize = counted(device_sync)
    torch.cuda.Stream.synchronize = counted(stream_sync)  # type: ignore[method-assign]
    try:
        yield count
    finally:
        torch.cuda.synchronize = device_sync
        torch.cuda.Stream.synchronize = stream_sync  # type: ignore[method-assign]


def _percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e3


HEADER = (
    "mode",
    "instr/run",
    "runs",
    "median us",
    "p99 us",
    "target",
    "meets",
    "GPU sets / instr",
    "cuda sync",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs of 20,000 instructions")
    args = parser.parse_args()
    random.seed(SEED)
    runs, iterations = (3, 2) if args.quick else (5, 10)
    keys = [(kind, j) for j in range(MICROBATCHES) for kind in ("forward", "backward")]
    per_run = iterations * len(keys)

    with _counting_cuda_syncs() as syncs, contextlib.ExitStack() as stack:
        profile = stack.enter_context(
            resources.as_file(resources.files("perseus") / "data" / "example_profile.csv")
        )
        off = Rank(ClientSettings())
        planned = {
            "plan, host": PlanRank(event_mode=False, profile_path=str(profile)),
            "plan, event": PlanRank(event_mode=True, profile_path=str(profile)),
        }
        for p in planned.values():
            stack.callback(p.close)
            p.wait_for_plan(keys)
        modes = ("off", "plan, host", "plan, event", "nullcontext")
        medians: dict[str, list[float]] = {m: [] for m in modes}
        p99s: dict[str, list[float]] = {m: [] for m in modes}
        sync_calls = dict.fromkeys(modes, 0)
        locks_before = {m: p.gpu.locks for m, p in planned.items()}
        for _ in range(runs):
            for mode in modes:
                samples: list[int] = []
                before = syncs[0] if syncs is not None else 0
                for _ in range(iterations):
                    if mode == "nullcontext":
                        _bare(keys, samples)
                    else:
                        rank = off if mode == "off" else planned[mode].rank
                        _iterate(rank, keys, samples)
                sync_calls[mode] += (syncs[0] if syncs is not None else 0) - before
                samples.sort()
                medians[mode].append(_percentile(samples, 0.5))
                p99s[mode].append(_percentile(samples, 0.99))
        for p in planned.values():
            p.close()  # drains the event-mode controller's queue
        failures = {m: p.rank.failure for m, p in planned.items() if p.rank.failure}

    rows = []
    for mode in modes:
        median_us = statistics.median(medians[mode])
        p99_us = statistics.median(p99s[mode])
        sets = "-"
        if mode in planned:
            sets = f"{(planned[mode].gpu.locks - locks_before[mode]) / (runs * per_run):.2f}"
        if mode == "nullcontext":
            target, meets = "peer", "-"
        else:
            target = f"<= {TARGET_MEDIAN_US:g} / {TARGET_P99_US:g}"
            meets = "yes" if median_us <= TARGET_MEDIAN_US and p99_us <= TARGET_P99_US else "NO"
        sync = "n/a" if syncs is None else ("-" if mode not in planned else str(sync_calls[mode]))
        rows.append(
            (
                mode,
                f"{per_run:,}",
                str(runs),
                f"{median_us:.2f}",
                f"{p99_us:.2f}",
                target,
                meets,
                sets,
                sync,
            )
        )
    widths = [max(len(r[i]) for r in (HEADER, *rows)) for i in range(len(HEADER))]
    print("perseus client: cost of one `with rank.instruction(...)` on the training thread")
    for i, r in enumerate((HEADER, *rows)):
        cells = [
            c.ljust(w) if j == 0 else c.rjust(w)
            for j, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        print("  ".join(cells))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for mode, failure in failures.items():
        print(f"{mode}: the rank stopped following its plan: {failure}")


if __name__ == "__main__":
    main()
