"""A rank's start and end in this process: ``connect`` resolves the settings and keeps every
active rank for the exit hooks, ``close_all`` closes them (resetting their GPUs) and forgets
them. Exit hooks in a process that ends, forks or takes a signal are run in subprocesses by
test_rank.py."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from perseus.client.api.client import PlannerClient
from perseus.client.gpu.fake import FakeGpu
from perseus.client.lifecycle import close_all, connect

from .scripted import EXAMPLE_PROFILE

DOWN = {"server": "http://planner.test", "job": "j", "token": "t", "stage": 0}


class ResetCounting(FakeGpu):
    resets = 0

    def reset_clock(self) -> None:
        self.resets += 1
        super().reset_clock()


def unavailable_planner() -> PlannerClient:
    http = httpx.Client(
        base_url=DOWN["server"], transport=httpx.MockTransport(lambda r: httpx.Response(503))
    )
    return PlannerClient(http, "j", "t")


@pytest.fixture(autouse=True)
def nothing_left_open() -> Iterator[None]:
    yield
    close_all("test teardown")


def test_close_all_closes_every_connected_rank_once() -> None:
    gpus = [ResetCounting(), ResetCounting()]
    ranks = [
        connect(
            gpu=gpu,
            planner=unavailable_planner(),
            install_signal_handlers=False,
            profile_path=str(EXAMPLE_PROFILE),
            **DOWN,
        )
        for gpu in gpus
    ]
    assert all(rank.active for rank in ranks)
    assert all(t.is_alive() for rank in ranks for t in rank.threads)
    close_all("done")
    assert all(gpu.resets >= 1 for gpu in gpus)
    assert not any(t.is_alive() for rank in ranks for t in rank.threads)
    before = [gpu.resets for gpu in gpus]
    close_all("again")  # forgotten: nothing to close twice
    assert [gpu.resets for gpu in gpus] == before


def test_a_gpu_mode_given_as_text_is_the_setting(caplog: pytest.LogCaptureFixture) -> None:
    # No GPU 999 anywhere (and no driver here): the rank is off, with one error line and why.
    with caplog.at_level(logging.ERROR, logger="perseus.client"):
        rank = connect(
            gpu="dry-run",
            gpu_index=999,
            planner=unavailable_planner(),
            install_signal_handlers=False,
            **DOWN,
        )
    assert rank.settings.gpu == "dry-run" and rank.settings.gpu_index == 999
    assert not rank.active and rank.failure is not None
    assert [r.levelno for r in caplog.records if r.name == "perseus.client"] == [logging.ERROR]
    close_all("nothing to close")


def test_without_a_server_the_rank_is_off_and_says_so_at_most_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="perseus.client"):
        first = connect(server=None, install_signal_handlers=False)
        second = connect(server=None, gpu="fake", install_signal_handlers=False)
    assert not first.active and not second.active
    said = [r for r in caplog.records if "PERSEUS_SERVER is not set" in r.getMessage()]
    assert len(said) <= 1  # once per process: an earlier test may have had it said


def test_no_signal_handlers_unless_asked() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    connect(
        gpu=ResetCounting(),
        planner=unavailable_planner(),
        install_signal_handlers=False,
        profile_path=str(EXAMPLE_PROFILE),
        **DOWN,
    )
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("999999999999,forward,1410,0.05,24", "stage: must be in 0..1023"),
        ("0,forward,1410,1e308,24", "time: must be at most 1e+07"),
    ],
)
def test_a_malformed_saved_profile_is_a_settings_error_at_connect(
    tmp_path: Path, row: str, message: str
) -> None:
    import tracemalloc

    from perseus.client.settings import SettingsError

    path = tmp_path / "typo.csv"
    path.write_text(EXAMPLE_PROFILE.read_text() + row + "\n")

    def refused() -> SettingsError:
        with pytest.raises(SettingsError) as raised:
            connect(
                gpu=FakeGpu(),
                planner=unavailable_planner(),
                install_signal_handlers=False,
                profile_path=str(path),
                **DOWN,
            )
        return raised.value

    refused()  # the first call imports what connect() needs: not measured
    tracemalloc.start()
    try:
        error = refused()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    text = str(error)
    assert text.startswith(f"PERSEUS_PROFILE: {path}: row 1058: ") and message in text
    assert "\n" not in text and len(text) < 300
    assert peak < 40 * path.stat().st_size + 2**20
