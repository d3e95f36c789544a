"""``perseus plan``'s report as text: the summary, the plan table with its baselines and
straggler rows, the what-if table of several schedules, what an exact sweep proved.

``perseus job frontier`` shares the straggler rows (:func:`stretched`, :func:`straggler_note`)
and ``perseus simulate`` the margin's text (:func:`margin_text`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseus.cli.tables import format_table, schedule_text
from perseus.core.baselines import baseline_label, reference_key, saving_text, shown_baselines
from perseus.core.errors import PlanError

if TYPE_CHECKING:
    from perseus.solver import Baseline, Frontier, Policy, Profile, Schedule
    from perseus.solver.exact import ExactSweep

__all__ = [
    "ScheduleOutcome",
    "cut_text",
    "describe",
    "exact_text",
    "margin_text",
    "plan_table",
    "straggler_note",
    "stretched",
    "whatif_table",
]


def exact_text(sweep: ExactSweep) -> str:
    """What an exact sweep solved, and what its time limit cut short, for the summary."""
    if not sweep.partial:
        return f"every point proven optimal ({sweep.solves} MILPs for {sweep.deadlines} deadlines)"
    limit = "" if sweep.time_limit_s is None else f" of {sweep.time_limit_s:g} s"
    return f"PARTIAL: the time limit{limit} cut {cut_text(sweep)}"


def cut_text(sweep: ExactSweep) -> str:
    """What an exact sweep's time limit cut short (MILPs stopped, deadlines left unsolved)."""
    parts = []
    if sweep.stopped:
        parts.append(
            f"{sweep.stopped} of {sweep.solves} MILPs stopped before proving optimality (their "
            "gaps stand)"
        )
    if sweep.unsolved:
        parts.append(
            f"{sweep.unsolved} of {sweep.deadlines} deadlines (the shortest) left to the fast "
            "mode's plans"
        )
    return "; ".join(parts)


def describe(profile: Profile, schedule: Schedule, frontier: Frontier, solved_s: float) -> str:
    """The report's head: the profile, the schedule and the frontier."""
    clocks = {opt.frequency_mhz for s in profile.stages for opts in s.values() for opt in opts}
    times = frontier.times_s
    return (
        f"profile   {profile.source}: {profile.num_stages} stages, {len(clocks)} clocks\n"
        f"schedule  {schedule_text(schedule)} ({schedule.num_instructions} instructions), "
        f"P_block {frontier.p_block_w:g} W{margin_text(frontier.clock_change_margin_s)}\n"
        f"frontier  {len(frontier)} points, {times[0]:.4f} s to {times[-1]:.4f} s, "
        f"solved in {solved_s:.2f} s\n"
    )


def margin_text(margin_s: float) -> str:
    """The clock-change margin the stated figures include, for the summary (nothing at 0)."""
    return f", clock-change margin {1000 * margin_s:g} ms" if margin_s > 0 else ""


def plan_table(
    frontier: Frontier,
    baselines: Mapping[str, Baseline],
    chosen: int,
    policy: str,
    straggler: tuple[float, int] | None,
    straggler_s: float | None,
) -> str:
    """The table of the baselines, the chosen plan and, under a straggler, the straggler rows,
    with the notes that say what the savings are against."""
    key = reference_key(baselines)
    if key is None:
        raise PlanError("baselines: neither default nor all_fastest was computed")
    reference = baselines[key]

    def row(label: str, time_s: float, energy_j: float, gap: str, base_j: float) -> list[str]:
        return [
            label,
            f"{time_s:.4f}",
            f"{energy_j:.1f}",
            saving_text(energy_j, base_j),
            f"{100 * (time_s / reference.time_s - 1):.2f} %",
            gap,
        ]

    rows = [["plan", "time (s)", "energy (J)", "saving", "slowdown", "gap"]]
    for name, baseline in shown_baselines(baselines):
        label = f"{baseline_label(name)}{_clocks_note(baseline.frequencies_mhz)}"
        rows.append(row(label, baseline.time_s, baseline.energy_j, "-", reference.energy_j))
    point = frontier.point(chosen)
    rows.append(
        row(
            f"{policy} (point {chosen} of {len(frontier)})",
            point.time_s,
            point.energy_j,
            f"{100 * point.gap:.2f} %",
            reference.energy_j,
        )
    )
    notes = [f"saving and slowdown are against {baseline_label(key)}"]
    if straggler is not None:
        imposed_s, index = straggler
        blocking_w = frontier.p_block_w * frontier.schedule.stages
        base_s, base_j = stretched(reference.time_s, reference.energy_j, blocking_w, imposed_s)
        if base_s > reference.time_s:
            rows.append(row(f"{baseline_label(key)}, stretched", base_s, base_j, "-", base_j))
        rows.append(
            row(
                f"straggler (point {index} of {len(frontier)})",
                imposed_s,
                frontier.energy_at(index, imposed_s),
                f"{100 * frontier.point(index).gap:.2f} %",
                base_j,
            )
        )
        notes.append(straggler_note(baseline_label(key), imposed_s, reference.time_s))
        notes.append(
            "the straggler plan is the one that runs: --plan-output and --timeline take it"
        )
    elif straggler_s is not None:
        notes.append(straggler_note(baseline_label(key), straggler_s, point.time_s, slows=False))
    return format_table(rows, right=range(1, 6)) + "".join(f"{note}\n" for note in notes)


def stretched(
    time_s: float, energy_j: float, blocking_w: float, iteration_s: float
) -> tuple[float, float]:
    """A plan of ``time_s`` and ``energy_j`` when every iteration takes ``iteration_s`` (a
    straggler's): its GPUs block for the difference, drawing ``blocking_w`` together (the
    pipeline's blocking power); a plan that takes longer is left as it is."""
    if iteration_s <= time_s:
        return time_s, energy_j
    return iteration_s, energy_j + blocking_w * (iteration_s - time_s)


def straggler_note(
    reference: str, iteration_s: float, other_s: float, *, slows: bool = True
) -> str:
    """The footer of the straggler rows, alike in ``perseus plan`` and ``perseus job frontier``.

    ``slows``: the straggler's ``iteration_s`` is longer than the chosen plan's, so the
    straggler plan runs and the reference (of ``other_s``) is stretched to ``iteration_s``.
    Else ``other_s`` is the chosen plan's time, which the straggler does not lengthen.
    """
    if not slows:
        return (
            f"straggler: its {iteration_s:.4f} s is not longer than the chosen plan's "
            f"{other_s:.4f} s,\nso it does not slow this pipeline: the chosen plan runs as it is"
        )
    against = (
        f"{reference} stretched to that time"
        if iteration_s > other_s
        else f"{reference}, which takes longer ({other_s:.4f} s) and is not stretched"
    )
    return (
        f"straggler rows: the iteration takes {iteration_s:.4f} s because of another pipeline;\n"
        f"their saving is against {against}"
    )


def _clocks_note(frequencies_mhz: Sequence[Sequence[int]]) -> str:
    per_gpu = [set(clocks) for clocks in frequencies_mhz]
    if per_gpu and all(len(clocks) == 1 for clocks in per_gpu):
        distinct = [next(iter(clocks)) for clocks in per_gpu]
        if len(set(distinct)) == 1:
            return f" {distinct[0]} MHz"
        if len(distinct) <= 8:
            return f" {'/'.join(map(str, distinct))} MHz"
    return ""


@dataclass(frozen=True, slots=True)
class ScheduleOutcome:
    """One schedule of a what-if comparison: its default plan and the policy's plan."""

    name: str
    schedule: Schedule
    default: Baseline
    time_s: float  # the policy's plan
    energy_j: float


def whatif_table(
    profile: Profile,
    microbatches: int | None,
    p_block_w: float,
    clock_change_margin_s: float,
    policy: Policy,
    outcomes: Sequence[ScheduleOutcome],
) -> str:
    """The what-if report: one row per schedule, the first schedule's default the reference."""
    first = outcomes[0].name
    rows = [
        [
            "schedule",
            "chunks",
            "instructions",
            "default s",
            "default J",
            f"{policy} s",
            f"{policy} J",
            "saving",
            f"s vs {first}",
            f"J vs {first}",
        ]
    ]
    reference = outcomes[0].default
    for outcome in outcomes:
        default = outcome.default
        rows.append(
            [
                outcome.name,
                str(outcome.schedule.virtual_stages),
                str(outcome.schedule.num_instructions),
                f"{default.time_s:.4f}",
                f"{default.energy_j:.1f}",
                f"{outcome.time_s:.4f}",
                f"{outcome.energy_j:.1f}",
                saving_text(outcome.energy_j, default.energy_j),
                f"{100 * (outcome.time_s / reference.time_s - 1):+.2f} %",
                f"{100 * (outcome.energy_j / reference.energy_j - 1):+.2f} %",
            ]
        )
    return (
        f"profile   {profile.source}: {profile.num_stages} stages, {microbatches} "
        f"microbatches, P_block {p_block_w:g} W, clock-change margin "
        f"{1000 * clock_change_margin_s:g} ms\n\n"
        + format_table(rows, right=range(1, 10))
        + f"\ndefault: every instruction at the highest clock; saving: {policy} against its "
        f"schedule's default;\nvs {first}: {policy} against {first}'s default\n"
    )
