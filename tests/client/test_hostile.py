"""The rank against a hostile or broken world (issue 24): no NVML, a server that answers too
fast, plans that are too big or wrong. Training always goes on."""

from __future__ import annotations

import logging

import pytest

import perseus.client
from perseus.client.gpu import NvmlGpu
from perseus.errors import GpuControlError

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
