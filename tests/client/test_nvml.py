"""NvmlGpu, DryRunGpu, validate_clock_mhz and reset_clocks against a stand-in NVML module
(:class:`tests.client.fake_nvml.FakeNvml`): units, the clock list, the one error table, the
NVML session's lifecycle, and a dry run that never sets."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pynvml
import pytest

from perseus.client.gpu.nvml import DryRunGpu, NvmlGpu, reset_clocks, validate_clock_mhz
from perseus.core.errors import GpuControlError, NvmlNotSupported, NvmlPermissionError

from .fake_nvml import ERROR_CODES, H200_SM_MHZ, SETTERS, FakeNvml, FakeNvmlError

# Reading --------------------------------------------------------------------------------------


def test_reads_convert_units_once() -> None:
    nvml = FakeNvml()
    with NvmlGpu(0, nvml=nvml) as gpu:
        assert gpu.index == 0
        assert gpu.name == "NVIDIA H200"  # decoded from bytes
        assert gpu.energy_j() == pytest.approx(123_456.789)  # mJ -> J
        assert gpu.power_w() == pytest.approx(250.5)  # mW -> W
        assert gpu.current_clock_mhz() == 1755
        assert nvml.called("nvmlDeviceGetClockInfo") == [("handle0", nvml.NVML_CLOCK_SM)]
        assert gpu.can_set_clocks


def test_supported_clocks_at_the_top_memory_clock_descending_without_duplicates() -> None:
    nvml = FakeNvml()
    with NvmlGpu(1, nvml=nvml) as gpu:
        clocks = gpu.supported_clocks_mhz()
        assert clocks == tuple(H200_SM_MHZ)
        assert len(clocks) == 110
        assert gpu.default_clock_mhz() == 1980
        gpu.supported_clocks_mhz()
    assert nvml.called("nvmlDeviceGetSupportedGraphicsClocks") == [("handle1", 3201)]  # cached


def test_lock_and_reset_call_nvml() -> None:
    nvml = FakeNvml()
    with NvmlGpu(0, nvml=nvml) as gpu:
        gpu.lock_clock(1200)
        gpu.reset_clock()
    assert nvml.called("nvmlDeviceSetGpuLockedClocks") == [("handle0", 1200, 1200)]
    assert nvml.called("nvmlDeviceResetGpuLockedClocks") == [("handle0",)]


@pytest.mark.parametrize("bad", [1201, 2000, 300, 0, True, 1200.5])
def test_unsupported_clock_is_refused_before_nvml(bad: Any) -> None:
    nvml = FakeNvml()
    with NvmlGpu(0, nvml=nvml) as gpu, pytest.raises(GpuControlError) as info:
        gpu.lock_clock(bad)
    message = str(info.value)
    assert repr(bad) in message and "345-1980 MHz" in message and "GPU 0" in message
    assert not nvml.called("nvmlDeviceSetGpuLockedClocks")


def test_validate_clock_returns_int() -> None:
    assert validate_clock_mhz(1200, H200_SM_MHZ, index=0) == 1200
    with pytest.raises(GpuControlError, match="none"):
        validate_clock_mhz(1200, (), index=3)


# Errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("call", SETTERS)
def test_permission_error_on_setting_says_what_fixes_it(call: str) -> None:
    nvml = FakeNvml(fail={call: pynvml.NVML_ERROR_NO_PERMISSION})
    with NvmlGpu(1, nvml=nvml) as gpu:
        with pytest.raises(NvmlPermissionError) as info:
            if call == "nvmlDeviceSetGpuLockedClocks":
                gpu.lock_clock(1500)
            else:
                gpu.reset_clock()
        assert not gpu.can_set_clocks
    message = str(info.value)
    for needed in ("GPU 1", call, "root", "CAP_SYS_ADMIN", "PERSEUS_GPU=dry-run"):
        assert needed in message
    assert isinstance(info.value.__cause__, FakeNvmlError)


EXPECTED_CLASS = {
    "NVML_ERROR_NO_PERMISSION": NvmlPermissionError,
    "NVML_ERROR_NOT_SUPPORTED": NvmlNotSupported,
    "NVML_ERROR_FUNCTION_NOT_FOUND": NvmlNotSupported,
    "NVML_ERROR_DEPRECATED": NvmlNotSupported,
    "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": NvmlNotSupported,
    "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": NvmlNotSupported,
    "NVML_ERROR_UNINITIALIZED": GpuControlError,
    "NVML_ERROR_INVALID_ARGUMENT": GpuControlError,
    "NVML_ERROR_GPU_IS_LOST": GpuControlError,
    "NVML_ERROR_LIBRARY_NOT_FOUND": GpuControlError,
    "NVML_ERROR_DRIVER_NOT_LOADED": GpuControlError,
    "NVML_ERROR_TIMEOUT": GpuControlError,
    "NVML_ERROR_UNKNOWN": GpuControlError,
}


@pytest.mark.parametrize("name", sorted(ERROR_CODES))
def test_every_nvml_error_maps_to_the_tree(name: str) -> None:
    nvml = FakeNvml(fail={"nvmlDeviceGetPowerUsage": ERROR_CODES[name]})
    with NvmlGpu(0, nvml=nvml) as gpu, pytest.raises(GpuControlError) as info:
        gpu.power_w()
    expected = EXPECTED_CLASS.get(name, GpuControlError)
    assert type(info.value) is expected
    message = str(info.value)
    assert "GPU 0" in message and "nvmlDeviceGetPowerUsage" in message
    assert "NVML return code" not in message  # the table knows every code the library has
    assert "PERSEUS_GPU=dry-run" not in message  # the fix is for setters only
    assert isinstance(info.value.__cause__, FakeNvmlError)


def test_unknown_return_code_is_still_a_gpu_control_error() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceGetTotalEnergyConsumption": 12345})
    with NvmlGpu(0, nvml=nvml) as gpu, pytest.raises(GpuControlError, match="code 12345"):
        gpu.energy_j()


def test_library_not_found_on_init() -> None:
    nvml = FakeNvml(fail={"nvmlInit": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND})
    with pytest.raises(GpuControlError) as info:
        NvmlGpu(0, nvml=nvml)
    assert type(info.value) is GpuControlError
    assert "nvmlInit" in str(info.value) and "libnvidia-ml.so.1" in str(info.value)


def test_not_supported_clock_listing() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceGetSupportedMemoryClocks": pynvml.NVML_ERROR_NOT_SUPPORTED})
    with NvmlGpu(0, nvml=nvml) as gpu, pytest.raises(NvmlNotSupported):
        gpu.lock_clock(1200)


def test_missing_pynvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(GpuControlError, match="nvidia-ml-py"):
        NvmlGpu(0)


class OldNvml(FakeNvml):
    """An old binding: it lacks ``nvmlDeviceGetPowerUsage``."""

    nvmlDeviceGetPowerUsage = None  # type: ignore[assignment]


def test_missing_function_is_not_supported() -> None:
    with NvmlGpu(0, nvml=OldNvml()) as gpu:
        assert gpu.energy_j() == pytest.approx(123_456.789)
        with pytest.raises(NvmlNotSupported, match=r"nvmlDeviceGetPowerUsage.*nvidia-ml-py"):
            gpu.power_w()


def test_real_pynvml_without_a_driver_maps_to_gpu_control_error() -> None:
    try:
        gpu = NvmlGpu(0)
    except GpuControlError as err:
        assert "nvmlInit" in str(err) or "does not exist" in str(err)
        assert isinstance(err.__cause__, pynvml.NVMLError) or "does not exist" in str(err)
    else:
        gpu.close()
        pytest.skip("this machine has an NVIDIA driver")


# Lifecycle ------------------------------------------------------------------------------------


def test_init_and_shutdown_balance() -> None:
    nvml = FakeNvml()
    a, b = NvmlGpu(0, nvml=nvml), NvmlGpu(1, nvml=nvml)
    assert nvml.init_count == 2
    a.close()
    a.close()  # idempotent
    assert nvml.init_count == 1
    b.close()
    assert nvml.init_count == 0
    with pytest.raises(GpuControlError, match="after close"):
        a.energy_j()


def test_no_such_gpu_names_the_count_and_shuts_down() -> None:
    nvml = FakeNvml(devices=2)
    with pytest.raises(GpuControlError, match="NVML sees 2 GPU"):
        NvmlGpu(5, nvml=nvml)
    assert nvml.init_count == 0
    with pytest.raises(GpuControlError, match=">= 0"):
        NvmlGpu(-1, nvml=nvml)


def test_failed_handle_shuts_down() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST})
    with pytest.raises(GpuControlError, match="fell off the bus"):
        NvmlGpu(0, nvml=nvml)
    assert nvml.init_count == 0


# Dry run --------------------------------------------------------------------------------------


def test_dry_run_reads_but_never_sets(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml()
    with DryRunGpu(1, nvml=nvml) as gpu, caplog.at_level(logging.INFO, logger="perseus.client"):
        assert not gpu.can_set_clocks
        assert gpu.name == "NVIDIA H200" and gpu.index == 1
        assert gpu.energy_j() == pytest.approx(123_456.789)
        assert gpu.power_w() == pytest.approx(250.5)
        assert gpu.current_clock_mhz() == 1755
        assert gpu.supported_clocks_mhz()[0] == gpu.default_clock_mhz() == 1980
        assert gpu.requested_clock_mhz is None
        gpu.lock_clock(1410)
        assert gpu.requested_clock_mhz == 1410
        with pytest.raises(GpuControlError, match="1411"):
            gpu.lock_clock(1411)
        assert gpu.requested_clock_mhz == 1410
        gpu.reset_clock()
        assert gpu.requested_clock_mhz is None
    assert not any(name in SETTERS for name, _ in nvml.calls)
    messages = [r.getMessage() for r in caplog.records if r.name == "perseus.client"]
    assert any("would lock the SM clock to 1410 MHz" in m for m in messages)
    assert any("would remove the SM clock lock" in m for m in messages)
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "perseus.client")
    assert nvml.init_count == 0


# reset_clocks ---------------------------------------------------------------------------------


def test_reset_clocks_all_gpus() -> None:
    nvml = FakeNvml(devices=3)
    lines = reset_clocks(None, nvml=nvml)
    assert lines == [f"GPU {i} (NVIDIA H200): SM clock lock removed" for i in range(3)]
    assert nvml.called("nvmlDeviceResetGpuLockedClocks") == [(f"handle{i}",) for i in range(3)]
    assert nvml.init_count == 0


def test_reset_clocks_some_gpus() -> None:
    nvml = FakeNvml(devices=3)
    assert reset_clocks([2], nvml=nvml) == ["GPU 2 (NVIDIA H200): SM clock lock removed"]
    assert nvml.called("nvmlDeviceResetGpuLockedClocks") == [("handle2",)]


def test_reset_clocks_permission_error() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceResetGpuLockedClocks": pynvml.NVML_ERROR_NO_PERMISSION})
    with pytest.raises(NvmlPermissionError, match="CAP_SYS_ADMIN"):
        reset_clocks(None, nvml=nvml)
    assert nvml.init_count == 0


@pytest.mark.parametrize("code", ["NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIBRARY_NOT_FOUND"])
def test_reset_clocks_without_driver_does_not_suggest_the_fake_gpu(code: str) -> None:
    """Other commands suggest PERSEUS_GPU=fake where NVML cannot be used; reset-clocks always
    uses NVML, and a fake GPU has no clocks to reset."""
    nvml = FakeNvml(fail={"nvmlInit": getattr(pynvml, code)})
    with pytest.raises(GpuControlError) as caught:
        reset_clocks(None, nvml=nvml)
    assert "PERSEUS_GPU" not in str(caught.value)
    assert "without a GPU there are no clocks to reset" in str(caught.value)
    with pytest.raises(GpuControlError, match="without a GPU, use PERSEUS_GPU=fake"):
        NvmlGpu(0, nvml=FakeNvml(fail={"nvmlInit": getattr(pynvml, code)}))
