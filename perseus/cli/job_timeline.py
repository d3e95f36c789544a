"""``perseus job frontier --timeline FILE``: the timeline of the plan a job runs, as a PNG.

The server's frontier file carries every point's clocks and the fingerprint of the profile it
was planned on; its ``profile.json`` carries the measurements and the blocking power. Replaying
the running point's clocks on that profile (:func:`perseus.solver.replay`, as ``perseus plan
--timeline`` does) gives the start and finish of every instruction, which
:func:`perseus.plots.timeline_png` draws. Imports matplotlib only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perseus.core.errors import JobStateError, PlanError

if TYPE_CHECKING:
    from perseus.schemas import FrontierView

__all__ = ["timeline_png_of"]


def timeline_png_of(
    view: FrontierView, frontier_document: bytes, profile_document: bytes, *, job_id: str
) -> bytes:
    """Draw the timeline of the point the job runs (``view.chosen_index``: the straggler's
    point while one is set, else the policy's).

    Args:
        view: The job's frontier view (which point runs, the policy, the plan version).
        frontier_document: The server's ``perseus.frontier/1`` file of the same plan.
        profile_document: The server's ``perseus.profile/1`` JSON of the job.
        job_id: For messages.

    Returns:
        The PNG. O(n) for n instructions, plus matplotlib's drawing.

    Raises:
        JobStateError: The ranks re-profiled since the plan was made (the profile is not the
            one the frontier was planned on), so its clocks would replay on other numbers.
        PlanError, ProfileError: A document the server sent does not read.
    """
    from pydantic import ValidationError

    from perseus.formats.plan_files import FrontierFile, profile_fingerprint, validation_message
    from perseus.formats.profiles import profile_from_json

    try:
        file = FrontierFile.model_validate_json(frontier_document)
    except ValidationError as err:
        raise PlanError(f"job {job_id}'s frontier: {validation_message(err)}") from None
    frontier = file.to_frontier()
    profile = profile_from_json(profile_document, source=f"job {job_id}'s profile")
    if file.profile is not None and file.profile.sha256 != profile_fingerprint(profile).sha256:
        raise JobStateError(
            f"job {job_id}: the ranks re-profiled since plan version {view.version} was made; "
            "draw its timeline once the job has planned on the new profiles"
        )
    point = frontier.point(view.chosen_index)
    schedule = frontier.schedule
    replayed = frontier.replay_point(profile, view.chosen_index)
    if view.straggler_time_s is not None and view.chosen_index != view.policy_index:
        running = f"straggler at {view.straggler_time_s:.4f} s"
    else:
        from perseus.cli.job_views import policy_text

        running = "policy" if view.policy is None else policy_text(view.policy)
    from perseus.plots import timeline_png

    return timeline_png(
        schedule,
        replayed,
        point.frequencies_mhz,
        clock_range_mhz=profile.clock_range_mhz,
        title=f"job {job_id}, plan version {view.version}: {schedule.stages} stages x "
        f"{schedule.microbatches} microbatches, {running}, point {view.chosen_index}",
    )
