"""GPU control through NVML: :class:`NvmlGpu`, the dry run :class:`DryRunGpu` and
:func:`reset_clocks`, behind :class:`~perseus.client.gpu.control.GpuControl`.

Every NVML error is translated where it enters, through one table (``_NVML_ERRORS``) from NVML
return codes to :class:`~perseus.core.errors.GpuControlError` and its subclasses, raised ``from``
the original; messages name the GPU index and the NVML call. Units are converted here, once:
NVML hands out millijoules and milliwatts, this module returns joules and watts.

:mod:`perseus.client.gpu.control` re-exports these names;
:func:`perseus.client.gpu.control.open_gpu` picks
among them.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any

from perseus.core.errors import GpuControlError, NvmlNotSupported, NvmlPermissionError

__all__ = [
    "DryRunGpu",
    "NvmlGpu",
    "reset_clocks",
    "validate_clock_mhz",
]

log = logging.getLogger("perseus.client")


# NVML errors ----------------------------------------------------------------------------------

_PERMISSION_FIX = (
    "Changing SM clocks (nvmlDeviceSetGpuLockedClocks, the call behind `nvidia-smi -lgc`) "
    "needs root: run as root or with the CAP_SYS_ADMIN capability (in a container: "
    "`--cap-add SYS_ADMIN`). `nvidia-smi -acp UNRESTRICTED` does not help: it opens only "
    "application clocks (`-ac`) to other users, not locked clocks. To run without that right, "
    "set PERSEUS_GPU=dry-run: the GPU is read and the clocks perseus would set are logged, "
    "not applied."
)

# Where NVML cannot be used at all: what to do without a GPU (reset-clocks says otherwise).
_FAKE_HINT = "; without a GPU, use PERSEUS_GPU=fake"

# One table: NVML return code name -> (exception class, what it means for the user).
_NVML_ERRORS: dict[str, tuple[type[GpuControlError], str]] = {
    "NVML_ERROR_NO_PERMISSION": (NvmlPermissionError, "the process lacks the permission"),
    "NVML_ERROR_NOT_SUPPORTED": (NvmlNotSupported, "this GPU or driver does not support it"),
    "NVML_ERROR_FUNCTION_NOT_FOUND": (
        NvmlNotSupported,
        "the driver's NVML library lacks this function (driver older than nvidia-ml-py)",
    ),
    "NVML_ERROR_DEPRECATED": (NvmlNotSupported, "the call is deprecated by this driver"),
    "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": (NvmlNotSupported, "the reset type is not supported"),
    "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": (NvmlNotSupported, "ECC is not supported on this vGPU"),
    "NVML_ERROR_UNINITIALIZED": (GpuControlError, "NVML is not initialized (or was shut down)"),
    "NVML_ERROR_ALREADY_INITIALIZED": (GpuControlError, "NVML is already initialized"),
    "NVML_ERROR_INVALID_ARGUMENT": (GpuControlError, "NVML rejected an argument"),
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": (
        GpuControlError,
        "nvidia-ml-py and the driver disagree on a structure version",
    ),
    "NVML_ERROR_INSUFFICIENT_SIZE": (GpuControlError, "a buffer passed to NVML is too small"),
    "NVML_ERROR_INVALID_STATE": (GpuControlError, "the GPU is in a state that forbids the call"),
    "NVML_ERROR_FREQ_NOT_SUPPORTED": (GpuControlError, "the GPU does not support that clock"),
    "NVML_ERROR_NOT_FOUND": (GpuControlError, "NVML found no such object"),
    "NVML_ERROR_GPU_NOT_FOUND": (GpuControlError, "NVML found no such GPU"),
    "NVML_ERROR_GPU_IS_LOST": (
        GpuControlError,
        "the GPU fell off the bus or is otherwise inaccessible; check `nvidia-smi` and dmesg",
    ),
    "NVML_ERROR_RESET_REQUIRED": (GpuControlError, "the GPU needs a reset or a reboot"),
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        GpuControlError,
        "libnvidia-ml.so.1 was not found (is the NVIDIA driver installed and on the loader "
        "path?)" + _FAKE_HINT,
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        GpuControlError,
        "the NVIDIA driver is not loaded" + _FAKE_HINT,
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        GpuControlError,
        "the NVML library and the loaded kernel driver differ in version (driver updated "
        "without a reboot or module reload)",
    ),
    "NVML_ERROR_INSUFFICIENT_POWER": (GpuControlError, "a power cable is not properly attached"),
    "NVML_ERROR_IRQ_ISSUE": (GpuControlError, "the kernel detected an interrupt issue"),
    "NVML_ERROR_CORRUPTED_INFOROM": (GpuControlError, "the GPU's infoROM is corrupted"),
    "NVML_ERROR_OPERATING_SYSTEM": (GpuControlError, "the operating system blocked the call"),
    "NVML_ERROR_IN_USE": (GpuControlError, "the GPU is in use by another operation"),
    "NVML_ERROR_MEMORY": (GpuControlError, "NVML ran out of memory"),
    "NVML_ERROR_INSUFFICIENT_RESOURCES": (GpuControlError, "NVML ran out of resources"),
    "NVML_ERROR_NO_DATA": (GpuControlError, "no data is available yet"),
    "NVML_ERROR_NOT_READY": (GpuControlError, "the GPU is not ready; try again"),
    "NVML_ERROR_TIMEOUT": (GpuControlError, "the call timed out"),
    "NVML_ERROR_UNKNOWN": (GpuControlError, "an unknown internal NVML error"),
}

# NVML calls that change the GPU: a permission error on them says what fixes it.
_SETTERS = frozenset({"nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"})


def _translate(
    nvml: ModuleType, err: BaseException, call: str, index: int | None
) -> GpuControlError:
    """Map an ``NVMLError`` from ``call`` on GPU ``index`` to the project's exception."""
    code = getattr(err, "value", None)
    cls: type[GpuControlError] = GpuControlError
    meaning = f"NVML return code {code}"
    for const, (mapped, text) in _NVML_ERRORS.items():
        if code is not None and getattr(nvml, const, None) == code:
            cls, meaning = mapped, text
            break
    where = "NVML" if index is None else f"GPU {index}"
    message = f"{where}: {call} failed: {err} ({meaning})"
    if cls is NvmlPermissionError and call in _SETTERS:
        message = f"{message}. {_PERMISSION_FIX}"
    return cls(message)


def _invoke(nvml: ModuleType, call: str, *args: Any, index: int | None = None) -> Any:
    """Call ``nvml.<call>(*args)``, translating NVML errors; the one way this module calls NVML.

    Raises:
        NvmlNotSupported: ``nvml`` has no such function (an old nvidia-ml-py).
        GpuControlError: NVML failed; the subclass follows ``_NVML_ERRORS``.
    """
    function = getattr(nvml, call, None)
    if function is None:
        raise NvmlNotSupported(
            f"{'NVML' if index is None else f'GPU {index}'}: {call} is missing from "
            f"{getattr(nvml, '__name__', 'pynvml')}; upgrade nvidia-ml-py"
        )
    try:
        return function(*args)
    except nvml.NVMLError as err:
        raise _translate(nvml, err, call, index) from err


def _load_pynvml() -> ModuleType:
    """Import ``pynvml`` (the ``nvidia-ml-py`` package).

    Raises:
        GpuControlError: The module is not installed.
    """
    try:
        return importlib.import_module("pynvml")
    except ImportError as err:
        raise GpuControlError(
            "cannot import pynvml: install the nvidia-ml-py package (`pip install "
            "nvidia-ml-py`, not the unofficial `pynvml`)" + _FAKE_HINT
        ) from err


def _text(value: object) -> str:
    # Older nvidia-ml-py versions return bytes for strings.
    return value.decode() if isinstance(value, bytes) else str(value)


def validate_clock_mhz(frequency_mhz: int, supported_mhz: Sequence[int], *, index: int) -> int:
    """Check that ``frequency_mhz`` is one of ``supported_mhz``.

    Args:
        frequency_mhz: The requested SM clock.
        supported_mhz: The GPU's supported SM clocks, descending.
        index: The GPU's index, for the message.

    Returns:
        The clock as an ``int``.

    Raises:
        GpuControlError: The clock is not supported; the message names it and the range.
    """
    if isinstance(frequency_mhz, bool) or frequency_mhz not in supported_mhz:
        span = f"{min(supported_mhz)}-{max(supported_mhz)} MHz" if supported_mhz else "none"
        raise GpuControlError(
            f"GPU {index}: {frequency_mhz!r} MHz is not a supported SM clock "
            f"(supported: {span}, {len(supported_mhz)} clocks)"
        )
    return int(frequency_mhz)


# NVML ------------------------------------------------------------------------------------------


class NvmlGpu:
    """One GPU through NVML.

    Each instance initializes NVML and :meth:`close` shuts it down; NVML counts these, so
    several instances (and other NVML users in the process) coexist. Usable as a context
    manager. NVML calls are thread-safe, so energy may be read off the training thread.

    Args:
        index: NVML index of the GPU (``nvidia-smi`` order).
        nvml: The ``pynvml`` module, or a stand-in with the same functions (tests).

    Raises:
        GpuControlError: NVML cannot be loaded or initialized, or there is no such GPU.
    """

    def __init__(self, index: int, *, nvml: ModuleType | None = None) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise GpuControlError(f"GPU index must be an integer >= 0, got {index!r}")
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self._index = index
        self._can_set = True
        self._clocks_mhz: tuple[int, ...] | None = None
        _invoke(self._nvml, "nvmlInit", index=index)
        self._open = True
        try:
            count = int(_invoke(self._nvml, "nvmlDeviceGetCount", index=index))
            if index >= count:
                raise GpuControlError(
                    f"GPU {index} does not exist: NVML sees {count} GPU(s)"
                    + (f", indices 0-{count - 1}" if count else "")
                )
            self._handle = _invoke(self._nvml, "nvmlDeviceGetHandleByIndex", index, index=index)
            self._name = _text(_invoke(self._nvml, "nvmlDeviceGetName", self._handle, index=index))
        except BaseException:
            with contextlib.suppress(GpuControlError):  # keep the error that matters
                self.close()
            raise

    def __enter__(self) -> NvmlGpu:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:
            with contextlib.suppress(GpuControlError):  # keep the error that matters
                self.close()

    def close(self) -> None:
        """Shut down this instance's NVML session; later calls do nothing.

        Raises:
            GpuControlError: NVML failed to shut down.
        """
        if self._open:
            self._open = False
            _invoke(self._nvml, "nvmlShutdown", index=self._index)

    def _call(self, call: str, *args: Any) -> Any:
        if not self._open:
            raise GpuControlError(f"GPU {self._index}: {call} called after close()")
        return _invoke(self._nvml, call, *args, index=self._index)

    @property
    def index(self) -> int:
        """The GPU's NVML index."""
        return self._index

    @property
    def name(self) -> str:
        """The GPU's product name, e.g. ``NVIDIA H200``."""
        return self._name

    @property
    def can_set_clocks(self) -> bool:
        """True until a lock or reset failed with a permission error."""
        return self._can_set

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """SM clocks supported at the highest memory clock, descending, no duplicates.

        Read once, then cached.

        Raises:
            GpuControlError: NVML failed or reported no clocks.
        """
        if self._clocks_mhz is None:
            memory_mhz = self._clock_list("nvmlDeviceGetSupportedMemoryClocks")
            sm_mhz = self._clock_list("nvmlDeviceGetSupportedGraphicsClocks", max(memory_mhz))
            self._clocks_mhz = tuple(sorted(set(sm_mhz), reverse=True))
        return self._clocks_mhz

    def supported_memory_clocks_mhz(self) -> tuple[int, ...]:
        """Memory clocks the GPU supports, descending (for ``perseus profile``'s listing).

        Raises:
            GpuControlError: NVML failed or reported no clocks.
        """
        memory_mhz = self._clock_list("nvmlDeviceGetSupportedMemoryClocks")
        return tuple(sorted(set(memory_mhz), reverse=True))

    def default_clock_mhz(self) -> int:
        """The highest supported SM clock, which the GPU runs when unlocked and not throttled."""
        return self.supported_clocks_mhz()[0]

    def current_clock_mhz(self) -> int:
        """The SM clock now (``nvmlDeviceGetClockInfo``, ``NVML_CLOCK_SM``)."""
        return int(self._call("nvmlDeviceGetClockInfo", self._handle, self._nvml.NVML_CLOCK_SM))

    def applied_clock_mhz(self) -> int:
        """The SM clock in effect: the same reading as :meth:`current_clock_mhz` (~1 us)."""
        return self.current_clock_mhz()

    def lock_clock(self, frequency_mhz: int) -> None:
        """Lock the SM clock to ``frequency_mhz`` (``nvmlDeviceSetGpuLockedClocks(f, f)``).

        Raises:
            GpuControlError: The clock is not supported, or NVML failed.
            NvmlPermissionError: The process may not change clocks; :attr:`can_set_clocks`
                becomes False and the message says what fixes it.
        """
        f = validate_clock_mhz(frequency_mhz, self.supported_clocks_mhz(), index=self._index)
        self._set("nvmlDeviceSetGpuLockedClocks", self._handle, f, f)

    def reset_clock(self) -> None:
        """Remove the SM clock lock (``nvmlDeviceResetGpuLockedClocks``).

        Raises:
            GpuControlError: NVML failed.
            NvmlPermissionError: The process may not change clocks (see :meth:`lock_clock`).
        """
        self._set("nvmlDeviceResetGpuLockedClocks", self._handle)

    def _clock_list(self, call: str, *args: Any) -> list[int]:
        """Call an NVML function that returns a list of clocks; an empty list is an error."""
        values = [int(v) for v in self._call(call, self._handle, *args)]
        if not values:
            raise NvmlNotSupported(f"GPU {self._index}: {call} returned no clocks")
        return values

    def _set(self, call: str, *args: Any) -> None:
        try:
            self._call(call, *args)
        except NvmlPermissionError:
            self._can_set = False
            raise

    def energy_j(self) -> float:
        """Energy since the driver loaded, in joules (NVML counts millijoules).

        The counter moves about every 100 ms and one read takes a few milliseconds: read it
        off the training thread.
        """
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", self._handle)) / 1000.0

    def power_w(self) -> float:
        """The power reading, in watts (NVML reports milliwatts)."""
        return int(self._call("nvmlDeviceGetPowerUsage", self._handle)) / 1000.0


# Dry run --------------------------------------------------------------------------------------


class DryRunGpu:
    """Reads the real GPU through NVML; validates and logs clock changes but applies none.

    Args:
        index: NVML index of the GPU.
        nvml: The ``pynvml`` module, or a stand-in (tests).

    Raises:
        GpuControlError: NVML cannot be loaded or initialized, or there is no such GPU.
    """

    def __init__(self, index: int, *, nvml: ModuleType | None = None) -> None:
        self._gpu = NvmlGpu(index, nvml=nvml)
        self.requested_clock_mhz: int | None = None
        """The clock the last :meth:`lock_clock` asked for; None when unlocked."""

    def __enter__(self) -> DryRunGpu:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Shut down the NVML session (see :meth:`NvmlGpu.close`)."""
        self._gpu.close()

    @property
    def index(self) -> int:
        """The GPU's NVML index."""
        return self._gpu.index

    @property
    def name(self) -> str:
        """The GPU's product name."""
        return self._gpu.name

    @property
    def can_set_clocks(self) -> bool:
        """Always False: a dry run changes nothing."""
        return False

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """The real GPU's supported SM clocks, descending."""
        return self._gpu.supported_clocks_mhz()

    def default_clock_mhz(self) -> int:
        """The real GPU's highest supported SM clock."""
        return self._gpu.default_clock_mhz()

    def supported_memory_clocks_mhz(self) -> tuple[int, ...]:
        """Memory clocks the GPU supports, descending."""
        return self._gpu.supported_memory_clocks_mhz()

    def current_clock_mhz(self) -> int:
        """The real GPU's SM clock now (not the requested one)."""
        return self._gpu.current_clock_mhz()

    def applied_clock_mhz(self) -> int:
        """The real GPU's SM clock now: a dry run changes nothing, so no change ever shows."""
        return self._gpu.current_clock_mhz()

    def lock_clock(self, frequency_mhz: int) -> None:
        """Validate ``frequency_mhz``, remember it and log the lock it would set.

        Raises:
            GpuControlError: The clock is not supported.
        """
        f = validate_clock_mhz(frequency_mhz, self.supported_clocks_mhz(), index=self.index)
        self.requested_clock_mhz = f
        log.info(
            "GPU %d (%s): dry run, would lock the SM clock to %d MHz", self.index, self.name, f
        )

    def reset_clock(self) -> None:
        """Forget the requested clock and log the reset it would do."""
        self.requested_clock_mhz = None
        log.info("GPU %d (%s): dry run, would remove the SM clock lock", self.index, self.name)

    def energy_j(self) -> float:
        """The real GPU's energy counter, in joules."""
        return self._gpu.energy_j()

    def power_w(self) -> float:
        """The real GPU's power reading, in watts."""
        return self._gpu.power_w()


def reset_clocks(indices: Sequence[int] | None, *, nvml: ModuleType | None = None) -> list[str]:
    """Remove the SM clock lock of each GPU (``perseus reset-clocks``).

    Args:
        indices: NVML indices of the GPUs; None for every GPU NVML sees.
        nvml: The ``pynvml`` module, or a stand-in (tests).

    Returns:
        One line per GPU, e.g. ``"GPU 0 (NVIDIA H200): SM clock lock removed"``.

    Raises:
        GpuControlError: NVML failed (stops at the first GPU that fails; the message names it).
        NvmlPermissionError: The process may not change clocks; the message says what fixes it.
    """
    try:
        module = nvml if nvml is not None else _load_pynvml()
        _invoke(module, "nvmlInit")
    except GpuControlError as err:
        if _FAKE_HINT not in str(err):
            raise
        # a fake GPU has no clocks to reset: the hint the other commands give does not apply
        raise type(err)(
            str(err).replace(_FAKE_HINT, "; without a GPU there are no clocks to reset")
        ) from err
    lines = []
    try:
        if indices is None:
            indices = range(int(_invoke(module, "nvmlDeviceGetCount")))
        for index in indices:
            with NvmlGpu(index, nvml=module) as gpu:
                gpu.reset_clock()
                lines.append(f"GPU {index} ({gpu.name}): SM clock lock removed")
    except BaseException:
        with contextlib.suppress(GpuControlError):  # keep the error that matters
            _invoke(module, "nvmlShutdown")
        raise
    _invoke(module, "nvmlShutdown")
    return lines
