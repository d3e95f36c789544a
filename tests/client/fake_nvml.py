"""A stand-in for the ``pynvml`` module, for the tests of the NVML GPU and of ``open_gpu``.

:class:`FakeNvml` is a module object with the functions perseus calls, an ``NVMLError``
carrying ``.value`` and the ``NVML_ERROR_*`` constants; it records every call and fails the
calls it is told to. No pynvml internals are patched.
"""

from __future__ import annotations

import types
from typing import Any

import pynvml

H200_SM_MHZ = list(range(1980, 344, -15))

# The return codes perseus maps, with the values of the real library.
ERROR_CODES = {
    name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith("NVML_ERROR_")
}


class FakeNvmlError(Exception):
    """Like ``pynvml.NVMLError``: carries the return code in ``.value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"fake NVML error {self.value}"


class FakeNvml(types.ModuleType):
    """A pynvml-like module over a list of devices; records calls, fails on request."""

    NVMLError = FakeNvmlError
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(self, devices: int = 2, fail: dict[str, int] | None = None) -> None:
        super().__init__("fake_pynvml")
        for name, value in ERROR_CODES.items():
            setattr(self, name, value)
        self.names = [b"NVIDIA H200"] + ["NVIDIA H200"] * (devices - 1)  # old versions: bytes
        self.fail = dict(fail or {})
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.init_count = 0

    def _enter(self, call: str, *args: Any) -> None:
        self.calls.append((call, args))
        if call in self.fail:
            raise FakeNvmlError(self.fail[call])

    def called(self, call: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == call]

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        if self.init_count == 0:
            raise FakeNvmlError(self.NVML_ERROR_UNINITIALIZED)
        self.init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        return f"handle{index}"

    def nvmlDeviceGetName(self, handle: str) -> bytes | str:
        self._enter("nvmlDeviceGetName", handle)
        return self.names[int(handle.removeprefix("handle"))]

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: str) -> list[int]:
        self._enter("nvmlDeviceGetSupportedMemoryClocks", handle)
        return [2201, 3201]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: str, memory_mhz: int) -> list[int]:
        self._enter("nvmlDeviceGetSupportedGraphicsClocks", handle, memory_mhz)
        if memory_mhz == 3201:  # unordered, with duplicates, as drivers may list them
            return [345, *H200_SM_MHZ[::-1], 1980, 1200]
        return [1005, 990]

    def nvmlDeviceGetClockInfo(self, handle: str, clock_type: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", handle, clock_type)
        return 1755 if clock_type == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        return 123_456_789

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return 250_500

    def nvmlDeviceSetGpuLockedClocks(self, handle: str, min_mhz: int, max_mhz: int) -> None:
        self._enter("nvmlDeviceSetGpuLockedClocks", handle, min_mhz, max_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: str) -> None:
        self._enter("nvmlDeviceResetGpuLockedClocks", handle)


SETTERS = ("nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks")
