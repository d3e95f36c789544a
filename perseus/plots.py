"""PNG plots of a frontier and of a plan's pipeline timeline (matplotlib, Agg backend).

Only the command line imports this module; the solver never does. Figures are built with
``matplotlib.figure.Figure`` and an Agg canvas, not ``pyplot``, so no global state or display
backend is touched, and each function returns the PNG bytes for the caller to write.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from perseus.core.baselines import BaselineKey, baseline_label, reference_key, saving_text
from perseus.solver import Baseline, Frontier, InstructionKind, Replay, Schedule, build_dag

__all__ = ["cluster_png", "frontier_png", "timeline_png"]

# Box labels: torch's letters (I and W: the input and weight halves of a split backward).
_LETTER = {
    InstructionKind.FORWARD: "F",
    InstructionKind.BACKWARD: "B",
    InstructionKind.BACKWARD_INPUT: "I",
    InstructionKind.BACKWARD_WEIGHT: "W",
}

_DPI = 150
_CMAP = "viridis"
# Marker, colour and size of each baseline in the frontier plot. Sizes shrink in drawing order,
# so that baselines at the same spot (common at no slowdown) all stay visible, nested.
_BASELINE_STYLE: dict[str, tuple[str, str, float]] = {
    BaselineKey.DEFAULT: ("s", "#d62728", 16.0),
    BaselineKey.ALL_FASTEST: ("^", "#8c564b", 12.5),
    BaselineKey.GLOBAL_CLOCK: ("o", "#ff7f0e", 9.0),
    BaselineKey.PER_STAGE_CLOCK: ("D", "#9467bd", 5.0),
}
_OTHER_STYLE = ("v", "#7f7f7f", 4.0)


def frontier_png(
    frontier: Frontier,
    chosen: int,
    *,
    baselines: Mapping[str, Baseline],
    title: str,
    policy: str,
    deadline_s: float | None = None,
    straggler: tuple[float, int] | None = None,
) -> bytes:
    """Plot energy against iteration time: the frontier, the baselines and the chosen point.

    Savings are stated as the ``perseus plan`` table states them, against the reference
    baseline (:func:`perseus.core.baselines.reference_key`).

    Args:
        frontier: The computed frontier.
        chosen: Index of the point the policy chose.
        baselines: The run's baselines (the ones its table shows), by key.
        title: Figure title (profile and schedule).
        policy: The policy's text, for the chosen point's label.
        deadline_s: The policy's time limit, if it has one: drawn as a vertical line.
        straggler: ``(imposed iteration time, index of the straggler point)``, if any: draws
            the imposed time and how the reference and the straggler point stretch to it.

    Returns:
        The PNG image.
    """
    key = reference_key(baselines)
    if key is None:
        raise ValueError("baselines: neither default nor all_fastest is there")
    reference = baselines[key]
    reference_label = baseline_label(key)
    fig = Figure(figsize=(8.5, 6.0), dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()

    ax.plot(
        frontier.times_s,
        frontier.energies_j,
        "-o",
        color="#1f77b4",
        markersize=2.5,
        linewidth=1.2,
        label=f"frontier ({len(frontier)} points)",
        zorder=2,
    )
    drawn = sorted(baselines, key=lambda k: -_BASELINE_STYLE.get(k, _OTHER_STYLE)[2])
    for name in drawn:
        base = baselines[name]
        marker, colour, size = _BASELINE_STYLE.get(name, _OTHER_STYLE)
        ax.plot(
            base.time_s,
            base.energy_j,
            marker,
            color=colour,
            markersize=size,
            markeredgecolor="black",
            label=f"{baseline_label(name)}: {base.time_s:.4f} s, saving "
            f"{saving_text(base.energy_j, reference.energy_j)}",
            zorder=3,
        )
    # Baselines at one spot are drawn nested; say in words which ones coincide there.
    spots: dict[tuple[float, float], list[str]] = {}
    for name, base in baselines.items():
        spot = (round(base.time_s, 9), round(base.energy_j, 6))
        spots.setdefault(spot, []).append(baseline_label(name))
    for (time_s, energy_j), names in spots.items():
        if len(names) > 1:
            ax.annotate(
                " = ".join(names),
                (time_s, energy_j),
                xytext=(12, -4),
                textcoords="offset points",
                fontsize=8,
                va="top",
            )
    point = frontier.point(chosen)
    saving = saving_text(point.energy_j, reference.energy_j)
    ax.plot(
        point.time_s,
        point.energy_j,
        "*",
        color="#2ca02c",
        markersize=17,
        markeredgecolor="black",
        label=f"{policy} (point {chosen}): {point.time_s:.4f} s, saving {saving}",
        zorder=4,
    )
    ax.annotate(
        f"{policy}\nsaving {saving}",
        (point.time_s, point.energy_j),
        xytext=(22, 22),
        textcoords="offset points",
        fontsize=9,
        arrowprops={"arrowstyle": "-", "color": "#555555"},
    )
    if deadline_s is not None:
        ax.axvline(
            deadline_s,
            color="#2ca02c",
            linestyle="-.",
            linewidth=1,
            label=f"policy limit {deadline_s:.4f} s (the baselines meet it)",
            zorder=1,
        )

    if straggler is not None:
        imposed_s, index = straggler
        slope_w = frontier.p_block_w * frontier.schedule.stages
        stretched_s = max(imposed_s, reference.time_s)
        stretched_j = reference.energy_j + slope_w * (stretched_s - reference.time_s)
        lagging = frontier.point(index)
        at_imposed_j = frontier.energy_at(index, imposed_s)
        colour = _BASELINE_STYLE.get(key, _OTHER_STYLE)[1]
        ax.axvline(imposed_s, color="#7f7f7f", linestyle="--", linewidth=1, zorder=1)
        ax.plot(
            [reference.time_s, stretched_s],
            [reference.energy_j, stretched_j],
            ":",
            color=colour,
            linewidth=1.2,
            zorder=1,
        )
        ax.plot([lagging.time_s, imposed_s], [lagging.energy_j, at_imposed_j], ":", color="#2ca02c")
        ax.plot(
            stretched_s,
            stretched_j,
            "s",
            markerfacecolor="none",
            markeredgecolor=colour,
            markersize=9,
            label=f"{reference_label} stretched to {stretched_s:.4f} s",
            zorder=3,
        )
        ax.plot(
            imposed_s,
            at_imposed_j,
            "P",
            color="#17becf",
            markersize=10,
            markeredgecolor="black",
            label=f"straggler at {imposed_s:.4f} s (point {index}): saving "
            f"{saving_text(at_imposed_j, stretched_j)} vs {reference_label} stretched",
            zorder=4,
        )

    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.set_title(f"Time-energy frontier\n{title}, P_block {frontier.p_block_w:g} W", fontsize=10)
    ax.grid(True, alpha=0.3)
    # Below the axes: inside, it would hide points wherever a straggler or baseline lands.
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    reference_j = reference.energy_j
    relative = ax.secondary_yaxis(
        "right",
        functions=(
            lambda e: 100.0 * (np.asarray(e) / reference_j - 1.0),
            lambda r: reference_j * (1.0 + np.asarray(r) / 100.0),
        ),
    )
    relative.set_ylabel(f"energy vs {reference_label} (%)")
    return _png(fig)


def timeline_png(
    schedule: Schedule,
    replayed: Replay,
    frequencies_mhz: Sequence[Sequence[int]],
    *,
    clock_range_mhz: tuple[int, int],
    title: str,
) -> bytes:
    """Draw a plan's pipeline timeline: a row per GPU, a box per instruction.

    Boxes are coloured by clock and labelled ``F3`` / ``B3`` (microbatch 3; ``F3.1`` for chunk 1
    of an interleaved schedule) wherever the label fits, across the box or else along it; a
    backward box carries a hatched strip along its bottom edge, below its label. One longest
    path through the schedule (the critical path; ties broken towards staying on one GPU) is
    outlined and joined from GPU to GPU. The grey band behind each row is time spent blocked
    (drawing the blocking power).

    Args:
        schedule: The schedule that was replayed.
        replayed: Start and finish times from :func:`perseus.solver.replay`.
        frequencies_mhz: The plan's clocks, ``frequencies_mhz[g][k]`` for ``schedule.order[g][k]``.
        clock_range_mhz: Lowest and highest clock of the profile, for the colour scale.
        title: Figure title.

    Returns:
        The PNG image. O(n) boxes and labels for ``n`` instructions.
    """
    gpus = schedule.stages
    longest = max(len(seq) for seq in schedule.order)
    # Wider for longer schedules, so that most boxes can hold their labels.
    width_in = min(48.0, max(12.0, 0.17 * longest))
    fig = Figure(figsize=(width_in, 1.3 + 0.7 * gpus), dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()
    norm = Normalize(vmin=clock_range_mhz[0], vmax=clock_range_mhz[1])
    mappable = ScalarMappable(norm=norm, cmap=_CMAP)
    height = 0.76
    strip = 0.2 * height  # the hatched strip of a backward box

    starts_of, widths_of, colours_of = [], [], []
    for gpu in range(gpus):
        y = gpus - 1 - gpu  # GPU 0 on top
        ax.broken_barh(
            [(0.0, replayed.time_s)], (y - height / 2, height), facecolors="#eeeeee", zorder=0
        )
        order = schedule.order[gpu]
        starts = np.asarray(replayed.start_s[gpu])
        widths = np.asarray(replayed.finish_s[gpu]) - starts
        colours = mappable.to_rgba(np.asarray(frequencies_mhz[gpu], dtype=float))
        backward = np.array([ins.kind != InstructionKind.FORWARD for ins in order])
        ax.barh(
            np.full(len(order), y),
            widths,
            left=starts,
            height=height,
            color=colours,
            edgecolor="white",
            linewidth=0.5,
            zorder=2,
        )
        if backward.any():
            ax.barh(
                np.full(int(backward.sum()), y - height / 2 + strip / 2),
                widths[backward],
                left=starts[backward],
                height=strip,
                facecolor="none",
                edgecolor="#333333",
                linewidth=0.0,
                hatch="////",
                zorder=2.5,
            )
        starts_of.append(starts)
        widths_of.append(widths)
        colours_of.append(colours)

    _draw_critical_path(ax, schedule, replayed, height)

    ax.set_yticks(range(gpus), [f"GPU {gpu}" for gpu in reversed(range(gpus))])
    ax.set_ylim(-0.6, gpus - 0.4)
    ax.set_xlim(0.0, replayed.time_s * 1.01)
    ax.set_xlabel("time (s)")
    letters = "/".join(_LETTER[kind] for kind in schedule.kinds)
    labels = f"{letters} microbatch" + (".chunk" if schedule.virtual_stages > 1 else "")
    ax.set_title(
        f"{title}\niteration {replayed.time_s:.4f} s, {replayed.energy_j:.1f} J; "
        f"boxes labelled {labels}",
        fontsize=10,
    )
    ax.grid(True, axis="x", alpha=0.3)
    colour_bar = fig.colorbar(mappable, ax=ax, pad=0.01, aspect=max(8, 5 * gpus))
    colour_bar.set_label("SM clock (MHz)")
    fig.legend(
        handles=[
            Patch(facecolor="#bbbbbb", edgecolor="white", label="forward"),
            Patch(facecolor="#bbbbbb", edgecolor="#333333", hatch="////", label="backward"),
            Line2D([], [], color="black", linewidth=2.0, label="critical path (one longest path)"),
            Patch(facecolor="#eeeeee", label="blocked (draws P_block)"),
        ],
        loc="outside lower center",
        ncols=4,
        fontsize=8,
        frameon=False,
    )

    # Labels go in once the layout is known, so that whether one fits is measured, not guessed.
    FigureCanvasAgg(fig).draw()  # type: ignore[no-untyped-call]
    box = ax.get_window_extent()
    x_per_px = (replayed.time_s * 1.01) / box.width
    row_px = box.height / (gpus + 0.2) * (height - strip)
    font_pt = 6.5
    char_px = 0.62 * font_pt * _DPI / 72  # DejaVu Sans digits and capitals
    line_px = 0.95 * font_pt * _DPI / 72  # a line of capitals and digits, rotated
    for gpu in range(gpus):
        label_y = gpus - 1 - gpu + strip / 2  # the middle of the box above its strip
        for k, ins in enumerate(schedule.order[gpu]):
            label = f"{_LETTER[ins.kind]}{ins.microbatch}"
            if schedule.virtual_stages > 1:
                label += f".{ins.chunk}"
            width_px = widths_of[gpu][k] / x_per_px
            text_px = len(label) * char_px + 3
            rotation: float
            if width_px >= text_px:
                rotation = 0.0
            elif width_px >= line_px and row_px >= text_px:
                rotation = 90.0
            else:
                continue
            ax.text(
                starts_of[gpu][k] + widths_of[gpu][k] / 2,
                label_y,
                label,
                ha="center",
                va="center",
                rotation=rotation,
                fontsize=font_pt,
                color="white" if _is_dark(colours_of[gpu][k]) else "black",
                zorder=4,
            )
    return _png(fig)


def _draw_critical_path(ax: Any, schedule: Schedule, replayed: Replay, height: float) -> None:
    """Outline one longest path and join its boxes where it moves from GPU to GPU.

    Walks back from the instruction that finishes last, each time to a predecessor that
    finishes exactly when it starts (preferring the same GPU). O(n).
    """
    dag = build_dag(schedule)
    start = np.concatenate([np.asarray(s) for s in replayed.start_s])
    finish = np.concatenate([np.asarray(f) for f in replayed.finish_s])
    n = dag.size
    tolerance = 1e-9 * max(replayed.time_s, 1.0)
    node = int(np.argmax(finish))
    path = [node]
    while start[node] > tolerance:
        tight = [
            int(p) for p in dag.pred[node] if p != n and abs(finish[p] - start[node]) <= tolerance
        ]
        if not tight:
            break
        same_gpu = [p for p in tight if dag.gpu[p] == dag.gpu[node]]
        node = (same_gpu or tight)[0]
        path.append(node)
    path.reverse()
    gpus = schedule.stages

    def row(j: int) -> float:
        return float(gpus - 1 - int(dag.gpu[j]))

    for j in path:
        ax.add_patch(
            Rectangle(
                (start[j], row(j) - height / 2),
                finish[j] - start[j],
                height,
                facecolor="none",
                edgecolor="black",
                linewidth=1.8,
                zorder=3,
            )
        )
    for a, b in itertools.pairwise(path):
        if dag.gpu[a] != dag.gpu[b]:
            down = row(b) < row(a)
            y0 = row(a) - height / 2 if down else row(a) + height / 2
            y1 = row(b) + height / 2 if down else row(b) - height / 2
            ax.plot([finish[a], finish[a]], [y0, y1], color="black", linewidth=1.8, zorder=3)


def cluster_png(budgets_w: Sequence[float], kept: Mapping[str, Sequence[float | None]]) -> bytes:
    """Plot the throughput each way of shedding power keeps against the cluster's budget.

    Args:
        budgets_w: The budgets, ascending.
        kept: Per way (its legend label), the share of throughput kept at each budget; None
            where the way cannot meet the budget (not drawn).
    """
    fig = Figure(figsize=(7.0, 4.2), dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()
    budgets_kw = [b / 1e3 for b in budgets_w]
    styles = itertools.cycle((("#2ca02c", "o"), ("#d62728", "s"), ("#1f77b4", "^")))
    for (label, shares), (colour, marker) in zip(kept.items(), styles, strict=False):
        xs = [b for b, k in zip(budgets_kw, shares, strict=True) if k is not None]
        ys = [100 * k for k in shares if k is not None]
        ax.plot(xs, ys, marker=marker, color=colour, label=label, markersize=4)
    ax.set_xlabel("cluster power budget (kW)")
    ax.set_ylabel("throughput kept (% of default clocks)")
    ax.set_title("Throughput kept under a power budget")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def _is_dark(rgba: Sequence[float]) -> bool:
    red, green, blue = rgba[:3]
    return 0.299 * red + 0.587 * green + 0.114 * blue < 0.5


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
