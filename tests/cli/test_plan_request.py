"""``perseus plan``'s command line and its request, without solving: the parser's argument
types, the checks between arguments and on the output files, the request read from them, the
schedule it names (a named one or a torch schedule file) and the blocking power it plans with."""

from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

import pytest

from perseus.cli.arguments import UsageError
from perseus.cli.plan_request import (
    PlanRequest,
    blocking_power,
    build_parser,
    check_arguments,
    check_outputs,
    request_of,
    request_schedule,
)
from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S, EXACT_TIME_LIMIT_S, POLISH_S
from perseus.core.errors import ProfileError, ScheduleError
from perseus.solver import Policy, load_profile, make_schedule

LETTER = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["profile.csv", *argv])


def torch_csv(path: Path, actions: list[list[tuple[int, str, int]]]) -> str:
    """``actions`` as torch's compute-only schedule CSV (one row per rank)."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        for seq in actions:
            writer.writerow([f"{u}{LETTER[str(k)]}{j}" for u, k, j in seq])
    return str(path)


# ----------------------------------------------------------------------------- the parser


def test_the_parser_fills_in_the_documented_defaults() -> None:
    args = parse("--microbatches", "8")
    assert args.profile == "profile.csv" and args.microbatches == 8
    assert args.schedule is None and args.schedule_file is None and args.policy is None
    assert args.exact is False and args.exact_time_limit == EXACT_TIME_LIMIT_S
    assert args.polish == POLISH_S and args.clock_change_margin == CLOCK_CHANGE_MARGIN_S
    assert args.resolution is None and args.straggler is None


def test_schedules_are_a_comma_separated_list_of_known_names() -> None:
    assert parse("--schedule", "1f1b, gpipe,zbv").schedule == ("1f1b", "gpipe", "zbv")
    with pytest.raises(UsageError, match="unknown schedule 'pipedream'"):
        parse("--schedule", "1f1b,pipedream")
    with pytest.raises(UsageError, match="named twice"):
        parse("--schedule", "gpipe,1f1b,gpipe")


@pytest.mark.parametrize(
    ("text", "ok"), [("0", True), ("0.999", True), ("1", False), ("-0.1", False)]
)
def test_the_clock_change_margin_is_at_least_0_and_less_than_1(text: str, ok: bool) -> None:
    if ok:
        assert parse("--clock-change-margin", text).clock_change_margin == float(text)
    else:
        with pytest.raises(UsageError, match="--clock-change-margin"):
            parse("--clock-change-margin", text)


def test_policies_parse_as_the_solver_reads_them() -> None:
    assert parse("--policy", "max-slowdown:1.1").policy == Policy.parse("max-slowdown:1.1")
    with pytest.raises(UsageError, match="--policy"):
        parse("--policy", "fastest")


# ----------------------------------------------------------------------------- checks


def test_one_schedule_by_default() -> None:
    assert check_arguments(parse("--microbatches", "4")) == ("1f1b",)
    assert check_arguments(parse("--schedule", "zbv,gpipe", "--microbatches", "4")) == (
        "zbv",
        "gpipe",
    )
    assert check_arguments(parse("--schedule-file", "s.csv")) == ("1f1b",)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--microbatches", "4", "--schedule", "1f1b", "--schedule-file", "s.csv"], "not both"),
        ([], "--microbatches: required"),
        (["--microbatches", "4", "--virtual-stages", "2"], "1f1b runs one model chunk"),
        (
            ["--microbatches", "4", "--schedule", "interleaved-1f1b", "--virtual-stages", "1"],
            "runs V >= 2 model chunks",
        ),
        (["--schedule-file", "s.csv", "--virtual-stages", "2"], "says where every stage runs"),
        (["--microbatches", "4", "--schedule", "1f1b,gpipe", "--exact"], "--exact: plans one"),
        (
            ["--microbatches", "4", "--schedule", "1f1b,gpipe", "--timeline", "t.png"],
            "--timeline: plans one schedule; drop it to compare 1f1b, gpipe",
        ),
    ],
)
def test_arguments_that_contradict_each_other(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        check_arguments(parse(*argv))


def test_several_schedules_compare_with_one_chunked() -> None:
    args = parse("--microbatches", "4", "--schedule", "1f1b,zbv", "--virtual-stages", "2")
    assert check_arguments(args) == ("1f1b", "zbv")


@pytest.mark.parametrize("option", ["--plot", "--timeline"])
def test_plots_are_named_png(option: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"{option}: .*PNG"):
        check_outputs(parse(option, str(tmp_path / "plot.jpg")))
    check_outputs(parse(option, str(tmp_path / "plot.PNG")))


def test_an_output_that_cannot_be_written_is_refused_before_solving(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--output"):
        check_outputs(parse("--output", str(tmp_path / "missing" / "frontier.json")))


# ----------------------------------------------------------------------------- the request


def test_the_request_carries_the_arguments_and_the_profile(example: Path) -> None:
    args = build_parser().parse_args(
        [str(example), "--microbatches", "6", "--schedule", "gpipe", "--straggler", "2"]
    )
    request = request_of(args, check_arguments(args))
    assert request.profile == load_profile(example)
    assert request.schedule == "gpipe" and request.microbatches == 6
    assert request.policy == Policy.parse("no-slowdown")
    assert request.straggler_s == 2.0 and request.extra_files == {}


def test_a_bad_profile_is_a_profile_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1980,fast,1\n")
    with pytest.raises(ProfileError, match=r"bad\.csv"):
        request_of(build_parser().parse_args([str(bad), "--microbatches", "2"]), ("1f1b",))


def request(example: Path, **fields: object) -> PlanRequest:
    defaults: dict[str, object] = {
        "profile": load_profile(example),
        "microbatches": 4,
        "p_block_w": None,
        "schedule": "1f1b",
        "virtual_stages": None,
        "policy": Policy.parse("no-slowdown"),
        "resolution_s": None,
        "exact": False,
    }
    return PlanRequest(**(defaults | fields))  # type: ignore[arg-type]


def test_a_named_schedule_on_the_profiles_stages(example: Path) -> None:
    stages = load_profile(example).num_stages
    assert request_schedule(request(example), "1f1b") == make_schedule("1f1b", stages, 4, 1)
    # chunked schedules take two chunks unless told; a comparison keeps V to the chunked ones
    assert request_schedule(request(example), "zbv").virtual_stages == 2
    chunked = request(example, virtual_stages=3)
    assert request_schedule(chunked, "interleaved-1f1b").virtual_stages == 3
    assert request_schedule(chunked, "gpipe").virtual_stages == 1
    with pytest.raises(UsageError, match="--microbatches: required"):
        request_schedule(request(example, microbatches=None), "1f1b")


def test_a_schedule_file_in_a_named_order_is_that_schedule(example: Path, tmp_path: Path) -> None:
    stages = load_profile(example).num_stages
    named = make_schedule("1f1b", stages, 4, 1)
    file = torch_csv(tmp_path / "mine.csv", named.actions())
    assert (
        request_schedule(request(example, schedule_file=file, microbatches=None), "1f1b") == named
    )
    with pytest.raises(UsageError, match="runs 4 microbatches, not 5"):
        request_schedule(request(example, schedule_file=file, microbatches=5), "1f1b")


def test_an_unnamed_order_is_planned_but_not_written(example: Path, tmp_path: Path) -> None:
    stages = load_profile(example).num_stages
    actions = make_schedule("gpipe", stages, 4, 1).actions()
    actions[-1][0], actions[-1][1] = actions[-1][1], actions[-1][0]  # last GPU: F1 before F0
    file = torch_csv(tmp_path / "mine.csv", actions)
    schedule = request_schedule(request(example, schedule_file=file), "1f1b")
    assert schedule.actions() == actions
    with pytest.raises(UsageError, match="none of the named schedules"):
        request_schedule(request(example, schedule_file=file, plan_output="p.json"), "1f1b")


def test_a_file_that_deadlocks_names_its_actions(example: Path, tmp_path: Path) -> None:
    stages = load_profile(example).num_stages
    actions = make_schedule("1f1b", stages, 2, 1).actions()
    actions[0].reverse()  # the first GPU's backwards before its forwards: a cycle
    file = torch_csv(tmp_path / "x.csv", actions)
    with pytest.raises(ScheduleError, match=r"deadlocks.*GPU 0 backward 1 of stage 0"):
        request_schedule(request(example, schedule_file=file, microbatches=None), "1f1b")


def test_the_blocking_power_given_else_the_profiles(example: Path) -> None:
    profile = load_profile(example)
    assert profile.p_block_w is None  # a CSV without the column
    assert blocking_power(80.0, profile) == 80.0
    with pytest.raises(ProfileError, match="p_block_w: the profile carries no blocking power"):
        blocking_power(None, profile)
    carried = replace(profile, p_block_w=95.0)
    assert blocking_power(None, carried) == 95.0
    assert blocking_power(80.0, carried) == 80.0
