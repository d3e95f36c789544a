"""The client on real GPUs: profiler accuracy, hook overhead, and a two-GPU NCCL pipeline.

    python benchmarks/gpu_validation.py accuracy --out results/     # one GPU
    python benchmarks/gpu_validation.py overhead --out results/     # one GPU
    python benchmarks/gpu_validation.py pipeline --out results/     # two GPUs, NCCL
    python benchmarks/gpu_validation.py all --out results/

Read-only on the GPU: the clock controller runs in dry-run mode (it logs what it would set),
and every reading is an NVML query. Nothing changes a clock, a power limit or any other
setting, so the profiler measures at the clock the GPU runs by itself, and every figure is
printed with the SM clock and power seen while it was taken. ``--gpu fake`` runs the same
code on the CPU with the modelled GPU (to check the script; its numbers mean nothing).

accuracy   A bf16 GPT-style stage in four sizes (two at the H200's 700 W limit, two under
           it; ``-eager`` after a size runs it without CUDA graphs), forward and
           forward+backward. Truth: steady loops of ``--truth-s`` seconds, time from CUDA
           events around the whole loop, energy from counter updates caught while the GPU is
           idle just before and just after it (less the idle energy between those updates
           and the loop), so nothing reads the counter while the loop runs. The profiler:
           perseus's ClockSweep at the current clock (steady loops too, so the duty cycle is
           the same). Also the blocking power the profiler estimates against the GPU's power
           while a stream waits on an event behind a spinning kernel.
overhead   Training steps of a stage with and without the client (dry-run controller, a plan
           alternating two clocks so every instruction is a clock change, profiler off),
           interleaved runs, medians; and the synchronize calls the training thread made.
pipeline   examples/torch_pipeline.py as a 2-stage 1F1B pipeline over NCCL, the planner on
           loopback, dry-run controllers: both ranks profile at the current clock and report,
           the plan comes back and is followed; predicted iteration time and energy against
           what the GPUs measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from perseus.client.gpu.control import GpuControl, open_gpu  # noqa: E402
from perseus.client.gpu.meter import EnergyMeter  # noqa: E402
from perseus.client.profiling.profiler import ClockSweep, device_work, measure_idle_power  # noqa: E402
from perseus.client.settings import ProfileBudget  # noqa: E402


class Sampler:
    """Reads the SM clock and power every 0.2 s in a thread (NVML reads, nothing set)."""

    def __init__(self, gpu: GpuControl, period_s: float = 0.2) -> None:
        self.gpu = gpu
        self.period_s = period_s
        self.clocks: list[int] = []
        self.powers: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.clocks.append(self.gpu.current_clock_mhz())
            self.powers.append(self.gpu.power_w())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        if not self.clocks:
            return {"sm_clock_mhz_median": float("nan"), "power_w_median": float("nan")}
        return {
            "sm_clock_mhz_median": statistics.median(self.clocks),
            "sm_clock_mhz_min": min(self.clocks),
            "sm_clock_mhz_max": max(self.clocks),
            "power_w_median": statistics.median(self.powers),
        }


SIZES = ("heavy", "light", "small", "narrow")


def stage_args(size: str, fake: bool) -> argparse.Namespace:
    # On the GPU: "heavy" has a forward of ~13 ms at the 700 W limit; "light" has smaller
    # matrices (hidden 1024) but still reaches the limit; "small" (hidden 512) and "narrow"
    # (hidden 256) are meant to stay under it. "<size>-eager" runs without CUDA graphs. On
    # the CPU (fake) a tiny stage checks the script.
    base, _, mode = size.partition("-")
    graphs = mode != "eager"
    if base not in SIZES or mode not in ("", "eager"):
        raise SystemExit(f"unknown size {size!r}: one of {', '.join(SIZES)}, optionally -eager")
    if fake:
        return argparse.Namespace(
            gpu="fake", gpu_index=0, layers=1, hidden=64, heads=4, sequence=32, microbatch_size=2,
            cuda_graphs=graphs,
        )  # fmt: skip
    shape = {
        "heavy": (4, 4096, 32, 2048, 2),
        "light": (8, 1024, 16, 2048, 4),
        "small": (16, 512, 8, 1024, 4),
        "narrow": (24, 256, 4, 1024, 8),
    }[base]
    layers, hidden, heads, sequence, micro = shape
    return argparse.Namespace(
        gpu="dry-run", gpu_index=0, layers=layers, hidden=hidden, heads=heads, sequence=sequence,
        microbatch_size=micro, cuda_graphs=graphs,
    )  # fmt: skip


def catch_idle_update(gpu: GpuControl, limit_s: float = 1.0) -> tuple[float, float]:
    """``(time, counter)`` of the next counter update, read back to back (the GPU idle)."""
    first = gpu.energy_j()
    start = time.perf_counter()
    while True:
        before = time.perf_counter()
        value = gpu.energy_j()
        after = time.perf_counter()
        if value != first or after - start > limit_s:
            return 0.5 * (before + after), value


def truth_loop(
    gpu: GpuControl, stage: Any, body: Any, seconds: float, idle_w: float, fake: bool
) -> dict[str, Any]:
    """Seconds and joules per ``body`` over a steady loop of about ``seconds``.

    Time: CUDA events around the whole loop. Energy: counter updates caught with the GPU
    idle just before the loop and just after it (so no read competes with the loop's
    launches); the counter's lag is the same at both ends and cancels, and the idle time
    between the updates and the loop is charged at ``idle_w``.
    """
    import torch

    body()
    stage.synchronize()
    t0 = time.perf_counter()
    body()
    stage.synchronize()
    n = max(10, int(seconds / max(time.perf_counter() - t0, 1e-4)))
    with Sampler(gpu) as sampler:
        u0, e0 = catch_idle_update(gpu)
        start = time.perf_counter()
        if fake:
            for _ in range(n):
                body()
            stage.synchronize()
            end = time.perf_counter()
            per_body = (end - start) / n
        else:
            begin, finish = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            begin.record()
            for _ in range(n):
                body()
            finish.record()
            stage.synchronize()
            end = time.perf_counter()
            per_body = begin.elapsed_time(finish) / 1e3 / n
        u1, e1 = catch_idle_update(gpu)
    idle_s = (u1 - u0) - (end - start)
    energy = (e1 - e0) - idle_w * idle_s
    return {
        "time_s": per_body,
        "energy_j": energy / n,
        "runs": n,
        "loop_s": end - start,
        "idle_s_between_updates": idle_s,
        "during": sampler.summary(),
    }


def run_accuracy(args: argparse.Namespace) -> dict[str, Any]:
    from perseus.client.profiling.standalone import SyntheticStage

    fake = args.gpu == "fake"
    gpu = open_gpu(args.gpu, 0)
    meter = EnergyMeter(gpu)
    meter.start()
    work = device_work(gpu)
    results: dict[str, Any] = {"gpu": gpu.name, "cases": []}
    truth_s = args.truth_s
    idle_w = measure_idle_power(meter, time.sleep, 1.5, time.perf_counter) or 0.0
    results["idle_w_for_truth"] = idle_w
    for size in args.sizes.split(","):
        stage = SyntheticStage.build(stage_args(size, fake))
        stage.warm_up()

        def forward(stage: Any = stage) -> None:
            with work("forward"):
                stage.forward()

        def forward_backward(stage: Any = stage) -> None:
            with work("forward"):
                h = stage.forward()
            with work("backward"):
                stage.backward(h)

        # The meter is quiet during the truth loops too: no NVML energy read beside them.
        with meter.quiet():
            truth_f = truth_loop(gpu, stage, forward, truth_s, idle_w, fake)
            truth_fb = truth_loop(gpu, stage, forward_backward, truth_s, idle_w, fake)
        budget = ProfileBudget(window_s=1.0, settle_s=0.5)
        with Sampler(gpu) as sampler:
            sweep = ClockSweep(gpu, meter, stage, budget, work, lock=False)
            measured = sweep.run().measurements[0]
        truth = {
            "forward_time_s": truth_f["time_s"],
            "backward_time_s": truth_fb["time_s"] - truth_f["time_s"],
            "forward_energy_j": truth_f["energy_j"],
            "backward_energy_j": truth_fb["energy_j"] - truth_f["energy_j"],
        }
        got = {
            "forward_time_s": measured.forward_time_s,
            "backward_time_s": measured.backward_time_s,
            "forward_energy_j": measured.forward_energy_j,
            "backward_energy_j": measured.backward_energy_j,
        }
        case = {
            "stage": stage.describe(),
            "size": size,
            "profiled_at_mhz": measured.frequency_mhz,
            "truth": truth,
            "profiler": got,
            "error_pct": {k: 100.0 * (got[k] - truth[k]) / truth[k] for k in truth},
            "truth_loops": {"forward": truth_f, "forward_backward": truth_fb},
            "truth_loop_power_w": {
                "forward": truth_f["energy_j"] / truth_f["time_s"],
                "forward_backward": truth_fb["energy_j"] / truth_fb["time_s"],
            },
            "during_truth_forward": truth_f["during"],
            "during_truth_forward_backward": truth_fb["during"],
            "during_profiler": sampler.summary(),
            "profiler_loop_power_w": {
                "forward": measured.forward_loop_power_w,
                "forward_backward": measured.forward_backward_loop_power_w,
            },
            "meter_update_period_s": meter.update_period_s,
        }
        results["cases"].append(case)
        print_case(case)
        del stage, forward, forward_backward
        if not fake:
            import torch

            torch.cuda.empty_cache()

    # Blocking power: what the profiler estimates (the rank waiting, no process group: the
    # GPU idle) against the power while a stream waits on an event that a spinning kernel on
    # another stream holds back (NCCL waits spin like this).
    estimate = measure_idle_power(meter, time.sleep, 2.0, time.perf_counter)
    spin_w = None
    if not fake:
        import torch

        spin, waiter = torch.cuda.Stream(), torch.cuda.Stream()
        ready = torch.cuda.Event()
        rate = (
            torch.cuda.get_device_properties(0).clock_rate
            if hasattr(torch.cuda.get_device_properties(0), "clock_rate")
            else 1_980_000
        )
        with torch.cuda.stream(spin):
            torch.cuda._sleep(int(2.5 * rate * 1000))  # cycles at the nominal kHz rate
            ready.record()
        with torch.cuda.stream(waiter):
            waiter.wait_event(ready)
            torch.ones(1, device="cuda").add_(1)
        with meter.precise(), Sampler(gpu) as sampler:
            start = time.perf_counter()
            time.sleep(2.0)
            end = time.perf_counter()
        reading = meter.power(start + 0.3, end)
        spin_w = None if reading is None else reading.power_w
        torch.cuda.synchronize()
        results["spin_wait_during"] = sampler.summary()
    results["blocking"] = {"profiler_estimate_w": estimate, "stream_waiting_on_event_w": spin_w}
    meter.stop()
    return results


def run_overhead(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from perseus.client.profiling.online import ProfilingState
    from perseus.client.profiling.standalone import SyntheticStage
    from perseus.client.rank import ActivePlan, Rank
    from perseus.client.settings import ClientSettings

    fake = args.gpu == "fake"
    logging.getLogger("perseus.client").setLevel(logging.WARNING)
    # Eager, like training (the graphed module would replay one graph per instruction).
    stage = SyntheticStage.build(stage_args("heavy-eager", fake))
    stage.warm_up()
    microbatches = 8
    steps = 3 if fake else 20
    runs = 5

    # Count synchronizations issued by the training (main) thread.
    counts = {"torch.cuda.synchronize": 0, "Event.synchronize": 0, "Stream.synchronize": 0}
    main = threading.main_thread()

    def counting(name: str, original: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            if threading.current_thread() is main:
                counts[name] += 1
            return original(*a, **k)

        return wrapper

    torch.cuda.synchronize = counting("torch.cuda.synchronize", torch.cuda.synchronize)
    torch.cuda.Event.synchronize = counting("Event.synchronize", torch.cuda.Event.synchronize)
    torch.cuda.Stream.synchronize = counting("Stream.synchronize", torch.cuda.Stream.synchronize)

    gpu = open_gpu(args.gpu, 0)
    clocks = gpu.supported_clocks_mhz()
    # Profiling off: a saved profile (PERSEUS_PROFILE) makes the rank upload it instead of
    # measuring, so this measures the hooks alone. The planner address is unreachable: the
    # session thread retries in the background and never hands over a plan of its own.
    saved = Path(args.work) / "overhead_profile.csv"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(
        "stage,instruction,frequency,time,energy\n0,forward,1980,0.01,5\n0,backward,1980,0.02,10\n"
    )
    settings = ClientSettings(
        server="http://127.0.0.1:9",
        job="overhead",
        token="t",
        stage=0,
        gpu=args.gpu,
        profile_path=str(saved),
    )

    def record() -> Any:
        event = torch.cuda.Event()
        event.record()
        return event

    rank = Rank(settings, gpu=gpu, record_event=None if fake else record)
    if rank.profiling_state is not ProfilingState.SAVED:
        raise SystemExit(f"profiling should be off (saved profile): {rank.profiling_state}")
    keys = []
    for j in range(microbatches):
        keys += [("forward", j, 0), ("backward", j, 0)]
    # The plan as the session thread would hand it over (Rank has no public way to adopt a
    # plan without a planner); checked below, so a renamed attribute fails loudly.
    rank._session.pending = ActivePlan(
        version=1,
        keys=tuple(keys),
        frequencies_mhz=tuple(
            clocks[0] if k % 2 else clocks[len(clocks) // 2] for k in range(len(keys))
        ),
    )
    optimizer = torch.optim.SGD(stage.module.parameters(), lr=1e-6)

    def step(hooked: bool) -> None:
        ctx = rank.iteration() if hooked else nullcontext()
        with ctx:
            for j in range(microbatches):
                with rank.instruction("forward", j, 0) if hooked else nullcontext():
                    out = stage.module(stage.batch)
                with rank.instruction("backward", j, 0) if hooked else nullcontext():
                    out.backward(torch.ones_like(out))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(hooked: bool) -> float:
        stage.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step(hooked)
        stage.synchronize()
        return (time.perf_counter() - start) / steps

    timed(False)
    timed(True)
    # The rank adopts a plan at an iteration boundary, after its baseline iterations.
    for _ in range(200):
        if rank.plan_version == 1:
            break
        step(True)
    if rank.plan_version != 1:
        raise SystemExit(f"the hooked steps did not follow the plan (version {rank.plan_version})")
    before = dict(counts)
    bare, hooked = [], []
    syncs_bare, syncs_hooked = 0, 0
    for _ in range(runs):
        c0 = sum(counts.values())
        bare.append(timed(False))
        syncs_bare += sum(counts.values()) - c0
        c0 = sum(counts.values())
        hooked.append(timed(True))
        syncs_hooked += sum(counts.values()) - c0
    controller = rank.controller
    controller_applied = None if controller is None else controller.applied
    rank.close()
    m_bare, m_hooked = statistics.median(bare), statistics.median(hooked)
    return {
        "stage": stage.describe(),
        "microbatches": microbatches,
        "steps_per_run": steps,
        "runs": runs,
        "step_s_bare": bare,
        "step_s_hooked": hooked,
        "median_step_s_bare": m_bare,
        "median_step_s_hooked": m_hooked,
        "slowdown_pct": 100.0 * (m_hooked / m_bare - 1.0),
        "plan_version_followed": rank.plan_version,
        "clock_changes_handed_to_controller": controller_applied,
        "training_thread_synchronize_calls_bare_runs": syncs_bare,
        "training_thread_synchronize_calls_hooked_runs": syncs_hooked,
        "counts_before_timing": before,
        "note": "the benchmark's own synchronize at the start and end of each run is counted "
        "in both columns alike (2 per run); the hooks add none if the columns are equal",
    }


def run_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from perseus.client.api.client import create_job
    from perseus.schemas import JobCreate

    fake = args.gpu == "fake"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    port = 7900
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    server = subprocess.Popen(
        [sys.executable, "-m", "perseus.server", "--port", str(port), "--database",
         f"sqlite:///{work / 'perseus.db'}", "--log-level", "warning"],
        env=env, stdout=open(work / "server.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        microbatches = 8
        with httpx.Client(base_url=url, timeout=10) as http:
            created = create_job(
                http,
                JobCreate(
                    schedule="1f1b", stages=2, microbatches=microbatches, data_parallel=1,
                    tensor_parallel=1,
                ),
                None,
            )  # fmt: skip
        env.update(
            PERSEUS_SERVER=url,
            PERSEUS_JOB=created.job_id,
            PERSEUS_TOKEN=created.token,
            PERSEUS_GPU=args.gpu,
            PERSEUS_CLOCK_LOG=str(work / "clocks"),
            PERSEUS_POLL_WAIT_S="5",
            PERSEUS_TRACE_DIR=str(work / "trace"),
            # The CPU check sweeps the fake's clocks; a dry-run GPU measures one clock anyway.
            PERSEUS_PROFILE_CLOCKS="every:20" if fake else "all",
            NCCL_NVLS_ENABLE="0",
            TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
            NVSHMEM_DISABLE_NVLS="1",
        )
        size = (
            ["--hidden", "64", "--layers", "1"]
            if fake
            else ["--hidden", "4096", "--heads", "32", "--layers", "2", "--sequence", "2048",
                  "--microbatch-size", "2", "--vocab", "8192"]
        )  # fmt: skip
        steps = "40" if fake else "60"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", "29533",
            str(REPO / "benchmarks" / "_traced_example.py"),
            "--schedule", "1f1b",
            "--microbatches", str(microbatches), "--steps", steps, *size,
        ]  # fmt: skip
        started = time.monotonic()
        with open(work / "torchrun.log", "wb") as log:
            code = subprocess.call(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=420
            )
        auth = {"Authorization": f"Bearer {created.token}"}
        view = httpx.get(f"{url}/v1/jobs/{created.job_id}", headers=auth, timeout=10).json()
        profile = httpx.get(f"{url}/v1/jobs/{created.job_id}/profile.csv", headers=auth, timeout=10)
        (work / "profile.csv").write_text(profile.text)
        chosen = view.get("chosen") or {}
        telemetry = view.get("telemetry") or {}
        predicted_t = chosen.get("time_s")
        predicted_e = chosen.get("energy_j")
        measured_t = telemetry.get("measured_time_s")
        measured_e = telemetry.get("measured_energy_j")

        def err(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else 100.0 * (b - a) / a

        trace = summarize_trace(work / "trace", profile.text, microbatches)
        log_text = (work / "torchrun.log").read_text(errors="replace")
        (Path(args.out) / "torchrun.log").write_text(log_text)
        blocking = [line for line in log_text.splitlines() if "blocking power" in line]
        return {
            "exit_code": code,
            "seconds": time.monotonic() - started,
            "state": view.get("state"),
            "counts": view.get("counts"),
            "p_block_header_w": profile.headers.get("x-perseus-p-block-w"),
            "profile_rows": profile.text.count("\n") - 1,
            "predicted_time_s": predicted_t,
            "measured_time_s": measured_t,
            "time_error_pct": err(predicted_t, measured_t),
            "predicted_energy_j": predicted_e,
            "measured_energy_j": measured_e,
            "energy_error_pct": err(predicted_e, measured_e),
            "blocking_power_lines": blocking,
            "plan_lines": [line for line in log_text.splitlines() if "plan version" in line],
            "trace": trace,
        }
    finally:
        server.terminate()
        server.wait(30)


def summarize_trace(directory: Path, profile_csv: str, microbatches: int) -> dict[str, Any]:
    """Per rank: in-stream instruction times and gaps (last 20 iterations) against the profile."""
    profile: dict[tuple[int, str], float] = {}
    for line in profile_csv.splitlines()[1:]:
        stage, kind, _mhz, time_s, _energy = line.split(",")
        profile[(int(stage), kind)] = float(time_s) * 1e3
    out: dict[str, Any] = {}
    per_iteration = 2 * microbatches
    for path in sorted(directory.glob("trace*.json")):
        rank = int(path.stem.removeprefix("trace"))
        rows = json.loads(path.read_text())
        iterations = [rows[i : i + per_iteration] for i in range(0, len(rows), per_iteration)]
        last = [it for it in iterations if len(it) == per_iteration][-20:]
        busy = [sum(r["duration_ms"] for r in it) for it in last]
        gaps = [sum(r["gap_ms"] or 0.0 for r in it[1:]) for it in last]
        out[str(rank)] = {
            "forward_ms_median": statistics.median(
                r["duration_ms"] for it in last for r in it if r["instruction"] == "forward"
            ),
            "backward_ms_median": statistics.median(
                r["duration_ms"] for it in last for r in it if r["instruction"] == "backward"
            ),
            "profile_forward_ms": profile.get((rank, "forward")),
            "profile_backward_ms": profile.get((rank, "backward")),
            "busy_ms_per_iteration": statistics.median(busy),
            "gaps_ms_per_iteration": statistics.median(gaps),
            "gaps_ms": [round(r["gap_ms"] or 0.0, 3) for r in last[-1]] if last else [],
            "instructions": [f"{r['instruction'][0].upper()}{r['microbatch']}" for r in last[-1]]
            if last
            else [],
        }
    return out


def print_case(case: dict[str, Any]) -> None:
    cond = case["during_truth_forward_backward"]
    prof = case["during_profiler"]
    for k in case["truth"]:
        print(
            f"{case['size']:<13} {k:<18} {case['truth'][k]:10.5f} {case['profiler'][k]:10.5f} "
            f"{case['error_pct'][k]:8.2f}  truth {cond['sm_clock_mhz_median']:.0f} MHz "
            f"{cond['power_w_median']:.0f} W; profiler {prof['sm_clock_mhz_median']:.0f} MHz "
            f"{prof['power_w_median']:.0f} W"
        )
    sys.stdout.flush()


def print_accuracy(r: dict[str, Any]) -> None:
    print(f"# profiler accuracy, {r['gpu']} (dry-run: measured at the clock the GPU chose)")
    print(
        f"{'stage':<13} {'quantity':<18} {'truth':>10} {'profiler':>10} {'error %':>8}  conditions"
    )
    for case in r["cases"]:
        print_case(case)
    b = r["blocking"]
    print(f"blocking power: profiler estimate {b['profiler_estimate_w']} W, "
          f"stream waiting on an event {b['stream_waiting_on_event_w']} W")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["accuracy", "overhead", "pipeline", "all", "single"])
    parser.add_argument("--out", default="validation")
    parser.add_argument("--gpu", choices=["dry-run", "fake"], default="dry-run")
    parser.add_argument("--work", default="/tmp/perseus-pipeline", help="pipeline scratch")
    parser.add_argument(
        "--sizes",
        default="heavy,light,small,narrow",
        help="accuracy stages: heavy, light, small, narrow (CUDA graphs), or <size>-eager",
    )
    parser.add_argument(
        "--truth-s", type=float, default=10.0, help="seconds of each accuracy truth loop"
    )
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    info = {"python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        import pynvml

        pynvml.nvmlInit()
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as err:  # the CPU check has no driver
        info["driver"] = f"n/a ({type(err).__name__})"
    print(json.dumps(info))
    todo = ["accuracy", "overhead", "pipeline"] if args.what == "all" else [args.what]
    if args.what == "single":
        todo = ["accuracy", "overhead"]
    for what in todo:
        started = time.monotonic()
        run = {"accuracy": run_accuracy, "overhead": run_overhead, "pipeline": run_pipeline}[what]
        try:
            result = run(args)
        except Exception:  # report and go on: one device call should bring back all it can
            traceback.print_exc()
            continue
        result["info"] = info
        result["wall_s"] = time.monotonic() - started
        (Path(args.out) / f"{what}.json").write_text(
            json.dumps(result, indent=1, default=str) + "\n"
        )
        if what == "accuracy":
            print_accuracy(result)
        else:
            print(json.dumps(result, indent=1, default=str))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
