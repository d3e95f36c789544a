"""The rank against a hostile or broken world (issue 24): no NVML, a server that answers too
fast, plans that are too big or wrong. Training always goes on."""

from __future__ import annotations

import logging
import random
import threading

import pytest
from pydantic import ValidationError

import perseus.client
from perseus.client.fake import FakeGpu
from perseus.client.gpu import NvmlGpu
from perseus.client.retry import Backoff
from perseus.client.session import POLL_FLOOR_S, Outage, Session
from perseus.client.settings import ClientSettings
from perseus.client.state import RankState
from perseus.errors import GpuControlError
from perseus.server.settings import Settings

SERVER = {"server": "http://127.0.0.1:9", "job": "j", "token": "t"}


def _nvml_missing() -> bool:
    try:
        NvmlGpu(0).close()
    except GpuControlError:
        return True
    return False


needs_no_nvml = pytest.mark.skipif(not _nvml_missing(), reason="this machine has NVML")


@needs_no_nvml
def test_without_nvml_training_goes_on_with_one_error_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="perseus")
    ranks = [
        perseus.client.connect(gpu="nvml", rank=r, install_signal_handlers=False, **SERVER)
        for r in range(2)
    ]
    for rank in ranks:
        assert not rank.active
        assert rank.failure is not None and "NVML" in rank.failure
        with rank.iteration(), rank.instruction("forward", 0):
            pass
        rank.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2  # one line per rank
    assert all(r.exc_info is None for r in errors)  # no traceback
    assert "rank 0" in errors[0].getMessage() and "PERSEUS_STRICT" in errors[0].getMessage()


@needs_no_nvml
def test_strict_fails_fast_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERSEUS_STRICT", "1")
    with pytest.raises(GpuControlError, match="NVML"):
        perseus.client.connect(gpu="nvml", install_signal_handlers=False, **SERVER)


def test_the_strict_setting_is_a_flag() -> None:
    from perseus.client.settings import SettingsError, load_settings

    assert not load_settings({}).strict
    assert load_settings({"PERSEUS_STRICT": "1"}).strict
    assert load_settings({"PERSEUS_STRICT": "0"}, strict=True).strict
    with pytest.raises(SettingsError, match="PERSEUS_STRICT"):
        load_settings({"PERSEUS_STRICT": "maybe"})


class _RecordingStop(threading.Event):
    """A stop event that records how long the session waits, without waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


class _InstantNotModified:
    """A planner whose plan long poll answers 304 at once (a proxy cutting long polls)."""

    def __init__(self, stop: threading.Event, polls: int) -> None:
        self.stop = stop
        self.polls = polls
        self.calls = 0

    def plan(self, rank: int, *, version: int | None = None, wait_s: float = 0.0) -> None:
        self.calls += 1
        if self.calls >= self.polls:
            self.stop.set()


def test_a_304_that_comes_back_at_once_does_not_make_a_tight_loop() -> None:
    stop = _RecordingStop()
    planner = _InstantNotModified(stop, polls=20)
    state = RankState(ClientSettings(stage=0))
    session = Session(state, planner, FakeGpu(), None, stop, None)  # type: ignore[arg-type]
    session._poll_plans(random.Random(0), Backoff(), Outage())
    assert planner.calls == 20
    # every poll after the first waited out (nearly) the whole floor first
    assert len(stop.waits) >= 19
    assert sum(stop.waits) >= 19 * POLL_FLOOR_S * 0.9


def test_the_server_refuses_a_max_wait_of_zero() -> None:
    with pytest.raises(ValidationError, match="PERSEUS_MAX_WAIT_S must be more than 0"):
        Settings(max_wait_s=0)
    assert Settings(max_wait_s=0.2).max_wait_s == 0.2
