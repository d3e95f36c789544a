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

accuracy   A bf16 GPT-style stage (two sizes: one at the H200's 700 W limit, one lighter),
           forward and forward+backward. Truth: CUDA events around >= 2 s loops for time;
           >= 10 s steady loops with the energy counter read at both ends for energy. The
           profiler: perseus's ClockSweep at the current clock (steady loops too, so the duty
           cycle is the same). Also the blocking power the profiler estimates against the
           GPU's power while a stream waits on an event behind a spinning kernel.
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

from perseus.client.gpu import GpuControl, open_gpu  # noqa: E402
from perseus.client.meter import EnergyMeter  # noqa: E402
from perseus.client.profiler import ClockSweep, device_work, measure_idle_power  # noqa: E402
from perseus.client.settings import ProfileBudget  # noqa: E402


class Sampler:
    """Reads the SM clock and power every 50 ms in a thread (NVML reads, nothing set)."""

    def __init__(self, gpu: GpuControl) -> None:
        self.gpu = gpu
        self.clocks: list[int] = []
        self.powers: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
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


def stage_args(size: str, fake: bool) -> argparse.Namespace:
    # On the GPU: "heavy" has a forward of ~13 ms at the 700 W limit; "light" has smaller
    # matrices (hidden 1024) but still reaches the limit; "small" (hidden 512) and "narrow"
    # (hidden 256) are meant to stay under it. On the CPU (fake) a tiny stage checks the script.
    if fake:
        return argparse.Namespace(
            gpu="fake", gpu_index=0, layers=1, hidden=64, heads=4, sequence=32, microbatch_size=2
        )
    if size == "heavy":
        return argparse.Namespace(
            gpu="dry-run", gpu_index=0, layers=4, hidden=4096, heads=32, sequence=2048,
            microbatch_size=2,
        )  # fmt: skip
    if size == "small":
        return argparse.Namespace(
            gpu="dry-run", gpu_index=0, layers=16, hidden=512, heads=8, sequence=1024,
            microbatch_size=4,
        )  # fmt: skip
    if size == "narrow":
        return argparse.Namespace(
            gpu="dry-run", gpu_index=0, layers=24, hidden=256, heads=4, sequence=1024,
            microbatch_size=8,
        )  # fmt: skip
    return argparse.Namespace(
        gpu="dry-run", gpu_index=0, layers=8, hidden=1024, heads=16, sequence=2048,
        microbatch_size=4,
    )  # fmt: skip


def event_time_s(stage: Any, body: Any, seconds: float, fake: bool) -> tuple[float, int]:
    """Seconds per ``body`` from CUDA events around a loop of about ``seconds``."""
    import torch

    body()
    stage.synchronize()
    n = 0
    if fake:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            body()
            n += 1
        return (time.perf_counter() - start) / n, n
    # Calibrate the count, then time exactly that many between two events.
    t0 = time.perf_counter()
    body()
    stage.synchronize()
    one = max(time.perf_counter() - t0, 1e-4)
    n = max(10, int(seconds / one))
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(n):
        body()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / n, n


def steady_energy_j(
    gpu: GpuControl, stage: Any, body: Any, seconds: float
) -> tuple[float, int, dict[str, float]]:
    """Joules per ``body`` over a steady loop of >= ``seconds``, counter read at both ends."""
    body()
    stage.synchronize()
    with Sampler(gpu) as sampler:
        e0 = gpu.energy_j()
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < seconds:
            body()
            n += 1
        stage.synchronize()
        e1 = gpu.energy_j()
    return (e1 - e0) / n, n, sampler.summary()


def run_accuracy(args: argparse.Namespace) -> dict[str, Any]:
    from perseus.client.standalone import SyntheticStage

    fake = args.gpu == "fake"
    gpu = open_gpu(args.gpu, 0)
    meter = EnergyMeter(gpu)
    meter.start()
    work = device_work(gpu)
    results: dict[str, Any] = {"gpu": gpu.name, "cases": []}
    steady_s = 3.0 if fake else 12.0
    event_s = 1.0 if fake else 2.0
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

        t_f, _ = event_time_s(stage, forward, event_s, fake)
        t_fb, _ = event_time_s(stage, forward_backward, event_s, fake)
        e_f, n_f, during_f = steady_energy_j(gpu, stage, forward, steady_s)
        e_fb, n_fb, during_fb = steady_energy_j(gpu, stage, forward_backward, steady_s)
        budget = ProfileBudget(window_s=1.0, settle_s=0.5)
        with Sampler(gpu) as sampler:
            sweep = ClockSweep(gpu, meter, stage, budget, work, lock=False)
            measured = sweep.run().measurements[0]
        truth = {
            "forward_time_s": t_f,
            "backward_time_s": t_fb - t_f,
            "forward_energy_j": e_f,
            "backward_energy_j": e_fb - e_f,
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
            "truth_loops": {
                "forward_runs": n_f,
                "forward_backward_runs": n_fb,
                "seconds": steady_s,
            },
            "during_truth_forward": during_f,
            "during_truth_forward_backward": during_fb,
            "during_profiler": sampler.summary(),
            "profiler_loop_power_w": {
                "forward": measured.forward_loop_power_w,
                "forward_backward": measured.forward_backward_loop_power_w,
            },
        }
        results["cases"].append(case)
        del stage

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

    from perseus.client.rank import ActivePlan, Rank
    from perseus.client.settings import ClientSettings
    from perseus.client.standalone import SyntheticStage

    fake = args.gpu == "fake"
    logging.getLogger("perseus.client").setLevel(logging.WARNING)
    stage = SyntheticStage.build(stage_args("heavy", fake))
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
    settings = ClientSettings(
        server="http://127.0.0.1:9", job="overhead", token="t", stage=0, gpu=args.gpu
    )

    def record() -> Any:
        event = torch.cuda.Event()
        event.record()
        return event

    rank = Rank(settings, gpu=gpu, record_event=None if fake else record)
    rank._profile_state = "off"  # profiler off: this measures the hooks alone
    keys = []
    for j in range(microbatches):
        keys += [("forward", j, None), ("backward", j, None)]
    rank._pending = ActivePlan(
        version=1,
        keys=tuple(keys),
        frequencies_mhz=tuple(
            clocks[0] if k % 2 else clocks[len(clocks) // 2] for k in range(len(keys))
        ),
    )
    optimizer = torch.optim.SGD(stage._module.parameters(), lr=1e-6)

    def step(hooked: bool) -> None:
        ctx = rank.iteration() if hooked else nullcontext()
        with ctx:
            for j in range(microbatches):
                with rank.instruction("forward", j) if hooked else nullcontext():
                    out = stage._module(stage._batch)
                with rank.instruction("backward", j) if hooked else nullcontext():
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
        "clock_changes_handed_to_controller": rank._controller.applied,
        "training_thread_synchronize_calls_bare_runs": syncs_bare,
        "training_thread_synchronize_calls_hooked_runs": syncs_hooked,
        "counts_before_timing": before,
        "note": "the benchmark's own synchronize at the start and end of each run is counted "
        "in both columns alike (2 per run); the hooks add none if the columns are equal",
    }


def run_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from perseus.client.planner import create_job
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


def print_accuracy(r: dict[str, Any]) -> None:
    print(f"# profiler accuracy, {r['gpu']} (dry-run: measured at the clock the GPU chose)")
    print(
        f"{'stage':<9} {'quantity':<18} {'truth':>10} {'profiler':>10} {'error %':>8}  conditions"
    )
    for case in r["cases"]:
        cond = case["during_truth_forward_backward"]
        prof = case["during_profiler"]
        for k in case["truth"]:
            print(
                f"{case['size']:<9} {k:<18} {case['truth'][k]:10.5f} {case['profiler'][k]:10.5f} "
                f"{case['error_pct'][k]:8.2f}  truth {cond['sm_clock_mhz_median']:.0f} MHz "
                f"{cond['power_w_median']:.0f} W; profiler {prof['sm_clock_mhz_median']:.0f} MHz "
                f"{prof['power_w_median']:.0f} W"
            )
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
        "--sizes", default="heavy,light,small", help="accuracy stages: heavy, light, small, narrow"
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
