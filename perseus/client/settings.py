"""Settings of one training rank: arguments first, then ``PERSEUS_*`` variables.

Only what a rank cannot learn elsewhere is a setting. Its position in the job (rank,
pipeline stage, data- and tensor-parallel rank) defaults from the launcher's variables
(``RANK``, ``LOCAL_RANK``) and, where the job's sizes are known, from the usual Megatron
layout (tensor parallel fastest, then data parallel, then pipeline stages).

============================  ==================================  ====================
variable                      meaning                             default
============================  ==================================  ====================
``PERSEUS_SERVER``            planner URL; unset: perseus is off   unset
``PERSEUS_JOB``               job id from ``perseus job create``   required with a server
``PERSEUS_TOKEN``             the job's token                      required with a server
``PERSEUS_RANK``              this rank                            ``RANK``, else 0
``PERSEUS_STAGE``             pipeline stage of this rank          from the framework
``PERSEUS_DATA_PARALLEL_RANK``   data-parallel replica             from the layout
``PERSEUS_TENSOR_PARALLEL_RANK`` rank within the tensor group      from the layout
``PERSEUS_GPU_INDEX``         NVML index of this rank's GPU        ``LOCAL_RANK``, else 0
``PERSEUS_GPU``               ``nvml``, ``dry-run`` or ``fake``    ``nvml``
``PERSEUS_STRICT``            ``1``: a GPU that cannot be opened   ``0`` (go on at
                              fails ``connect()``                  default clocks)
``PERSEUS_PROFILE``           a saved profile to upload instead    unset (profile online)
``PERSEUS_PROFILE_WINDOW_S``  seconds measured per loop and clock  0.6
``PERSEUS_PROFILE_SETTLE_S``  seconds after a clock change         0.2
``PERSEUS_PROFILE_CLOCKS``    ``auto``, ``all``, ``every:N`` or    ``auto``
                              ``1980,1900``
``PERSEUS_PROFILE_MAX_S``     stop the sweep after this long       600
``PERSEUS_CLOCK_LOG``         directory for ``rank{R}.jsonl``      unset
``PERSEUS_CLOCK_LATENCY_S``   clock-change latency assumed until   0.03
                              measured (seconds, 0-1)
``PERSEUS_BASELINE_ITERATIONS``  iterations at default clocks      10
                              before the first plan (>= 0)
``PERSEUS_FAKE_CLOCK_DELAY_S``  the fake GPU's clock-change        0.02
                              delay (seconds, >= 0)
============================  ==================================  ====================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import get_args
from urllib.parse import urlsplit

from perseus.client.gpu.control import GpuMode
from perseus.core.defaults import BASELINE_ITERATIONS
from perseus.core.errors import PerseusError

__all__ = ["GPU_MODES", "ClientSettings", "ProfileBudget", "SettingsError", "load_settings"]

GPU_MODES: tuple[GpuMode, ...] = get_args(GpuMode)


class SettingsError(PerseusError):
    """A client setting is missing or malformed (the message names the variable)."""


@dataclass(frozen=True, slots=True)
class ProfileBudget:
    """How much online profiling may cost, printed once when it starts.

    Attributes:
        window_s: Seconds of measurement per loop (forward, forward+backward) and clock,
            after ``settle_s``; the energy counter moves every ~0.1 s, so a window holds
            several updates.
        settle_s: Seconds a loop runs after a clock change before it is measured.
        clocks: ``"auto"`` (coarse then fine where plans go: see
            :mod:`perseus.client.profiling.sweep_order`), ``"all"``, ``"every:N"`` (every N-th
            supported clock from the top), or an explicit comma-separated list of MHz.
        max_s: The sweep stops (keeping what it has) after this many seconds.
        rising_stop: Stop after energy per instruction rose at this many clocks in a row.
        blocking_s: Seconds the blocking power is measured while the rank waits on peers.
        clocks_setting: What errors about ``clocks`` call it (the variable, or a flag).
    """

    window_s: float = 0.6
    settle_s: float = 0.2
    clocks: str = "auto"
    max_s: float = 600.0
    rising_stop: int = 5
    blocking_s: float = 1.2
    clocks_setting: str = "PERSEUS_PROFILE_CLOCKS"

    def check(self) -> None:
        """Check what can be checked before the GPU is open: the syntax of ``clocks``.

        Raises:
            SettingsError: ``clocks`` is malformed.
        """
        _check_clocks_syntax(self.clocks, self.clocks_setting)

    def select(self, supported_mhz: tuple[int, ...]) -> tuple[int, ...]:
        """The clocks to sweep, high to low, among ``supported_mhz``.

        Raises:
            SettingsError: ``clocks`` is malformed or names an unsupported clock.
        """
        ordered = tuple(sorted(set(supported_mhz), reverse=True))
        text = self.clocks.strip()
        if text in ("all", "auto"):  # auto: the sweep picks among them as it goes
            return ordered
        if text.startswith("every:"):
            step = _int(text.removeprefix("every:"), self.clocks_setting, minimum=1)
            return ordered[::step]
        chosen: set[int] = set()
        for part in text.split(","):
            mhz = _int(part, self.clocks_setting, minimum=1)
            if mhz not in ordered:
                raise SettingsError(
                    f"{self.clocks_setting}: {mhz} MHz is not a supported clock "
                    f"({ordered[-1]}-{ordered[0]} MHz)"
                )
            chosen.add(mhz)
        return tuple(sorted(chosen, reverse=True))

    def describe(self) -> str:
        """One line for the log."""
        return (
            f"clocks {self.clocks}, {self.settle_s:g} s settle + {self.window_s:g} s per loop "
            f"and clock, stop after {self.rising_stop} rising clocks or {self.max_s:g} s"
        )


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Everything one rank needs to talk to the planner and drive its GPU.

    ``server`` None means perseus is off for this process.
    """

    server: str | None = None
    job: str | None = None
    token: str | None = None
    rank: int = 0
    stage: int | None = None
    data_parallel_rank: int | None = None
    tensor_parallel_rank: int | None = None
    gpu_index: int = 0
    gpu: GpuMode = "nvml"
    profile_path: str | None = None
    budget: ProfileBudget = field(default_factory=ProfileBudget)
    clock_log_dir: str | None = None
    poll_wait_s: float = 30.0
    telemetry_queue: int = 1024
    clock_latency_s: float = 0.03
    """The clock-change latency assumed until the controller has measured it."""
    baseline_iterations: int = BASELINE_ITERATIONS
    """Iterations at default clocks, reported as the baseline, before the first plan."""
    fake_clock_delay_s: float | None = None
    """The fake GPU's clock-change delay (None: the model's 20 ms)."""
    strict: bool = False
    """Fail ``connect()`` when the GPU cannot be opened (NVML missing, bad index) instead of
    training on at default clocks."""

    def with_position(
        self,
        *,
        stage: int | None = None,
        data_parallel_rank: int | None = None,
        tensor_parallel_rank: int | None = None,
    ) -> ClientSettings:
        """A copy with the given coordinates filled in where still unknown."""
        return replace(
            self,
            stage=self.stage if self.stage is not None else stage,
            data_parallel_rank=(
                self.data_parallel_rank
                if self.data_parallel_rank is not None
                else data_parallel_rank
            ),
            tensor_parallel_rank=(
                self.tensor_parallel_rank
                if self.tensor_parallel_rank is not None
                else tensor_parallel_rank
            ),
        )


def load_settings(environ: Mapping[str, str] | None = None, **arguments: object) -> ClientSettings:
    """Settings from keyword arguments, then ``PERSEUS_*`` variables, then defaults.

    Args:
        environ: The variables to read (``os.environ`` when None).
        **arguments: Any field of :class:`ClientSettings`; None means "not given".

    Returns:
        The settings; ``server`` is None when perseus is off.

    Raises:
        SettingsError: A value is malformed, or a server is given without job and token.
    """
    env = os.environ if environ is None else environ
    unknown = set(arguments) - set(ClientSettings.__dataclass_fields__)
    if unknown:
        raise SettingsError(f"unknown client settings: {', '.join(sorted(unknown))}")

    def pick(name: str, variable: str) -> str | None:
        given = arguments.get(name)
        if given is not None:
            return str(given)
        value = env.get(variable, "").strip()
        return value or None

    def integer(name: str, variable: str, *fallbacks: str) -> int | None:
        given = arguments.get(name)
        if given is not None:
            if not isinstance(given, int) or isinstance(given, bool) or given < 0:
                raise SettingsError(f"{name}: must be a whole number >= 0, got {given!r}")
            return given
        for var in (variable, *fallbacks):
            text = env.get(var, "").strip()
            if text:
                return _int(text, var, minimum=0)
        return None

    def number(
        variable: str,
        default: float,
        *,
        minimum: float,
        maximum: float = float("inf"),
        name: str = "",
    ) -> float:
        top = "" if maximum == float("inf") else f" and <= {maximum:g}"
        given = arguments.get(name) if name else None
        if given is not None:
            if isinstance(given, bool) or not isinstance(given, int | float):
                raise SettingsError(f"{name}: must be a number, got {given!r}")
            if not (given >= minimum and given < float("inf") and given <= maximum):
                raise SettingsError(
                    f"{name}: must be a finite number >= {minimum:g}{top}, got {given}"
                )
            return float(given)
        text = env.get(variable, "").strip()
        if not text:
            return default
        try:
            value = float(text)
        except ValueError:
            raise SettingsError(f"{variable}: not a number: {text!r}") from None
        if not (value >= minimum and value < float("inf") and value <= maximum):
            raise SettingsError(
                f"{variable}: must be a finite number >= {minimum:g}{top}, got {text}"
            )
        return value

    server = pick("server", "PERSEUS_SERVER")
    job = pick("job", "PERSEUS_JOB")
    token = pick("token", "PERSEUS_TOKEN")
    if server is not None:
        if not server.startswith(("http://", "https://")) or not _has_host(server):
            raise SettingsError(f"PERSEUS_SERVER: expected http://host:port, got {server!r}")
        missing = [
            var for var, value in (("PERSEUS_JOB", job), ("PERSEUS_TOKEN", token)) if not value
        ]
        if missing:
            raise SettingsError(
                f"{' and '.join(missing)} not set: create the job with `perseus job create` "
                "and export the lines it prints"
            )
    gpu = pick("gpu", "PERSEUS_GPU") or "nvml"
    if gpu not in GPU_MODES:
        raise SettingsError(f"PERSEUS_GPU: expected one of {', '.join(GPU_MODES)}, got {gpu!r}")
    given_budget = arguments.get("budget")
    if given_budget is not None and not isinstance(given_budget, ProfileBudget):
        raise SettingsError("budget: expected a ProfileBudget")
    budget = given_budget or ProfileBudget(
        window_s=number("PERSEUS_PROFILE_WINDOW_S", 0.6, minimum=0.05),
        settle_s=number("PERSEUS_PROFILE_SETTLE_S", 0.2, minimum=0.0),
        clocks=env.get("PERSEUS_PROFILE_CLOCKS", "").strip() or "auto",
        max_s=number("PERSEUS_PROFILE_MAX_S", 600.0, minimum=1.0),
        blocking_s=number("PERSEUS_PROFILE_BLOCKING_S", 1.2, minimum=0.1),
    )
    budget.check()
    rank = integer("rank", "PERSEUS_RANK", "RANK") or 0
    return ClientSettings(
        server=server.rstrip("/") if server else None,
        job=job,
        token=token,
        rank=rank,
        stage=integer("stage", "PERSEUS_STAGE"),
        data_parallel_rank=integer("data_parallel_rank", "PERSEUS_DATA_PARALLEL_RANK"),
        tensor_parallel_rank=integer("tensor_parallel_rank", "PERSEUS_TENSOR_PARALLEL_RANK"),
        gpu_index=integer("gpu_index", "PERSEUS_GPU_INDEX", "LOCAL_RANK") or 0,
        gpu=gpu,
        profile_path=pick("profile_path", "PERSEUS_PROFILE"),
        budget=budget,
        clock_log_dir=pick("clock_log_dir", "PERSEUS_CLOCK_LOG"),
        poll_wait_s=number("PERSEUS_POLL_WAIT_S", 30.0, minimum=0.1, name="poll_wait_s"),
        telemetry_queue=_whole(arguments.get("telemetry_queue"), "telemetry_queue", 1024),
        clock_latency_s=number(
            "PERSEUS_CLOCK_LATENCY_S", 0.03, minimum=0.0, maximum=1.0, name="clock_latency_s"
        ),
        baseline_iterations=_baseline(
            integer("baseline_iterations", "PERSEUS_BASELINE_ITERATIONS")
        ),
        fake_clock_delay_s=(
            number("PERSEUS_FAKE_CLOCK_DELAY_S", -1.0, minimum=0.0, name="fake_clock_delay_s")
            if arguments.get("fake_clock_delay_s") is not None
            or env.get("PERSEUS_FAKE_CLOCK_DELAY_S", "").strip()
            else None
        ),
        strict=_flag(arguments.get("strict"), env.get("PERSEUS_STRICT", ""), "PERSEUS_STRICT"),
    )


def _flag(given: object, text: str, variable: str) -> bool:
    if given is not None:
        if not isinstance(given, bool):
            raise SettingsError(f"strict: must be True or False, got {given!r}")
        return given
    text = text.strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise SettingsError(f"{variable}: expected 1 or 0, got {text!r}")


def _baseline(given: int | None) -> int:
    return BASELINE_ITERATIONS if given is None else given


def _whole(given: object, name: str, default: int) -> int:
    if given is None:
        return default
    if not isinstance(given, int) or isinstance(given, bool) or given < 1:
        raise SettingsError(f"{name}: must be a whole number >= 1, got {given!r}")
    return given


def _has_host(url: str) -> bool:
    # Checked here, not at the first request: a URL httpx cannot use would otherwise fail at
    # connect() with httpx's words, or pass as an endless outage of a host named "". The port
    # may be left out (80 or 443).
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a malformed or out-of-range port
    except ValueError:
        return False
    return bool(parts.hostname) and port != 0 and not any(c.isspace() for c in url)


def _int(text: str, variable: str, *, minimum: int) -> int:
    text = text.strip()
    # isdigit() alone admits digits int() refuses ("²")
    if not (text.isascii() and text.isdigit()) or int(text) < minimum:
        raise SettingsError(f"{variable}: expected a whole number >= {minimum}, got {text!r}")
    return int(text)


def _check_clocks_syntax(text: str, setting: str = "PERSEUS_PROFILE_CLOCKS") -> None:
    # Whether the clocks exist is known only once the GPU is open; the syntax is known now.
    text = text.strip()
    if text in ("all", "auto"):
        return
    if text.startswith("every:"):
        _int(text.removeprefix("every:"), setting, minimum=1)
        return
    for part in text.split(","):
        _int(part, setting, minimum=1)
