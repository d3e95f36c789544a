"""SweepProbe, the profiling workload that records a fake GPU's ground truth: what its
synchronizations and brackets record, and the per-instruction time and energy it derives
from them at each clock (against hand-made records)."""

from __future__ import annotations

import pytest

from perseus.client.gpu.fake_probe import SweepProbe


class Gpu:
    """What the probe uses of a FakeGpu: the exact energy and the work bracket."""

    def __init__(self) -> None:
        self.energy_j = 0.0
        self.calls: list[str] = []

    def true_energy_j(self) -> float:
        return self.energy_j

    def begin(self, kind: str) -> None:
        self.calls.append(f"begin {kind}")

    def end(self) -> None:
        self.calls.append("end")


def probe(splits_backward: bool = False) -> SweepProbe:
    return SweepProbe(Gpu(), splits_backward=splits_backward)  # type: ignore[arg-type]


def test_syncs_record_time_and_exact_energy_and_brackets_their_sync() -> None:
    p = probe()
    gpu = p.gpu
    assert isinstance(gpu, Gpu)
    gpu.energy_j = 12.5
    p.synchronize()
    with p.work("forward"):
        handle = p.forward()
    p.backward(handle)  # the bracket times the work; the calls themselves do nothing
    with pytest.raises(RuntimeError), p.work("backward"):
        raise RuntimeError("the workload failed")
    assert gpu.calls == ["begin forward", "end", "begin backward", "end"]
    assert [(n, kind) for n, kind, _ in p.brackets] == [(1, "forward"), (1, "backward")]
    assert all(seconds >= 0 for _, _, seconds in p.brackets)
    ((at_s, energy_j),) = p.syncs
    assert energy_j == 12.5 and at_s > 0


def clock(p: SweepProbe, start_s: float, start_j: float, loops: list[list[tuple[str, float]]],
          walls: list[float], energies: list[float]) -> None:  # fmt: skip
    """One clock's records: per loop a start, a settled and an end sync, the loop's brackets
    (kind, seconds) between the last two; ``walls``/``energies`` are each loop's measured
    window."""
    t, e = start_s, start_j
    for brackets, wall, energy in zip(loops, walls, energies, strict=True):
        p.syncs += [(t, e), (t + 0.1, e + 1.0)]
        p.brackets += [(len(p.syncs), kind, s) for kind, s in brackets]
        t, e = t + 0.1 + wall, e + 1.0 + energy
        p.syncs.append((t, e))


def test_realized_is_each_instructions_mean_time_and_share_of_its_windows_energy() -> None:
    p = probe()
    for c in range(2):
        slow = 1 + c  # the second clock: everything twice as long, energies the same
        clock(
            p, 10.0 * c, 1000.0 * c,
            loops=[[("forward", 0.09 * slow)] * 4,
                   [("forward", 0.09 * slow), ("backward", 0.2 * slow)] * 2],
            walls=[0.4 * slow, 0.6 * slow],
            energies=[40.0, 60.0],
        )  # fmt: skip
    for c in range(2):
        slow = 1 + c
        assert p.realized(c) == pytest.approx(
            {
                "t_f": 0.09 * slow,
                "e_f": 10.0,
                "t_b": 0.2 * slow,  # the forward+backward loop's, less a forward
                "e_b": 20.0,
                "gap_f": 0.01 * slow,  # host time per body outside the brackets
                "gap_fb": 0.01 * slow,
            }
        )


def test_a_split_backward_adds_the_input_halfs_loop() -> None:
    p = probe(splits_backward=True)
    clock(
        p, 0.0, 0.0,
        loops=[[("forward", 0.1)] * 2,
               [("forward", 0.1), ("backward", 0.3)] * 2,
               [("forward", 0.1), ("backward_input", 0.12)] * 2],
        walls=[0.2, 0.8, 0.5],
        energies=[20.0, 70.0, 40.0],
    )  # fmt: skip
    realized = p.realized(0)
    assert len(p.syncs) == 9
    assert realized["t_i"] == pytest.approx(0.12)
    assert realized["e_i"] == pytest.approx(40.0 / 2 - 10.0)
    assert realized["gap_fi"] == pytest.approx(0.25 - 0.22)
    assert realized["t_b"] == pytest.approx(0.3) and realized["e_b"] == pytest.approx(25.0)
