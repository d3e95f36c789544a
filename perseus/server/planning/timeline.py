"""The timeline of the plan a job runs, for the web page: the chosen point's clocks replayed on
the profile the frontier was planned on (:func:`perseus.solver.replay`, as ``perseus plan
--timeline`` draws it), per GPU in execution order.

Pure: the route hands it the job's row, frontier and profile; nothing here reads the store.
"""

from __future__ import annotations

from perseus.core.errors import JobStateError
from perseus.schemas import TimelineInstruction, TimelineView
from perseus.server.planning.plans import choice_of, not_ready
from perseus.server.store.job_store import JobRow
from perseus.solver import Frontier, Profile

__all__ = ["timeline_view"]


def timeline_view(job: JobRow, frontier: Frontier, profile: Profile | None) -> TimelineView:
    """Replay the point the job's ranks run (the straggler's while one is set).

    Args:
        job: The job's row (its version and chosen point).
        frontier: The job's frontier at ``job.frontier_rev``.
        profile: The profile that frontier was planned on.

    Returns:
        Every instruction's clock, start and finish. O(n) for n instructions.

    Raises:
        PlanNotReady: the job has no plan at its version.
        JobStateError: the frontier was stored without its profile (planned by an older
            server): the job needs planning again to show a timeline.
    """
    choice = choice_of(job)
    if choice is None:
        raise not_ready(job)
    if profile is None:
        raise JobStateError(
            f"job {job.id}: its frontier was stored without its profile; "
            "plan it again ('perseus job replan') to see the timeline"
        )
    index = choice.chosen_index
    point = frontier.point(index)
    schedule = frontier.schedule
    replayed = frontier.replay_point(profile, index)
    chunked = schedule.virtual_stages > 1
    low_mhz, high_mhz = profile.clock_range_mhz
    return TimelineView(
        version=job.version,
        point=index,
        time_s=float(point.time_s),
        energy_j=float(point.energy_j),
        clock_change_margin_s=frontier.clock_change_margin_s,
        clock_change_delay_s=frontier.clock_change_delay_s,
        clock_change_delay_rank=job.clock_delay_rank,
        min_frequency_mhz=low_mhz,
        max_frequency_mhz=high_mhz,
        gpus=[
            [
                TimelineInstruction(
                    instruction=ins.kind,
                    microbatch=ins.microbatch,
                    chunk=ins.chunk if chunked else None,
                    frequency_mhz=int(point.frequencies_mhz[gpu][k]),
                    time_s=float(replayed.durations_s[gpu][k]),
                    start_s=float(replayed.start_s[gpu][k]),
                    finish_s=float(replayed.finish_s[gpu][k]),
                    critical=bool(replayed.critical[gpu][k]),
                )
                for k, ins in enumerate(order)
            ]
            for gpu, order in enumerate(schedule.order)
        ],
        p_block_w=float(frontier.p_block_w),
    )
