"""The planner's job views as ``perseus job`` prints them, and policies between the command
line's form (``max-slowdown:1.05``) and the wire's (:class:`perseus.schemas.PolicySpec`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from perseus.cli.tables import format_table
from perseus.core.baselines import baseline_label, reference_key, saving_text, shown_baselines
from perseus.core.errors import PolicyError
from perseus.core.jobs import JobState

if TYPE_CHECKING:
    from pydantic import ValidationError

    from perseus.core.policies import Policy
    from perseus.schemas import (
        FrontierPoint,
        FrontierView,
        JobCounts,
        JobSummary,
        JobView,
        PlanVersion,
        PolicySpec,
        RankProfiling,
        SavingsView,
    )

__all__ = [
    "duration_text",
    "format_frontier",
    "format_job",
    "format_job_list",
    "format_savings",
    "policy_spec",
    "policy_text",
    "printable",
    "profiling_text",
    "validation_text",
    "version_text",
]

_POLICY_FIELDS = {"max-slowdown": "factor", "deadline": "seconds", "zeus-cost": "eta"}


def printable(text: str) -> str:
    """Text a client chose (a job name, a reason quoting it) safe to print on a terminal:
    control characters (escape sequences, newlines, carriage returns) shown escaped, as
    Python writes them (``\\x1b``, ``\\n``), so a name can neither clear the screen nor fake
    a line of its own."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def policy_spec(policy: Policy) -> PolicySpec:
    """The wire policy for a policy as ``perseus plan --policy`` parses it.

    Raises:
        PolicyError: the value is out of the server's range (e.g. a slowdown over 100).
    """
    from pydantic import TypeAdapter, ValidationError

    from perseus.schemas import PolicySpec

    data: dict[str, object] = {"kind": policy.kind}
    if policy.kind in _POLICY_FIELDS:
        data[_POLICY_FIELDS[policy.kind]] = policy.value
    adapter: TypeAdapter[PolicySpec] = TypeAdapter(PolicySpec)
    try:
        return adapter.validate_python(data)
    except ValidationError as err:
        raise PolicyError(f"policy {policy}: {validation_text(err)}") from None


def policy_text(spec: PolicySpec) -> str:
    """A wire policy as the command line writes it: ``max-slowdown:1.05``."""
    field = _POLICY_FIELDS.get(spec.kind)
    return spec.kind if field is None else f"{spec.kind}:{getattr(spec, field):g}"


def format_job(view: JobView) -> str:
    """The job view as aligned ``label  value`` lines."""
    spec = view.spec
    shape = f"{spec.schedule}: {spec.stages} stages x {spec.microbatches} microbatches"
    if spec.virtual_stages > 1:
        shape += f" x {spec.virtual_stages} chunks"
    shape += f"; {spec.data_parallel} data parallel x {spec.tensor_parallel} tensor parallel"
    counts = view.counts
    state = view.state if view.reason is None else f"{view.state}: {printable(view.reason)}"
    if view.gave_up:
        state += (
            f" (but {len(view.gave_up)} of {counts.ranks_expected} ranks gave up and run at "
            "default clocks)"
        )
    lines = [
        ("job", view.job_id if view.name is None else f"{view.job_id} ({printable(view.name)})"),
        ("state", state),
        *(
            (
                f"rank {g.rank}",
                f"gave up {_utc(g.at_s)}: {printable(g.reason)}",
            )
            for g in view.gave_up
        ),
        *_profiling_lines(view.profiling),
        ("schedule", shape),
        (
            "ranks",
            f"{counts.ranks_registered} of {counts.ranks_expected} registered, "
            f"{counts.profiles_reported} profiles ({counts.stages_profiled} of {spec.stages} "
            f"stages)",
        ),
        ("progress", _iterations_text(counts)),
        ("policy", policy_text(view.policy)),
        (
            "p_block",
            "unknown (no profile or job value yet)"
            if view.p_block_w is None
            else f"{view.p_block_w:g} W per stage",
        ),
        ("straggler", _straggler_text(view)),
        ("version", str(view.version)),
    ]
    if view.frontier_points is not None:
        planned = "" if view.planning_s is None else f", planned in {view.planning_s:.2f} s"
        if view.planned_from_s is not None:
            planned += f" from the profiles in at {_utc(view.planned_from_s)}"
        lines.append(("frontier", f"{view.frontier_points} points{planned}"))
    newer = view.profiles_since_plan
    if newer and view.state != JobState.PLANNING:
        lines.append(
            (
                "re-run",
                f"{newer} of {counts.ranks_expected} profiles re-reported since this plan: "
                "the job replans once all are in ('perseus job replan' replans now)",
            )
        )
    if view.chosen is not None:
        c = view.chosen
        by = policy_text(view.policy)
        if view.straggler is not None:
            slows = c.expected_iteration_time_s > c.time_s * (1 + 1e-12)
            by = (
                f"straggler plan, policy {by}" if slows else f"{by}; the straggler does not slow it"
            )
        lines.append(
            (
                "chosen",
                f"point {c.index} ({by}): {c.time_s:.4f} s, {c.energy_j:.1f} J per iteration "
                f"(expected {c.expected_iteration_time_s:.4f} s, {c.expected_energy_j:.1f} J)",
            )
        )
    t = view.telemetry
    if t is not None and t.measured_time_s is not None and t.measured_energy_j is not None:
        lines.append(
            ("measured", f"{t.measured_time_s:.4f} s, {t.measured_energy_j:.1f} J per iteration")
        )
    width = max(len(label) for label, _ in lines)
    text = "".join(f"{label.ljust(width)}  {value}\n" for label, value in lines)
    if view.savings is not None:
        text += "\n" + format_savings(view.savings)
    return text


_PROFILING_SHOWN = 8
"""Ranks whose profiling progress ``perseus job status`` prints one by one (then the slowest)."""


def _profiling_lines(ranks: Sequence[RankProfiling]) -> list[tuple[str, str]]:
    """A line per rank sweeping its clocks (the slowest ones of a large job)."""
    if len(ranks) > _PROFILING_SHOWN:
        ranks = sorted(ranks, key=lambda r: -1.0 if r.time_left_s is None else r.time_left_s)
        shown = sorted(ranks[-_PROFILING_SHOWN:], key=lambda r: r.rank)
        lines = [(f"rank {r.rank}", profiling_text(r)) for r in shown]
        more = len(ranks) - len(shown)
        return [*lines, ("", f"and {more} more ranks profiling, with less time left")]
    return [(f"rank {r.rank}", profiling_text(r)) for r in ranks]


def profiling_text(progress: RankProfiling) -> str:
    """``profiling: 12 of 110 clocks, 3.4 s per clock, about 5 min 40 s left``."""
    text = f"profiling: {progress.clocks_done} of {progress.clocks_planned} clocks"
    if progress.seconds_per_clock is None or progress.time_left_s is None:
        return text + " (the time left is known once the first clock is measured)"
    return (
        f"{text}, {progress.seconds_per_clock:.1f} s per clock, "
        f"about {duration_text(progress.time_left_s)} left"
    )


def duration_text(seconds: float) -> str:
    """``42 s``, ``5 min 40 s``, ``1 h 05 min``: a wait, to the second below ten minutes."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 600:
        return f"{whole // 60} min {whole % 60} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _utc(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _iterations_text(counts: JobCounts) -> str:
    if not counts.iterations_reported:
        return "no iterations reported"
    if counts.iterations is None:  # an older server: only the reports' total
        return f"{counts.iterations_reported} reports (every rank's counted)"
    return f"{counts.iterations} iterations ({counts.iterations_reported} reports from the ranks)"


def format_job_list(jobs: Sequence[JobSummary]) -> str:
    """The planner's jobs as a table: id, state, plan version, created, name."""
    if not jobs:
        return "no jobs\n"
    rows = [["job", "state", "version", "created (UTC)", "name"]]
    for job in jobs:
        created = datetime.fromtimestamp(job.created_at_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        rows.append([job.job_id, job.state, str(job.version), created, printable(job.name or "")])
    return format_table(rows, right=(2,))


def format_savings(savings: SavingsView) -> str:
    """Measured baseline and plan side by side, then realized against predicted.

    Times are the median over ranks of each rank's median (p10-p90 the same over the
    ranks' p10 and p90); energies the sum over ranks (one iteration of the whole job).
    """
    rows = [["measured", "time (s)", "p10-p90 (s)", "energy (J)", "p10-p90 (J)", "iterations"]]
    for label, stats in (
        ("baseline (default clocks)", savings.baseline),
        (f"plan version {savings.plan_version}", savings.plan),
    ):
        if stats is None:
            rows.append([label, "-", "", "-", "", "0"])
            continue
        rows.append(
            [
                label,
                f"{stats.time_s:.4f}",
                f"{stats.time_p10_s:.4f}-{stats.time_p90_s:.4f}",
                f"{stats.energy_j:.1f}",
                f"{stats.energy_p10_j:.1f}-{stats.energy_p90_j:.1f}",
                f"{stats.iterations} ({stats.ranks} ranks)",
            ]
        )
    compared = [
        ["", "slowdown", "saving"],
        ["realized", _percent(savings.realized_slowdown), _percent(savings.realized_saving)],
        ["predicted", _percent(savings.predicted_slowdown), _percent(savings.predicted_saving)],
    ]
    saved = (
        f"energy saved so far  {savings.energy_saved_j:,.0f} J "
        f"({savings.energy_saved_kwh:.4g} kWh) of {savings.energy_j:,.0f} J reported\n"
    )
    warning = "" if savings.warning is None else f"warning: {savings.warning}\n"
    return (
        format_table(rows, right=range(1, 5))
        + "\n"
        + format_table(compared, right=(1, 2))
        + saved
        + warning
    )


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:+.1f} %"


def _straggler_text(view: JobView) -> str:
    s = view.straggler
    if s is None:
        return "none"
    if s.slowdown is not None:
        text = f"{s.slowdown:g}x slower"
    elif s.iteration_time_s is not None:
        text = f"{s.iteration_time_s:.4f} s per iteration"
    else:
        text = "set"
    if s.automatic:
        text += f" (detected: replicas {', '.join(map(str, s.data_parallel_ranks))})"
    return text


def format_frontier(view: FrontierView, *, blocking_w: float | None = None) -> str:
    """The frontier's span, baselines and chosen points as a table.

    Under a straggler that slows the pipeline (``view.straggler_time_s`` longer than the
    chosen point's time), the rows are ``perseus plan --straggler``'s: the reference stretched
    to the straggler's iteration time and the chosen (straggler) point at that time, its
    saving against the stretched reference; its time and energy are those ``perseus job
    status`` expects. Stretching needs ``blocking_w``, the pipeline's blocking power (stages
    times the per-stage ``p_block_w``); without it the straggler point is shown at its own
    time, and says so.
    """
    from perseus.cli.plan import straggler_note, stretched

    points = view.points
    if not points:
        return "frontier  no points\n"
    first, last = points[0], points[-1]
    key = reference_key(view.baselines)
    reference = view.baselines[key] if key is not None else first
    ref_s, ref_j = reference.time_s, reference.energy_j
    against = baseline_label(key) if key is not None else "the fastest point"
    head = (
        f"frontier  {len(points)} points\n"
        f"time      {first.time_s:.4f} s to {last.time_s:.4f} s\n"
        f"energy    {first.energy_j:.1f} J to {last.energy_j:.1f} J\n\n"
    )

    def row(label: str, time_s: float, energy_j: float, base_j: float = ref_j) -> list[str]:
        return [
            label,
            f"{time_s:.4f}",
            f"{energy_j:.1f}",
            saving_text(energy_j, base_j),
            f"{100 * (time_s / ref_s - 1):.2f} %",
        ]

    rows = [["plan", "time (s)", "energy (J)", "saving", "slowdown"]]
    for name, baseline in shown_baselines(view.baselines):
        rows.append(row(baseline_label(name), baseline.time_s, baseline.energy_j))
    n = len(points)
    chosen = points[view.chosen_index]
    named = "policy" if view.policy is None else f"policy {policy_text(view.policy)}"
    notes = [f"saving and slowdown are against {against}"]
    iteration_s = view.straggler_time_s
    slows = iteration_s is not None and (
        view.chosen_index != view.policy_index or iteration_s > chosen.time_s * (1 + 1e-12)
    )
    if iteration_s is None or not slows:
        rows.append(row(f"chosen: {named} (point {view.chosen_index} of {n})", *_te(chosen)))
        if iteration_s is not None:
            notes.append(
                f"straggler: it does not slow this pipeline (the iteration takes "
                f"{iteration_s:.4f} s,\nthe chosen plan's own time): the chosen plan runs as it is"
            )
    else:
        policy = points[view.policy_index]
        rows.append(row(f"{named} (point {view.policy_index} of {n})", *_te(policy)))
        label = f"chosen: straggler (point {view.chosen_index} of {n})"
        if blocking_w is None:
            rows.append(row(f"{label}, at its own time", *_te(chosen)))
            notes.append(
                f"straggler: the iteration takes {iteration_s:.4f} s because of another "
                "pipeline;\nthis view lacks the blocking power to stretch the plans to it: the "
                "point is at its own time\n(perseus job status: its energy at that time)"
            )
        else:
            base_s, base_j = stretched(ref_s, ref_j, blocking_w, iteration_s)
            if base_s > ref_s:
                rows.append(row(f"{against}, stretched", base_s, base_j, base_j))
            at_s, at_j = stretched(chosen.time_s, chosen.energy_j, blocking_w, iteration_s)
            rows.append(row(label, at_s, at_j, base_j))
            notes.append(straggler_note(against, iteration_s, ref_s))
    table = format_table(rows, right=range(1, 5))
    return head + table + "".join(f"{note}\n" for note in notes)


def _te(point: FrontierPoint) -> tuple[float, float]:
    return point.time_s, point.energy_j


def version_text(reply: PlanVersion) -> str:
    """What a policy or straggler change led to: the new plan, or why there is none yet."""
    if reply.chosen is None:
        return f"stored; the job is {reply.state}, plans follow once it is planned"
    c = reply.chosen
    return (
        f"plan version {reply.version}, point {c.index}: {c.time_s:.4f} s, "
        f"{c.energy_j:.1f} J per iteration (expected {c.expected_iteration_time_s:.4f} s, "
        f"{c.expected_energy_j:.1f} J)"
    )


def validation_text(err: ValidationError) -> str:
    """A pydantic error in one line: ``field: message; ...``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'job'}: {e['msg']}" for e in err.errors()
    )
