"""PNG plots of a frontier and of a plan's pipeline timeline (matplotlib, Agg backend).

Only the command line imports this module; the solver never does. Figures are built with
``matplotlib.figure.Figure`` and an Agg canvas, not ``pyplot``, so no global state or display
backend is touched, and each function returns the PNG bytes for the caller to write.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from perseus.solver import Frontier, Replay, Schedule

__all__ = ["frontier_png", "timeline_png"]

_DPI = 150
_CMAP = "viridis"
# Marker, colour and label of each baseline in the frontier plot.
# Sizes shrink so that baselines at the same spot (common at no slowdown) stay visible.
_BASELINE_STYLE = {
    "all_fastest": ("s", "#d62728", 13.0, "all-fastest (default)"),
    "global_clock": ("o", "#ff7f0e", 9.5, "global clock"),
    "per_stage_clock": ("D", "#9467bd", 5.5, "per-stage clock"),
}


def frontier_png(
    frontier: Frontier,
    chosen: int,
    *,
    title: str,
    policy: str,
    straggler: tuple[float, int] | None = None,
) -> bytes:
    """Plot energy against iteration time: the frontier, the baselines and the chosen point.

    Args:
        frontier: The computed frontier.
        chosen: Index of the point the policy chose.
        title: Figure title (profile and schedule).
        policy: The policy's text, for the chosen point's label.
        straggler: ``(imposed iteration time, index of the straggler point)``, if any: draws
            the imposed time and how all-fastest and the straggler point stretch to it.

    Returns:
        The PNG image.
    """
    fig = Figure(figsize=(8.5, 6.0), dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()
    fastest = frontier.baselines["all_fastest"]

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
    for key, (marker, colour, size, label) in _BASELINE_STYLE.items():
        base = frontier.baselines[key]
        ax.plot(
            base.time_s,
            base.energy_j,
            marker,
            color=colour,
            markersize=size,
            markeredgecolor="black",
            label=f"{label}: {_saving(base.energy_j, fastest.energy_j)}",
            zorder=3,
        )
    point = frontier.point(chosen)
    ax.plot(
        point.time_s,
        point.energy_j,
        "*",
        color="#2ca02c",
        markersize=17,
        markeredgecolor="black",
        label=f"{policy} (point {chosen}): {_saving(point.energy_j, fastest.energy_j)}",
        zorder=4,
    )
    ax.annotate(
        f"{policy}\n{_saving(point.energy_j, fastest.energy_j)} energy",
        (point.time_s, point.energy_j),
        xytext=(22, 22),
        textcoords="offset points",
        fontsize=9,
        arrowprops={"arrowstyle": "-", "color": "#555555"},
    )

    if straggler is not None:
        imposed_s, index = straggler
        slope_w = frontier.p_block_w * frontier.schedule.stages
        stretched_j = fastest.energy_j + slope_w * (imposed_s - fastest.time_s)
        lagging = frontier.point(index)
        at_imposed_j = frontier.energy_at(index, imposed_s)
        ax.axvline(imposed_s, color="#7f7f7f", linestyle="--", linewidth=1, zorder=1)
        ax.plot(
            [fastest.time_s, imposed_s],
            [fastest.energy_j, stretched_j],
            ":",
            color=_BASELINE_STYLE["all_fastest"][1],
            linewidth=1.2,
            zorder=1,
        )
        ax.plot([lagging.time_s, imposed_s], [lagging.energy_j, at_imposed_j], ":", color="#2ca02c")
        ax.plot(
            imposed_s,
            stretched_j,
            "s",
            markerfacecolor="none",
            markeredgecolor=_BASELINE_STYLE["all_fastest"][1],
            markersize=9,
            label=f"all-fastest stretched to {imposed_s:.3f} s",
            zorder=3,
        )
        ax.plot(
            imposed_s,
            at_imposed_j,
            "P",
            color="#17becf",
            markersize=10,
            markeredgecolor="black",
            label=f"straggler at {imposed_s:.3f} s (point {index}): "
            f"{_saving(at_imposed_j, stretched_j)} vs all-fastest stretched",
            zorder=4,
        )

    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.set_title(f"Time-energy frontier\n{title}, P_block {frontier.p_block_w:g} W", fontsize=10)
    ax.grid(True, alpha=0.3)
    # Below the axes: inside, it would hide points wherever a straggler or baseline lands.
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    reference = fastest.energy_j
    relative = ax.secondary_yaxis(
        "right",
        functions=(
            lambda e: 100.0 * (np.asarray(e) / reference - 1.0),
            lambda r: reference * (1.0 + np.asarray(r) / 100.0),
        ),
    )
    relative.set_ylabel("energy vs all-fastest (%)")
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

    Boxes are coloured by clock; backward boxes are hatched and, where wide enough, labelled
    ``F3`` / ``B3`` (microbatch 3; ``F3.1`` for chunk 1 of an interleaved schedule). Boxes on
    the critical path have a thick dark edge. The grey band behind each row is time spent
    blocked (drawing the blocking power).

    Args:
        schedule: The schedule that was replayed.
        replayed: Start and finish times and critical flags from :func:`perseus.solver.replay`.
        frequencies_mhz: The plan's clocks, ``frequencies_mhz[g][k]`` for ``schedule.order[g][k]``.
        clock_range_mhz: Lowest and highest clock of the profile, for the colour scale.
        title: Figure title.

    Returns:
        The PNG image.
    """
    gpus = schedule.stages
    # Wider for longer schedules, so that more boxes are wide enough for their labels.
    width_in = min(20.0, max(12.0, 0.45 * max(len(seq) for seq in schedule.order)))
    fig = Figure(figsize=(width_in, 1.1 + 0.62 * gpus), dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()
    norm = Normalize(vmin=clock_range_mhz[0], vmax=clock_range_mhz[1])
    mappable = ScalarMappable(norm=norm, cmap=_CMAP)
    # A label fits when the box is wider than its text; the axis spans about 1.4 in less than
    # the figure and a 6.5 pt character is about 0.055 in wide.
    char_s = replayed.time_s * 0.055 / (width_in - 1.4)
    height = 0.72

    for gpu in range(gpus):
        y = gpus - 1 - gpu  # GPU 0 on top
        ax.broken_barh(
            [(0.0, replayed.time_s)], (y - height / 2, height), facecolors="#eeeeee", zorder=0
        )
        order = schedule.order[gpu]
        starts = np.asarray(replayed.start_s[gpu])
        widths = np.asarray(replayed.finish_s[gpu]) - starts
        colours = mappable.to_rgba(np.asarray(frequencies_mhz[gpu], dtype=float))
        backward = np.array([ins.kind == "backward" for ins in order])
        critical = np.asarray(replayed.critical[gpu], dtype=bool)
        for mask, hatch in ((~backward, None), (backward, "///")):
            if mask.any():
                ax.barh(
                    np.full(mask.sum(), y),
                    widths[mask],
                    left=starts[mask],
                    height=height,
                    color=colours[mask],
                    edgecolor="white",
                    linewidth=0.6,
                    hatch=hatch,
                    zorder=2,
                )
        if critical.any():
            ax.barh(
                np.full(critical.sum(), y),
                widths[critical],
                left=starts[critical],
                height=height,
                facecolor="none",
                edgecolor="black",
                linewidth=1.8,
                zorder=3,
            )
        for k, ins in enumerate(order):
            label = f"{ins.kind[0].upper()}{ins.microbatch}"
            if schedule.virtual_stages > 1:
                label += f".{ins.chunk}"
            if widths[k] < (len(label) + 0.8) * char_s:
                continue
            ax.text(
                starts[k] + widths[k] / 2,
                y,
                label,
                ha="center",
                va="center",
                fontsize=6.5,
                color="white" if _is_dark(colours[k]) else "black",
                bbox={"facecolor": colours[k], "edgecolor": "none", "pad": 0.4},
                zorder=4,
            )

    ax.set_yticks(range(gpus), [f"GPU {gpu}" for gpu in reversed(range(gpus))])
    ax.set_ylim(-0.6, gpus - 0.4)
    ax.set_xlim(0.0, replayed.time_s * 1.01)
    ax.set_xlabel("time (s)")
    labels = "F/B microbatch" + (".chunk" if schedule.virtual_stages > 1 else "")
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
            Patch(facecolor="#bbbbbb", edgecolor="white", hatch="///", label="backward"),
            Patch(facecolor="white", edgecolor="black", linewidth=1.8, label="critical path"),
            Patch(facecolor="#eeeeee", label="blocked (draws P_block)"),
        ],
        loc="outside lower center",
        ncols=4,
        fontsize=8,
        frameon=False,
    )
    return _png(fig)


def _saving(energy_j: float, reference_j: float) -> str:
    return f"{100.0 * (energy_j / reference_j - 1.0):+.1f} %"


def _is_dark(rgba: Sequence[float]) -> bool:
    red, green, blue = rgba[:3]
    return 0.299 * red + 0.587 * green + 0.114 * blue < 0.5


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
