"""Online profiling against the fake H200's ground truth.

    python benchmarks/profiler_accuracy.py            # 3 instruction sizes x 5 clocks (~1 min)
    python benchmarks/profiler_accuracy.py --quick    # 1 size x 3 clocks

For each instruction size (forward / backward time at the top clock; 620 W and 760 W there, so
the backward throttles when unlocked) a `ClockSweep` measures the clocks of the grid on a
`FakeGpu` with the default model (100 ms counter ticks, 3 ms reads, smoothed power, 700 W
limit), with the profiler's default budget (0.2 s settle + 0.6 s window per loop), then one
unlocked measurement (`lock=False`; its truth is each instruction at the clock the fake
throttles it to), then the blocking power (`measure_idle_power` over 1.2 s while the GPU
idles). "true" is the model's `time_s` / `energy_j` / `idle_power_w`; "err %" is measured
against it. The fake runs in real time and its sleeps overshoot on a loaded host (it bills
the overshoot as busy time): "fake %" is the largest deviation of what the fake really did in
the measured windows (its bracket times and its exact energy integral) from its own model, so
an error much larger than "fake %" is the profiler's. Nothing is random; the seed is fixed
anyway.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

from perseus.client.gpu.fake import FakeGpu, FakeGpuModel, FakeWork, SweepProbe
from perseus.client.gpu.meter import EnergyMeter
from perseus.client.profiling.profiler import ClockMeasurement, ClockSweep, measure_idle_power
from perseus.client.settings import ProfileBudget

SEED = 0
MODEL = FakeGpuModel()
BUDGET = ProfileBudget()  # the rank's defaults: 0.6 s window, 0.2 s settle
BLOCKING_S = 1.2
FORWARD_W = 620.0
BACKWARD_W = 760.0

# label -> (forward s, backward s at the top clock)
SIZES = {
    "5/10 ms": (0.005, 0.010),
    "20/40 ms": (0.020, 0.040),
    "50/100 ms": (0.050, 0.100),
}
CLOCKS = "1980,1605,1200,900,600"
QUICK_CLOCKS = "1980,1200,600"


QUANTITIES = ("t_f", "e_f", "t_b", "e_b")
HEADER = (
    "case",
    "MHz",
    "tF true ms",
    "tF meas ms",
    "err %",
    "eF true J",
    "eF meas J",
    "err %",
    "tB true ms",
    "tB meas ms",
    "err %",
    "eB true J",
    "eB meas J",
    "err %",
    "Pblock true W",
    "Pblock meas W",
    "err %",
    "fake %",
)


def _row(
    case: str,
    clock: str,
    work: dict[str, FakeWork],
    at_mhz: dict[str, int],
    m: ClockMeasurement,
    real: dict[str, float],
    worst: dict[str, float],
) -> tuple[str, ...]:
    truth = {
        "t_f": MODEL.time_s(work["forward"], at_mhz["forward"]),
        "e_f": MODEL.energy_j(work["forward"], at_mhz["forward"]),
        "t_b": MODEL.time_s(work["backward"], at_mhz["backward"]),
        "e_b": MODEL.energy_j(work["backward"], at_mhz["backward"]),
    }
    measured = {
        "t_f": m.forward_time_s,
        "e_f": m.forward_energy_j,
        "t_b": m.backward_time_s,
        "e_b": m.backward_energy_j,
    }
    cells = [case, clock]
    drift = 0.0
    for q in QUANTITIES:
        err = 100.0 * (measured[q] / truth[q] - 1.0)
        worst[q] = max(worst[q], abs(err))
        drift = max(drift, abs(100.0 * (real[q] / truth[q] - 1.0)))
        scale = 1e3 if q.startswith("t") else 1.0
        cells += [f"{truth[q] * scale:.3f}", f"{measured[q] * scale:.3f}", f"{err:+.2f}"]
    return (*cells, "", "", "", f"{drift:.2f}")


def run_case(
    label: str, forward_s: float, backward_s: float, clocks: str, worst: dict[str, float]
) -> list[tuple[str, ...]]:
    work = {
        "forward": FakeWork(time_at_max_s=forward_s, power_at_max_w=FORWARD_W),
        "backward": FakeWork(time_at_max_s=backward_s, power_at_max_w=BACKWARD_W),
    }
    gpu = FakeGpu(MODEL, work)
    meter = EnergyMeter(gpu)
    meter.start()
    rows = []
    try:
        probe = SweepProbe(gpu)
        profile = ClockSweep(gpu, meter, probe, replace(BUDGET, clocks=clocks), probe.work).run()
        for c, m in enumerate(profile.measurements):
            at = {"forward": m.frequency_mhz, "backward": m.frequency_mhz}
            rows.append(_row(label, str(m.frequency_mhz), work, at, m, probe.realized(c), worst))
        while gpu.locked_clock_mhz is not None:  # the sweep's last reset acts after a delay
            time.sleep(0.005)
        probe = SweepProbe(gpu)
        m = ClockSweep(gpu, meter, probe, BUDGET, probe.work, lock=False).run().measurements[0]
        at = {kind: MODEL.unlocked_clock_mhz(w) for kind, w in work.items()}
        clock = "unlocked " + "/".join(str(at[k]) for k in ("forward", "backward"))
        rows.append(_row(label, clock, work, at, m, probe.realized(0), worst))
        time.sleep(0.3)  # idle, as a rank waiting on its peers
        idle_w = measure_idle_power(meter, time.sleep, BLOCKING_S, time.perf_counter)
    finally:
        meter.stop()
    true_w = MODEL.idle_power_w
    if idle_w is None:
        cells = ("no reading", "")
    else:
        err = 100.0 * (idle_w / true_w - 1.0)
        worst["p_block"] = max(worst["p_block"], abs(err))
        cells = (f"{idle_w:.1f}", f"{err:+.2f}")
    rows.append((label, "idle", *[""] * 12, f"{true_w:.1f}", *cells, ""))
    return rows


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in (HEADER, *rows)) for i in range(len(HEADER))]
    for i, r in enumerate((HEADER, *rows)):
        cells = [
            c.ljust(w) if j == 0 else c.rjust(w)
            for j, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        print("  ".join(cells))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one size, three clocks")
    args = parser.parse_args()
    random.seed(SEED)
    sizes = {"20/40 ms": SIZES["20/40 ms"]} if args.quick else SIZES
    clocks = QUICK_CLOCKS if args.quick else CLOCKS
    worst = dict.fromkeys((*QUANTITIES, "p_block"), 0.0)
    rows: list[tuple[str, ...]] = []
    started = time.perf_counter()
    for label, (forward_s, backward_s) in sizes.items():
        rows += run_case(label, forward_s, backward_s, clocks, worst)
    print(
        f"ClockSweep vs the fake H200 (window {BUDGET.window_s:g} s, settle {BUDGET.settle_s:g} s,"
        f" counter every {MODEL.counter_period_s:g} s, read {MODEL.read_cost_s * 1e3:g} ms;"
        f" {time.perf_counter() - started:.0f} s)"
    )
    print_table(rows)
    print(
        f"max |err|: tF {worst['t_f']:.2f} %, eF {worst['e_f']:.2f} %, tB {worst['t_b']:.2f} %,"
        f" eB {worst['e_b']:.2f} %, blocking power {worst['p_block']:.2f} %"
    )


if __name__ == "__main__":
    main()
