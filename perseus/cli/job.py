"""``perseus job ...``: create, inspect and steer jobs on a planner server from a shell.

``perseus job create`` prints ``export`` lines, so ``eval "$(perseus job create ...)"`` sets
``PERSEUS_SERVER``, ``PERSEUS_JOB`` and ``PERSEUS_TOKEN`` for the commands (and the training
ranks) that follow; every other job command reads them unless told otherwise.

This module is imported only when ``perseus job`` runs, and imports the HTTP client (httpx,
pydantic) only when a command talks to the planner, so ``perseus job --help`` works without
the client extra. Command errors are :class:`CommandError` (a bad command line or environment)
or :class:`~perseus.core.errors.PerseusError`; both print as one ``perseus: error:`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from perseus.cli.arguments import Parser, UsageError, finite_number, needs, positive_int
from perseus.cli.arguments import policy as policy_argument
from perseus.cli.job_context import (
    ADMIN_TOKEN_ENV,
    JOB_ENV,
    SERVER_ENV,
    TOKEN_ENV,
    CommandError,
    JobContext,
    get_answer,
    job_id_of,
    job_path,
    open_client,
    server_url,
    token_of,
)
from perseus.cli.job_views import (
    format_frontier,
    format_job,
    format_job_list,
    policy_spec,
    policy_text,
    validation_text,
    version_text,
)
from perseus.cli.outputs import check_writable, write_files
from perseus.core.errors import (
    AuthError,
    JobNotFound,
    PerseusError,
    PlannerUnavailable,
    PlanNotReady,
)

if TYPE_CHECKING:
    from perseus.schemas import FrontierView, JobSummary

__all__ = [
    "ADMIN_TOKEN_ENV",
    "JOB_ENV",
    "SERVER_ENV",
    "TOKEN_ENV",
    "CommandError",
    "add_job_arguments",
    "build_parser",
    "run",
    "run_job",
]


# ----------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus job`` and its subcommands."""
    parser = Parser(
        prog="perseus job",
        description="Create, inspect and steer jobs on a planner server. The server, "
        "job and token default to $PERSEUS_SERVER, $PERSEUS_JOB and $PERSEUS_TOKEN, as "
        'eval "$(perseus job create ...)" sets them.',
    )
    add_job_arguments(parser)
    return parser


def run(argv: list[str]) -> int:
    """Run ``perseus job`` with ``argv`` (the arguments after ``job``); returns 0.

    Raises:
        UsageError: A bad command line, or what :func:`run_job` raises, prefixed with the
            subcommand (``job status: ...``).
    """
    args = build_parser().parse_args(argv)
    with needs(f"job {argv[0]}", "client", "the client"):
        try:
            return run_job(args)
        except UsageError:
            raise  # prefixed where it was raised
        except (CommandError, PerseusError) as err:
            raise UsageError(f"job {argv[0]}: {err}") from err


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``perseus job`` subcommands to ``parser`` (their errors use its class).

    Each subcommand sets ``args.job_command``; run it with :func:`run_job`.
    """
    from perseus.core.pipeline import SCHEDULE_NAMES

    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument(
        "--server", metavar="URL", help=f"planner server (default ${SERVER_ENV})"
    )
    connection.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=finite_number(0, inclusive=False),
        help="connect, read and write timeout (default 5 s connect, 30 s read and write)",
    )
    job = argparse.ArgumentParser(add_help=False)
    job.add_argument("job", metavar="JOB", nargs="?", help=f"the job's id (default ${JOB_ENV})")
    job.add_argument(
        "--token",
        metavar="TOKEN",
        help=f"the job's token (default ${TOKEN_ENV}, else ${ADMIN_TOKEN_ENV})",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the server's JSON view")

    commands = parser.add_subparsers(
        title="commands", metavar="COMMAND", parser_class=type(parser), required=True
    )
    create = commands.add_parser(
        "create",
        parents=[connection],
        help="create a job; prints export lines for eval",
        description="Create a job on the planner and print 'export PERSEUS_SERVER=...', "
        "'export PERSEUS_JOB=...' and 'export PERSEUS_TOKEN=...' for "
        'eval "$(perseus job create ...)". Sends $PERSEUS_ADMIN_TOKEN if set.',
    )
    create.add_argument(
        "--stages", metavar="S", type=positive_int, required=True, help="pipeline stages"
    )
    create.add_argument(
        "--microbatches", metavar="M", type=positive_int, required=True, help="microbatches"
    )
    create.add_argument("--schedule", choices=SCHEDULE_NAMES, default="1f1b", help="(default 1f1b)")
    create.add_argument(
        "--virtual-stages",
        metavar="V",
        type=positive_int,
        help="model chunks per GPU for the chunked schedules (interleaved-1f1b, interleaved-zb, "
        "zbv, dualpipev, looped-bfs; default 2 there, else 1)",
    )
    create.add_argument(
        "--data-parallel", metavar="D", type=positive_int, default=1, help="(default 1)"
    )
    create.add_argument(
        "--tensor-parallel", metavar="T", type=positive_int, default=1, help="(default 1)"
    )
    create.add_argument(
        "--policy",
        metavar="POLICY",
        type=policy_argument,
        help="no-slowdown (default), max-slowdown:FACTOR, deadline:SECONDS, min-energy, "
        "zeus-cost:ETA",
    )
    create.add_argument(
        "--p-block",
        metavar="WATTS",
        type=finite_number(0, inclusive=False),
        help="blocking power of one waiting GPU (default: what the ranks measure)",
    )
    create.add_argument("--name", metavar="NAME", help="a name to recognize the job by")
    create.add_argument(
        "--auto-straggler",
        action="store_true",
        help="move the other replicas to a consistently slower replica's pace",
    )
    create.set_defaults(job_command=_create)

    status = commands.add_parser(
        "status",
        parents=[connection, job, as_json],
        help="the job's state, counts, policy, chosen point, telemetry",
        description="Show the job's state, counts, policy, straggler and chosen point.",
    )
    status.set_defaults(job_command=_status)

    listing = commands.add_parser(
        "list",
        parents=[connection, as_json],
        help="the planner's jobs: id, name, state, plan version",
        description="List the planner's jobs, oldest first. Sends --token, else "
        f"${ADMIN_TOKEN_ENV} (a server with an admin token requires it).",
    )
    listing.add_argument(
        "--token", metavar="TOKEN", help=f"the admin token (default ${ADMIN_TOKEN_ENV})"
    )
    listing.set_defaults(job_command=_list)

    frontier = commands.add_parser(
        "frontier",
        parents=[connection, job, as_json],
        help="the job's time-energy frontier, baselines and chosen point",
        description="Show the job's time-energy frontier: its span, the baselines and the "
        "points the policy and a straggler choose. -o writes the perseus.frontier/1 file "
        "(every point's clocks) that 'perseus simulate' replays.",
    )
    frontier.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the frontier file (perseus.frontier/1, with clocks) for perseus simulate",
    )
    frontier.add_argument(
        "--plot", metavar="FILE", help="draw the frontier and the chosen point as a PNG"
    )
    frontier.add_argument(
        "--timeline",
        metavar="FILE",
        help="draw the timeline of the plan the ranks run (per GPU, coloured by clock) as a PNG",
    )
    frontier.set_defaults(job_command=_frontier)

    replan = commands.add_parser(
        "replan",
        parents=[connection, job],
        help="plan the job again now, on the profiles in",
        description="Plan the job again now, on the profiles the ranks reported (a re-run "
        "of the training re-profiles; the job replans by itself once every rank's new "
        "profile is in, this does it at once). The ranks follow the new plan version.",
    )
    replan.set_defaults(job_command=_replan)

    policy = commands.add_parser(
        "policy",
        parents=[connection, job],
        help="change the job's policy",
        description="Change the job's policy; with a frontier, the ranks' plans move.",
    )
    policy.add_argument(
        "policy",
        metavar="POLICY",
        type=policy_argument,
        help="no-slowdown, max-slowdown:FACTOR, deadline:SECONDS, min-energy, zeus-cost:ETA",
    )
    policy.set_defaults(job_command=_set_policy)

    straggler = commands.add_parser(
        "straggler",
        parents=[connection, job],
        help="declare (or clear) that another pipeline sets the pace",
        description="Declare that another pipeline sets the pace, by how much slower or "
        "by its iteration time; or clear it.",
    )
    which = straggler.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--slowdown",
        metavar="X",
        type=finite_number(1, inclusive=True),
        help="iterations take X times this job's plan",
    )
    which.add_argument(
        "--iteration-time",
        metavar="SECONDS",
        type=finite_number(0, inclusive=False),
        help="iterations take this long",
    )
    which.add_argument("--clear", action="store_true", help="no straggler any more")
    straggler.set_defaults(job_command=_straggler)

    delete = commands.add_parser(
        "delete",
        parents=[connection, job],
        help="delete the job",
        description="Delete the job. Sends --token, else $PERSEUS_ADMIN_TOKEN when set "
        "(a server with an admin token requires it), else $PERSEUS_TOKEN.",
    )
    delete.set_defaults(job_command=_delete)

    profile = commands.add_parser(
        "profile",
        parents=[connection, job],
        help="the job's merged profile (for perseus plan)",
        description="Write the job's profile, each stage's ranks merged as for planning: "
        "perseus.profile/1 JSON when FILE ends in .json, else the Zeus CSV with a last "
        "p_block_w column; both carry the blocking power, so 'perseus plan' takes either as "
        "it is.",
    )
    profile.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        default="-",
        help="where to write (default '-': standard output)",
    )
    profile.set_defaults(job_command=_profile)


# ----------------------------------------------------------------------------- running


def run_job(
    args: argparse.Namespace,
    *,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
) -> int:
    """Run the ``perseus job`` subcommand ``args`` names.

    Args:
        args: parsed by a parser :func:`add_job_arguments` built.
        environ: where ``PERSEUS_*`` defaults come from (``os.environ`` if None).
        out: where results go (standard output if None).

    Returns:
        0.

    Raises:
        CommandError: no server, job or token was given; the planner is unreachable, the
            token is wrong, the job unknown or not ready (the message says what to check).
        PerseusError: the planner refused the request (the message says why).
    """
    env = os.environ if environ is None else environ
    stream = sys.stdout if out is None else out
    server = server_url(args, env)
    command: Callable[[argparse.Namespace, JobContext], None] = args.job_command
    try:
        command(args, JobContext(server, env, stream))
    except PlannerUnavailable as err:
        raise CommandError(
            f"{err}; is the planner running there? (--server or ${SERVER_ENV})"
        ) from err
    except AuthError as err:
        hint = (
            f"pass --token or set ${TOKEN_ENV}"
            if err.status_code == 401
            else f"check ${TOKEN_ENV} or --token"
        )
        raise CommandError(f"{err}: {hint}") from err
    except JobNotFound as err:
        raise CommandError(f"{err} on {server}; check the job id (${JOB_ENV})") from err
    except PlanNotReady as err:
        raise CommandError(f"{err}; see 'perseus job status' and try again later") from err
    return 0


def _create(args: argparse.Namespace, ctx: JobContext) -> None:
    import httpx
    from pydantic import ValidationError

    from perseus.client.api.client import DEFAULT_TIMEOUT, create_job
    from perseus.schemas import JobCreate

    fields: dict[str, object] = {
        "schedule": args.schedule,
        "stages": args.stages,
        "microbatches": args.microbatches,
        "data_parallel": args.data_parallel,
        "tensor_parallel": args.tensor_parallel,
        "auto_straggler": args.auto_straggler,
    }
    virtual_stages = args.virtual_stages
    from perseus.core.pipeline import CHUNKED_SCHEDULES

    if virtual_stages is None and args.schedule in CHUNKED_SCHEDULES:
        virtual_stages = 2  # as `perseus plan` does
    optional = {
        "virtual_stages": virtual_stages,
        "name": args.name,
        "p_block_w": args.p_block,
        "policy": None if args.policy is None else policy_spec(args.policy),
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    try:
        spec = JobCreate.model_validate(fields)
    except ValidationError as err:
        raise CommandError(validation_text(err)) from None
    timeout = DEFAULT_TIMEOUT if args.timeout is None else httpx.Timeout(args.timeout)
    with httpx.Client(base_url=ctx.server, timeout=timeout) as http:
        created = create_job(http, spec, ctx.env.get(ADMIN_TOKEN_ENV) or None)
    ctx.out.write(f"export {SERVER_ENV}={shlex.quote(ctx.server)}\n")
    ctx.out.write(f"export {JOB_ENV}={shlex.quote(created.job_id)}\n")
    ctx.out.write(f"export {TOKEN_ENV}={shlex.quote(created.token)}\n")


def _list(args: argparse.Namespace, ctx: JobContext) -> None:
    from perseus.schemas import JOBS_PATH, JobList

    token = args.token or ctx.env.get(ADMIN_TOKEN_ENV) or None
    jobs: list[JobSummary] = []
    while True:  # the server answers at most 1,000 per page
        response = get_answer(ctx, args, f"{JOBS_PATH}?limit=1000&offset={len(jobs)}", token)
        page = JobList.model_validate_json(response.content).jobs
        jobs.extend(page)
        if len(page) < 1000:
            break
    if args.json:
        ctx.out.write(JobList(jobs=jobs).model_dump_json(indent=2) + "\n")
    else:
        ctx.out.write(format_job_list(jobs))


def _status(args: argparse.Namespace, ctx: JobContext) -> None:
    with open_client(args, ctx) as client:
        view = client.job()
    ctx.out.write(view.model_dump_json(indent=2) + "\n" if args.json else format_job(view))


def _frontier(args: argparse.Namespace, ctx: JobContext) -> None:
    from perseus.schemas import FRONTIER_FILE_PATH

    targets = [
        Path(p) for p in (args.output, args.plot, args.timeline) if p is not None and p != "-"
    ]
    for target in targets:
        refused = check_writable(target)
        if refused is not None:
            raise CommandError(refused)
    document: bytes | None = None
    profile_document: bytes | None = None
    blocking_w: float | None = None
    with open_client(args, ctx) as client:
        view = client.frontier()
        if view.straggler_time_s is not None and not args.json:
            # Stretching the default to the straggler's time needs the pipeline's blocking power.
            job = client.job()
            if job.p_block_w is not None:
                blocking_w = job.p_block_w * job.spec.stages
        if args.output is not None or args.plot is not None or args.timeline is not None:
            path = job_path(FRONTIER_FILE_PATH, client.job_id)
            document = get_answer(
                ctx, args, path, token_of(args, ctx.env, admin_first=False)
            ).content
        if args.timeline is not None:
            from perseus.schemas import PROFILE_JSON_PATH

            path = job_path(PROFILE_JSON_PATH, client.job_id)
            token = token_of(args, ctx.env, admin_first=False)
            profile_document = get_answer(ctx, args, path, token).content
    if document is not None:
        _write_frontier_files(args, ctx, view, document, profile_document)
        if args.output == "-":
            return
    if args.json:
        ctx.out.write(view.model_dump_json(indent=2) + "\n")
    else:
        ctx.out.write(f"job {client.job_id}, plan version {view.version}\n")
        ctx.out.write(format_frontier(view, blocking_w=blocking_w))


def _write_frontier_files(
    args: argparse.Namespace,
    ctx: JobContext,
    view: FrontierView,
    document: bytes,
    profile_document: bytes | None,
) -> None:
    """``-o``: the frontier file as the server sent it; ``--plot``: its PNG; ``--timeline``:
    the running plan's timeline (needs the job's profile)."""
    files: dict[str, bytes] = {}
    if args.output is not None:
        if args.output == "-":
            ctx.out.write(document.decode())
        else:
            files[args.output] = document
    # the plots draw with matplotlib and replay with the solver: the planner extra
    with needs("job frontier --plot/--timeline", "planner", "the planner"):
        if args.plot is not None:
            files[args.plot] = _frontier_plot(view, document)
        if args.timeline is not None and profile_document is not None:
            from perseus.cli.job_timeline import timeline_png_of

            files[args.timeline] = timeline_png_of(
                view, document, profile_document, job_id=job_id_of(args, ctx.env)
            )
    if not files:
        return
    try:
        write_files(files)
    except OSError as err:
        raise CommandError(f"cannot write {err.filename}: {err.strerror}") from err
    for name in files:
        ctx.out.write(f"wrote {name}\n")


def _frontier_plot(view: FrontierView, document: bytes) -> bytes:
    from perseus.formats.plan_files import frontier_from_json
    from perseus.plots import frontier_png

    frontier = frontier_from_json(document)
    schedule = frontier.schedule
    straggler = (
        None
        if view.straggler_time_s is None or view.chosen_index == view.policy_index
        else (view.straggler_time_s, view.chosen_index)
    )
    policy = "policy" if view.policy is None else policy_text(view.policy)
    deadline_s = getattr(view.policy, "seconds", None)
    return frontier_png(
        frontier,
        view.policy_index,
        baselines=frontier.baselines,
        title=f"plan version {view.version}: {schedule.stages} stages x "
        f"{schedule.microbatches} microbatches",
        policy=policy,
        deadline_s=deadline_s,
        straggler=straggler,
    )


def _replan(args: argparse.Namespace, ctx: JobContext) -> None:
    with open_client(args, ctx) as client:
        reply = client.replan()
    ctx.out.write(
        f"job {client.job_id}: planning on the profiles in (now plan version {reply.version}; "
        "'perseus job status' shows when it is ready)\n"
    )


def _set_policy(args: argparse.Namespace, ctx: JobContext) -> None:
    spec = policy_spec(args.policy)
    with open_client(args, ctx) as client:
        reply = client.set_policy(spec)
    ctx.out.write(f"policy {policy_text(spec)}: {version_text(reply)}\n")


def _straggler(args: argparse.Namespace, ctx: JobContext) -> None:
    from perseus.schemas import StragglerSpec

    with open_client(args, ctx) as client:
        if args.clear:
            reply = client.clear_straggler()
            what = "straggler cleared"
        elif args.slowdown is not None:
            reply = client.set_straggler(StragglerSpec(slowdown=args.slowdown))
            what = f"straggler {args.slowdown:g}x slower"
        else:
            reply = client.set_straggler(StragglerSpec(iteration_time_s=args.iteration_time))
            what = f"straggler at {args.iteration_time:g} s per iteration"
    ctx.out.write(f"{what}: {version_text(reply)}\n")


def _delete(args: argparse.Namespace, ctx: JobContext) -> None:
    with open_client(args, ctx, admin_first=True) as client:
        client.delete()
    ctx.out.write(f"deleted job {client.job_id}\n")


def _profile(args: argparse.Namespace, ctx: JobContext) -> None:
    from perseus.schemas import PROFILE_JSON_PATH

    target = None if args.output == "-" else Path(args.output)
    refused = None if target is None else check_writable(target)
    if refused is not None:
        raise CommandError(f"--output: {refused}")
    as_json = target is not None and target.suffix.lower() == ".json"
    with open_client(args, ctx) as client:
        if as_json:
            path = job_path(PROFILE_JSON_PATH, client.job_id)
            token = token_of(args, ctx.env, admin_first=False)
            document = get_answer(ctx, args, path, token).json()
            text = json.dumps(document, indent=1) + "\n"
            rows = len(document.get("rows", ()))
            carries_p_block = document.get("p_block_w") is not None
        else:
            text = client.profile_csv()
            rows = max(text.count("\n") - 1, 0)
            # the server writes the p_block_w column when it knows the blocking power
            carries_p_block = "p_block_w" in text.partition("\n")[0].split(",")
    if target is None:
        ctx.out.write(text)
        return
    _write_atomically(target, text)
    ctx.out.write(f"wrote {target} ({rows} rows)\n")
    if not carries_p_block:
        ctx.out.write(
            "the profile carries no blocking power (the job has no p_block_w and no rank "
            "reported one): plan it with --p-block WATTS\n"
        )


def _write_atomically(target: Path, text: str) -> None:
    """Write whole or not at all (:func:`perseus.outputs.write_files`)."""
    try:
        write_files({str(target): text.encode("utf-8")})
    except OSError as err:
        raise CommandError(f"--output: cannot write {target}: {err.strerror}") from err
