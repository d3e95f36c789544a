"""The saving measured: ranks' iterations at default clocks against those under the plan.

Pure functions over :class:`~perseus.server.store.tables.SampleBucket` values; the iteration log
reads and writes the buckets (:mod:`perseus.server.lifecycle.telemetry`), the job view shows
:func:`savings_view`.

Each rank keeps, per phase, exact counts and sums and its last :data:`SAMPLE_WINDOW`
samples. A pipeline iteration is measured per rank (the rank's own ``time_s``, first
instruction to last); across ranks, times take the median of the ranks' statistics and
energies their sum, so one slow or idle rank neither hides nor dominates the comparison.

The prediction is stated on the same measure (:func:`predicted_spans`): the median over GPUs
of their spans, and the energy every GPU draws over its own span, of the chosen point's
replay against the default plan's. A GPU's span leaves out the pipeline's fill before its
first instruction and drain after its last, blocking time that both plans have: the
whole-iteration energies (the frontier's) would state a smaller saving than the ranks measure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from perseus.schemas import ChosenPoint, IterationReport, SampleStats, SavingsView
from perseus.server.store.tables import SampleBucket
from perseus.solver import BaselineKey, Frontier, Profile, replay

__all__ = [
    "BASELINE",
    "PLAN",
    "SAMPLE_WINDOW",
    "WARN_POINTS",
    "Spans",
    "add_sample",
    "bucket_key",
    "median_energy_j",
    "predicted_spans",
    "savings_view",
]

SAMPLE_WINDOW = 256
"""Most recent samples kept per rank and phase (counts and sums are exact)."""

WARN_POINTS = 0.03
"""The view warns when realized and predicted slowdown or saving differ by more than this."""

BASELINE = "baseline"
PLAN = "plan"
_OTHER = "other"  # an older rank's report that cannot be placed: counted in totals only
_WINDOWED = (BASELINE, PLAN)
_J_PER_KWH = 3.6e6


def bucket_key(report: IterationReport, version: int) -> tuple[str, int]:
    """The ``(phase, plan version)`` a report counts under while the job is at ``version``.

    Plan versions key plan samples only (0 for other phases). A report without a phase (an
    older rank) counts as before phases existed: a plan sample when the job has a plan and
    the report's version is the current one or unset; otherwise in the totals only.
    """
    phase = report.phase
    if phase is None:
        if version > 0 and report.plan_version in (None, version):
            return PLAN, version
        return _OTHER, 0
    if phase == PLAN:
        ran = version if report.plan_version is None else report.plan_version
        return (PLAN, ran) if 0 < ran <= version else (_OTHER, 0)
    return phase, 0


def add_sample(
    bucket: SampleBucket, report: IterationReport, baseline_median_j: float | None
) -> SampleBucket:
    """``bucket`` with ``report`` counted; a plan sample saves ``baseline_median_j`` minus
    its energy (nothing when the rank has no baseline)."""
    times, energies = bucket.recent_times_s, bucket.recent_energies_j
    if bucket.phase in _WINDOWED:
        times = (*times, report.time_s)[-SAMPLE_WINDOW:]
        energies = (*energies, report.energy_j)[-SAMPLE_WINDOW:]
    saved_j, saved_iterations = bucket.saved_j, bucket.saved_iterations
    if bucket.phase == PLAN and baseline_median_j is not None:
        saved_j += baseline_median_j - report.energy_j
        saved_iterations += 1
    return SampleBucket(
        phase=bucket.phase,
        version=bucket.version,
        iterations=bucket.iterations + 1,
        time_s_total=bucket.time_s_total + report.time_s,
        energy_j_total=bucket.energy_j_total + report.energy_j,
        recent_times_s=times,
        recent_energies_j=energies,
        saved_j=saved_j,
        saved_iterations=saved_iterations,
    )


def median_energy_j(bucket: SampleBucket | None) -> float | None:
    """A rank's baseline median energy, None without samples."""
    if bucket is None or not bucket.recent_energies_j:
        return None
    return statistics.median(bucket.recent_energies_j)


def _quantiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(p10, median, p90), linear interpolation between samples."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return deciles[0], statistics.median(values), deciles[-1]


def _stats(buckets: Iterable[SampleBucket]) -> SampleStats | None:
    """One phase over ranks: times by the median of the ranks' quantiles, energies by
    their sum. O(ranks x window log window)."""
    times: list[tuple[float, float, float]] = []
    energies: list[tuple[float, float, float]] = []
    iterations = samples = 0
    for bucket in buckets:
        if not bucket.recent_times_s:
            continue
        iterations += bucket.iterations
        samples += len(bucket.recent_times_s)
        times.append(_quantiles(bucket.recent_times_s))
        energies.append(_quantiles(bucket.recent_energies_j))
    if not times:
        return None
    return SampleStats(
        iterations=iterations,
        ranks=len(times),
        samples=samples,
        time_s=statistics.median(t[1] for t in times),
        time_p10_s=statistics.median(t[0] for t in times),
        time_p90_s=statistics.median(t[2] for t in times),
        energy_j=sum(e[1] for e in energies),
        energy_p10_j=sum(e[0] for e in energies),
        energy_p90_j=sum(e[2] for e in energies),
    )


@dataclass(frozen=True, slots=True)
class Spans:
    """One plan's iteration on the ranks' measure, predicted for one pipeline."""

    time_s: float
    """The median over GPUs of their spans (first instruction's start to last's finish)."""
    energy_j: float
    """Every GPU's energy over its own span, summed."""


def predicted_spans(frontier: Frontier, profile: Profile, index: int) -> tuple[Spans, Spans] | None:
    """The default plan's and point ``index``'s :class:`Spans`, replayed on ``profile`` (the
    one the frontier was planned on) with the frontier's blocking power and clock-change
    margin; None for a frontier without the default baseline. O(n) for n instructions."""
    default = frontier.baselines.get(BaselineKey.DEFAULT)
    if default is None:
        return None
    power = frontier.p_block_w
    replays = (
        replay(profile, frontier.schedule, power, default.frequencies_mhz,
               clock_change_margin_s=frontier.clock_change_margin_s),
        frontier.replay_point(profile, index),
    )  # fmt: skip
    base, point = (Spans(statistics.median(r.spans_s), r.span_energy_j(power)) for r in replays)
    return base, point


def _predicted(
    frontier: Frontier | None, chosen: ChosenPoint | None, spans: tuple[Spans, Spans] | None
) -> tuple[float | None, float | None]:
    """(slowdown, saving) of the chosen point against the frontier's default plan: on the
    ranks' measure where ``spans`` (of the chosen point) are known, else of whole iterations."""
    if spans is not None:
        base, point = spans
        return point.time_s / base.time_s - 1, 1 - point.energy_j / base.energy_j
    default = None if frontier is None else frontier.baselines.get(BaselineKey.DEFAULT)
    if default is None or chosen is None:
        return None, None
    return chosen.time_s / default.time_s - 1, 1 - chosen.energy_j / default.energy_j


def savings_view(
    version: int,
    baseline: Mapping[int, SampleBucket],
    plan: Mapping[int, SampleBucket],
    totals: tuple[float, float],
    frontier: Frontier | None,
    chosen: ChosenPoint | None,
    spans: tuple[Spans, Spans] | None = None,
) -> SavingsView:
    """Measured against predicted, for the job at plan ``version``.

    Args:
        version: the job's plan version.
        baseline: rank -> its baseline bucket.
        plan: rank -> its bucket under plan ``version``.
        totals: ``(energy of every iteration, energy saved)`` in joules, every phase and
            version.
        frontier: the job's frontier, if any (its default baseline is the prediction's
            reference).
        chosen: the point the plans follow.
        spans: :func:`predicted_spans` of the chosen point, where the frontier's profile is
            known: the prediction is then on the ranks' measure.

    Complexity: O(ranks x window log window).
    """
    paired = sorted(baseline.keys() & plan.keys())
    realized_slowdown = realized_saving = None
    base_pair = _stats(baseline[r] for r in paired)
    plan_pair = _stats(plan[r] for r in paired)
    if base_pair is not None and plan_pair is not None:
        realized_slowdown = plan_pair.time_s / base_pair.time_s - 1
        if base_pair.energy_j > 0:
            realized_saving = 1 - plan_pair.energy_j / base_pair.energy_j
    predicted_slowdown, predicted_saving = _predicted(frontier, chosen, spans)
    warnings = [
        f"realized {what} {realized:+.1%} differs from the predicted {predicted:+.1%}"
        for what, realized, predicted in (
            ("slowdown", realized_slowdown, predicted_slowdown),
            ("saving", realized_saving, predicted_saving),
        )
        if realized is not None
        and predicted is not None
        and abs(realized - predicted) > WARN_POINTS
    ]
    energy_j, saved_j = totals
    return SavingsView(
        baseline=_stats(baseline.values()),
        plan=_stats(plan.values()),
        plan_version=version,
        realized_slowdown=realized_slowdown,
        realized_saving=realized_saving,
        predicted_slowdown=predicted_slowdown,
        predicted_saving=predicted_saving,
        energy_j=energy_j,
        energy_saved_j=saved_j,
        energy_saved_kwh=saved_j / _J_PER_KWH,
        warning=(
            "; ".join(warnings) + f" (more than {WARN_POINTS:.0%} apart)" if warnings else None
        ),
    )
