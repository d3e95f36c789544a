"""``perseus cluster budget|status|priority``: the cluster power budget on a planner server.

The server and the token come from the variables ``perseus job`` uses: ``--server`` else
``$PERSEUS_SERVER``; ``--token`` else ``$PERSEUS_ADMIN_TOKEN`` (``priority``: else the job's
``$PERSEUS_TOKEN``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, TextIO

from perseus.cli.job_context import (
    ADMIN_TOKEN_ENV,
    JobContext,
    job_id_of,
    job_path,
    send_answer,
    server_url,
)
from perseus.core.errors import CommandError
from perseus.core.settings import ADMIN_TOKEN, TOKEN

if TYPE_CHECKING:
    from perseus.schemas import ClusterBudgetView

__all__ = ["format_status", "parse_when", "run_budget_command", "watts"]

_RELATIVE = re.compile(r"\+\s*([0-9]*\.?[0-9]+)\s*([smhd])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_when(text: str, now_s: float | None = None) -> float:
    """``+10m``, ``+2h``, ``+30s``, ``+1d`` (from now) or an ISO 8601 time (local time when it
    names no zone) as Unix seconds.

    Raises:
        argparse.ArgumentTypeError: Neither.
    """
    now = time.time() if now_s is None else now_s
    match = _RELATIVE.fullmatch(text.strip())
    if match is not None:
        return now + float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a time such as +10m, +2h or 2027-01-20T14:00, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # the local zone
    return when.timestamp()


def watts(value: float | None) -> str:
    """A power for people: ``2.40 MW``, ``812 kW``, ``950 W``; ``-`` for None."""
    if value is None:
        return "-"
    for scale, unit in ((1e6, "MW"), (1e3, "kW")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} W"


def _time(value: float | None) -> str:
    if value is None:
        return "-"
    return dt.datetime.fromtimestamp(value).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def format_status(view: ClusterBudgetView) -> str:
    """The cluster's budget, power and jobs as aligned text."""
    lines = []
    if view.budget_w is None:
        lines.append("budget      none (every job at its own policy)")
    else:
        lines.append(f"budget      {watts(view.budget_w)}")
    lines.append(f"standing    {watts(view.standing_w)}")
    if view.window is not None:
        w = view.window
        state = "active" if w.active else "ended" if w.ended else "scheduled"
        lines.append(
            f"window      {watts(w.power_w)} from {_time(w.from_s)} to {_time(w.to_s)} ({state})"
        )
    lines.append(
        f"predicted   {watts(view.predicted_w)} (policies {watts(view.policy_w)}, "
        f"least {watts(view.least_w)})"
    )
    lines.append(f"measured    {watts(view.measured_w)}")
    if view.met is not None:
        met = "yes" if view.met else f"NO, {watts(view.shortfall_w)} over"
        lines.append(f"met         {met}")
    lines.append(f"slowdown    {view.weighted_slowdown:.4f} (priority-weighted, summed)")
    if view.message is not None:
        lines.append(f"note        {view.message}")
    if view.jobs:
        header = ("job", "name", "counted", "priority", "power", "measured", "share", "slower",
                  "saved kWh")  # fmt: skip
        rows = [header]
        for job in view.jobs:
            rows.append(
                (
                    job.job_id,
                    job.name or "-",
                    job.counted,
                    f"{job.priority:g}",
                    watts(job.predicted_w),
                    watts(job.measured_w),
                    f"{100 * job.share:.1f} %",
                    f"{100 * job.slowdown:.1f} %",
                    f"{job.energy_saved_j / 3.6e6:.3f}",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines.append("")
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                  for row in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def _admin_token(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    token: str | None = args.token or ADMIN_TOKEN.text(env)
    return token or None


def run_budget_command(
    args: argparse.Namespace, env: Mapping[str, str], out: TextIO, power_w: float | None
) -> None:
    """Run ``budget``, ``status`` or ``priority`` (``args.cluster_command``).

    Args:
        args: the parsed command line.
        env: where ``PERSEUS_*`` defaults come from.
        out: where results go.
        power_w: the budget ``budget`` sets (None: ``off``).

    Raises:
        CommandError: no server, job or token; an unreachable planner.
        PerseusError: the planner refused the request (the message says why).
    """
    from perseus.schemas import CLUSTER_BUDGET_PATH, PRIORITY_PATH, ClusterBudgetView, PlanVersion

    ctx = JobContext(server_url(args, env), env, out)
    command = args.cluster_command
    if command == "priority":
        job_id = job_id_of(args, env)
        token = args.token or ADMIN_TOKEN.text(env) or TOKEN.text(env)
        if not token:
            raise CommandError(f"no token: pass --token or set ${ADMIN_TOKEN_ENV}")
        response = send_answer(
            ctx, args, "PUT", job_path(PRIORITY_PATH, job_id), token, {"priority": args.priority}
        )
        reply = PlanVersion.model_validate_json(response.content)
        out.write(f"job {job_id}: priority {args.priority:g} (plan version {reply.version})\n")
        return
    token = _admin_token(args, env)
    if command == "status":
        response = send_answer(ctx, args, "GET", CLUSTER_BUDGET_PATH, token)
    elif power_w is None:
        response = send_answer(ctx, args, "DELETE", CLUSTER_BUDGET_PATH, token)
    else:
        body: dict[str, float] = {"power_w": power_w}
        if args.start is not None:
            body["from_s"] = args.start
        if args.end is not None:
            body["to_s"] = args.end
        response = send_answer(ctx, args, "PUT", CLUSTER_BUDGET_PATH, token, body)
    view = ClusterBudgetView.model_validate_json(response.content)
    out.write(view.model_dump_json(indent=2) + "\n" if args.json else format_status(view))
