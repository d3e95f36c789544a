"""The PNG plots: a frontier with its baselines, deadline and straggler, and a plan's timeline
(one chunk per GPU, and a zero-bubble schedule with chunks and split backwards), on a small
profile so each draws in about a second."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from matplotlib.image import imread

from perseus.plots import frontier_png, timeline_png
from perseus.solver import (
    Frontier,
    Profile,
    compute_frontier,
    make_schedule,
    profile_from_rows,
    replay,
)

CLOCKS = (1980, 1500, 1005)
SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def profile() -> Profile:
    rows = []
    for stage in range(2):
        for kind, time_s, power_w in (
            ("forward", 0.010, 500.0),
            ("backward", 0.020, 600.0),
            ("backward_input", 0.011, 600.0),
            ("backward_weight", 0.009, 600.0),
        ):
            for f in CLOCKS:
                t = time_s * (1 + 0.1 * stage) * 1980 / f
                rows.append((stage, kind, f, t, power_w * (f / 1980) ** 2 * t))
    return profile_from_rows(rows, p_block_w=80.0)


@pytest.fixture(scope="module")
def frontier(profile: Profile) -> Frontier:
    # a coarse grid: a few dozen points, planned in well under a second
    return compute_frontier(
        profile, make_schedule("1f1b", 2, 3), p_block_w=80.0, resolution_s=0.005
    )


def check_png(data: bytes) -> np.ndarray:
    """``data`` is a whole PNG with a picture on it: its pixels."""
    assert data.startswith(SIGNATURE)
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 200
    assert data.endswith(b"IEND\xaeB`\x82")
    pixels = imread(io.BytesIO(data), format="png")
    assert pixels.shape[:2] == (height, width)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 10  # not blank
    return pixels


def test_a_frontier_plot(frontier: Frontier) -> None:
    png = frontier_png(
        frontier,
        len(frontier) // 2,
        baselines=frontier.baselines,
        title="two stages x three microbatches",
        policy="max-slowdown:1.1",
        deadline_s=frontier.times_s[len(frontier) // 2],
    )
    check_png(png)


def test_a_frontier_plot_under_a_straggler(frontier: Frontier) -> None:
    imposed_s = frontier.times_s[-1] * 1.2
    png = frontier_png(
        frontier,
        0,
        baselines=frontier.baselines,
        title="straggler",
        policy="no-slowdown",
        straggler=(imposed_s, len(frontier) - 1),
    )
    check_png(png)


def test_a_frontier_plot_needs_a_reference_baseline(frontier: Frontier) -> None:
    others = {k: b for k, b in frontier.baselines.items() if k not in ("default", "all_fastest")}
    with pytest.raises(ValueError, match="neither default nor all_fastest"):
        frontier_png(frontier, 0, baselines=others, title="", policy="no-slowdown")


@pytest.mark.parametrize(("name", "chunks"), [("1f1b", 1), ("zbv", 2)])
def test_a_timeline(profile: Profile, name: str, chunks: int) -> None:
    schedule = make_schedule(name, 2, 3, chunks)
    # every clock of the profile somewhere, so the colour scale spans its range
    clocks = [[CLOCKS[k % 3] for k in range(len(gpu))] for gpu in schedule.order]
    png = timeline_png(
        schedule,
        replay(profile, schedule, 80.0, clocks),
        clocks,
        clock_range_mhz=profile.clock_range_mhz,
        title=f"{name}: every clock in turn",
    )
    pixels = check_png(png)
    assert pixels.shape[1] > pixels.shape[0]  # a wide figure: the time runs along it
