"""Client settings: arguments first, then ``PERSEUS_*`` variables; bad values are clear errors."""

from __future__ import annotations

import pytest

from perseus.client.gpu.control import open_gpu
from perseus.client.gpu.fake import FakeGpu
from perseus.client.settings import (
    GPU_MODES,
    ClientSettings,
    ProfileBudget,
    SettingsError,
    load_settings,
)
from perseus.core.defaults import BASELINE_ITERATIONS

SERVER = {"PERSEUS_SERVER": "http://planner:7787", "PERSEUS_JOB": "j", "PERSEUS_TOKEN": "t"}


def test_settings_are_validated() -> None:
    with pytest.raises(SettingsError, match="PERSEUS_GPU"):
        load_settings({"PERSEUS_GPU": "nvidia"})
    with pytest.raises(SettingsError, match="PERSEUS_JOB and PERSEUS_TOKEN"):
        load_settings({"PERSEUS_SERVER": "http://127.0.0.1:7787"})
    with pytest.raises(SettingsError, match="http://"):
        load_settings(
            {"PERSEUS_SERVER": "127.0.0.1:7787", "PERSEUS_JOB": "j", "PERSEUS_TOKEN": "t"}
        )
    with pytest.raises(SettingsError, match="PERSEUS_PROFILE_CLOCKS"):
        load_settings({"PERSEUS_PROFILE_CLOCKS": "every:x"})
    with pytest.raises(SettingsError, match="PERSEUS_PROFILE_WINDOW_S"):
        load_settings({"PERSEUS_PROFILE_WINDOW_S": "nan"})
    with pytest.raises(SettingsError, match="PERSEUS_RANK"):
        load_settings({"PERSEUS_RANK": "-1"})
    for server in ("http://", "http://planner:abc", "http://planner:99999", "http://[::1",
                   "http://planner:0"):  # fmt: skip
        with pytest.raises(SettingsError, match="PERSEUS_SERVER"):
            load_settings({"PERSEUS_SERVER": server, "PERSEUS_JOB": "j", "PERSEUS_TOKEN": "t"})
    with pytest.raises(SettingsError, match="PERSEUS_STAGE"):
        load_settings({"PERSEUS_STAGE": "\u00b2"})  # a digit to str.isdigit, not to int()
    s = load_settings({"RANK": "3", "LOCAL_RANK": "1", "PERSEUS_GPU": "dry-run"})
    assert (s.server, s.rank, s.gpu_index, s.gpu) == (None, 3, 1, "dry-run")
    assert load_settings({}, rank=5, stage=2).stage == 2
    # every field can be given as an argument, and is then validated like its variable
    given = load_settings({"PERSEUS_POLL_WAIT_S": "9"}, poll_wait_s=2.5, telemetry_queue=16)
    assert (given.poll_wait_s, given.telemetry_queue) == (2.5, 16)
    assert load_settings({"PERSEUS_POLL_WAIT_S": "9"}).poll_wait_s == 9.0
    for name, bad in (("poll_wait_s", 0.0), ("poll_wait_s", "5"), ("telemetry_queue", 0),
                      ("telemetry_queue", True)):  # fmt: skip
        with pytest.raises(SettingsError, match=name):
            load_settings({}, **{name: bad})


def test_clock_change_settings() -> None:
    default = load_settings({})
    assert default.clock_latency_s == 0.03
    assert default.baseline_iterations == BASELINE_ITERATIONS
    assert default.fake_clock_delay_s is None  # the fake's model keeps its 20 ms
    s = load_settings(
        {
            "PERSEUS_CLOCK_LATENCY_S": "0.012",
            "PERSEUS_BASELINE_ITERATIONS": "0",
            "PERSEUS_FAKE_CLOCK_DELAY_S": "0.04",
        }
    )
    assert (s.clock_latency_s, s.baseline_iterations, s.fake_clock_delay_s) == (0.012, 0, 0.04)
    assert load_settings({}, fake_clock_delay_s=0).fake_clock_delay_s == 0.0
    with pytest.raises(SettingsError, match="clock_latency_s: must be a finite number >= 0"):
        load_settings({}, clock_latency_s=1.5)


def test_the_fake_takes_its_delay_from_the_setting() -> None:
    gpu = open_gpu("fake", 0, fake_clock_delay_s=0.04)
    assert isinstance(gpu, FakeGpu) and gpu.model.clock_change_delay_s == 0.04
    gpu = open_gpu("fake", 0)
    assert isinstance(gpu, FakeGpu) and gpu.model.clock_change_delay_s == 0.02


def test_without_variables_perseus_is_off_with_the_defaults() -> None:
    s = load_settings({})
    assert s == ClientSettings()
    assert s.server is None and s.gpu == "nvml" and s.budget == ProfileBudget()


def test_a_server_comes_with_job_and_token_and_loses_its_trailing_slash() -> None:
    s = load_settings({**SERVER, "PERSEUS_SERVER": "https://planner.example/"})
    assert (s.server, s.job, s.token) == ("https://planner.example", "j", "t")
    with pytest.raises(SettingsError, match="PERSEUS_TOKEN not set") as missing:
        load_settings({"PERSEUS_SERVER": "http://planner:7787", "PERSEUS_JOB": "j"})
    assert "perseus job create" in str(missing.value)


def test_arguments_win_over_variables() -> None:
    s = load_settings({**SERVER, "PERSEUS_RANK": "1", "PERSEUS_GPU": "nvml"}, rank=4, gpu="fake")
    assert (s.rank, s.gpu) == (4, "fake")
    assert load_settings({"PERSEUS_JOB": "env"}, job="given").job == "given"


def test_launcher_variables_are_fallbacks_only() -> None:
    s = load_settings({"RANK": "3", "PERSEUS_RANK": "7", "LOCAL_RANK": "1"})
    assert (s.rank, s.gpu_index) == (7, 1)
    with pytest.raises(SettingsError, match="LOCAL_RANK"):
        load_settings({"LOCAL_RANK": "x"})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PERSEUS_RANK", "1.5"),
        ("PERSEUS_GPU_INDEX", "one"),
        ("PERSEUS_DATA_PARALLEL_RANK", "-2"),
        ("PERSEUS_TENSOR_PARALLEL_RANK", " "),
        ("PERSEUS_PROFILE_SETTLE_S", "-0.1"),
        ("PERSEUS_PROFILE_MAX_S", "0.5"),
        ("PERSEUS_PROFILE_BLOCKING_S", "inf"),
        ("PERSEUS_POLL_WAIT_S", "soon"),
        ("PERSEUS_PROFILE_CLOCKS", "1980,,1200"),  # the message shows the bad part, ''
        ("PERSEUS_PROFILE_CLOCKS", "every:0"),  # and here '0'
        ("PERSEUS_GPU", "cuda"),
        ("PERSEUS_CLOCK_LATENCY_S", "-0.01"),
        ("PERSEUS_CLOCK_LATENCY_S", "2"),  # a second or more is no clock change
        ("PERSEUS_CLOCK_LATENCY_S", "fast"),
        ("PERSEUS_BASELINE_ITERATIONS", "-1"),
        ("PERSEUS_BASELINE_ITERATIONS", "ten"),
        ("PERSEUS_FAKE_CLOCK_DELAY_S", "-0.02"),
        ("PERSEUS_FAKE_CLOCK_DELAY_S", "nan"),
    ],
)
def test_a_bad_variable_is_named_with_its_value(variable: str, value: str) -> None:
    if not value.strip():  # blank is unset, not an error
        assert load_settings({variable: value}) == ClientSettings()
        return
    with pytest.raises(SettingsError, match=variable) as raised:
        load_settings({variable: value})
    message = str(raised.value)
    shown = {"1980,,1200": "got ''", "every:0": "got '0'"}.get(value, value)
    assert shown in message, message


def test_unknown_arguments_and_a_wrong_budget_are_refused() -> None:
    with pytest.raises(SettingsError, match="unknown client settings: colour"):
        load_settings({}, colour="blue")
    with pytest.raises(SettingsError, match="budget: expected a ProfileBudget"):
        load_settings({}, budget={"window_s": 1.0})
    with pytest.raises(SettingsError, match="rank: must be a whole number"):
        load_settings({}, rank=-1)


def test_every_gpu_mode_is_accepted() -> None:
    assert {load_settings({"PERSEUS_GPU": mode}).gpu for mode in GPU_MODES} == set(GPU_MODES)


@pytest.mark.parametrize(
    ("clocks", "expected"),
    [("all", (1980, 1500, 1005)), ("every:2", (1980, 1005)), ("1005,1980", (1980, 1005))],
)
def test_the_budget_selects_clocks_high_to_low(clocks: str, expected: tuple[int, ...]) -> None:
    assert ProfileBudget(clocks=clocks).select((1005, 1500, 1980, 1500)) == expected


def test_the_budget_names_its_setting_for_an_unsupported_clock() -> None:
    budget = ProfileBudget(clocks="1200", clocks_setting="--clocks")
    with pytest.raises(SettingsError, match=r"--clocks: 1200 MHz is not a supported clock"):
        budget.select((1980, 1005))
    with pytest.raises(SettingsError, match="--clocks"):
        ProfileBudget(clocks="every:x", clocks_setting="--clocks").check()


def test_the_position_is_filled_in_only_where_unknown() -> None:
    s = ClientSettings(stage=1)
    filled = s.with_position(stage=3, data_parallel_rank=2, tensor_parallel_rank=0)
    assert (filled.stage, filled.data_parallel_rank, filled.tensor_parallel_rank) == (1, 2, 0)
    assert filled.with_position(data_parallel_rank=5).data_parallel_rank == 2
