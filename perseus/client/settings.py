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
``PERSEUS_GPU``               ``nvml``, ``dry-run``, ``fake`` or   ``zeusd`` where
                              ``zeusd`` (clocks through zeusd)     ``ZEUSD_*`` is set,
                                                                   else ``nvml``
``ZEUSD_SOCK_PATH``           zeusd's Unix socket (Zeus's own)     ``/run/zeusd/zeusd.sock``
``ZEUSD_HOST_PORT``           zeusd's ``host:port`` in TCP mode    unset
``ZEUSD_TOKEN``               token from ``zeusd token issue``     unset
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
from typing import TypeVar, cast, get_args

from perseus.client.gpu.control import GpuMode
from perseus.core import settings as v
from perseus.core.defaults import BASELINE_ITERATIONS
from perseus.core.errors import SettingsError
from perseus.core.settings import Choice, Text, Url, Variable, Whole

__all__ = [
    "GPU_MODES",
    "ClientSettings",
    "ProfileBudget",
    "SettingsError",
    "default_gpu_mode",
    "load_settings",
]

GPU_MODES: tuple[GpuMode, ...] = get_args(GpuMode)

T = TypeVar("T")


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

    Each variable is read and checked as :mod:`perseus.core.settings` defines it.

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

    def given(name: str, variable: Variable[T]) -> T | None:
        """The argument ``name`` if given (checked, errors naming it), else the variable."""
        value = arguments.get(name)
        if value is None:
            return variable.read(env)
        if isinstance(variable.kind, Text | Url | Choice):
            return variable.kind.check(value, variable.name)  # named as the variable
        return variable.kind.check(value, name)

    server = given("server", v.SERVER)
    job = given("job", v.JOB)
    token = given("token", v.TOKEN)
    if server is not None:
        missing = [var.name for var, value in ((v.JOB, job), (v.TOKEN, token)) if not value]
        if missing:
            raise SettingsError(
                f"{' and '.join(missing)} not set: create the job with `perseus job create` "
                "and export the lines it prints"
            )
    gpu = cast(
        GpuMode,
        given("gpu", v.GPU)
        if arguments.get("gpu") is not None or v.GPU.text(env)
        else default_gpu_mode(env),
    )
    given_budget = arguments.get("budget")
    if given_budget is not None and not isinstance(given_budget, ProfileBudget):
        raise SettingsError("budget: expected a ProfileBudget")
    budget = given_budget or ProfileBudget(
        window_s=_read(v.PROFILE_WINDOW_S, env),
        settle_s=_read(v.PROFILE_SETTLE_S, env),
        clocks=_read(v.PROFILE_CLOCKS, env),
        max_s=_read(v.PROFILE_MAX_S, env),
        blocking_s=_read(v.PROFILE_BLOCKING_S, env),
    )
    budget.check()
    telemetry_queue = arguments.get("telemetry_queue")
    return ClientSettings(
        server=server.rstrip("/") if server else None,
        job=job,
        token=token,
        rank=given("rank", v.RANK) or 0,
        stage=given("stage", v.STAGE),
        data_parallel_rank=given("data_parallel_rank", v.DATA_PARALLEL_RANK),
        tensor_parallel_rank=given("tensor_parallel_rank", v.TENSOR_PARALLEL_RANK),
        gpu_index=given("gpu_index", v.GPU_INDEX) or 0,
        gpu=gpu,
        profile_path=given("profile_path", v.PROFILE),
        budget=budget,
        clock_log_dir=given("clock_log_dir", v.CLOCK_LOG),
        poll_wait_s=_known(given("poll_wait_s", v.POLL_WAIT_S)),
        telemetry_queue=(
            1024 if telemetry_queue is None else Whole(1).check(telemetry_queue, "telemetry_queue")
        ),
        clock_latency_s=_known(given("clock_latency_s", v.CLOCK_LATENCY_S)),
        baseline_iterations=_known(given("baseline_iterations", v.BASELINE_ITERATIONS)),
        fake_clock_delay_s=given("fake_clock_delay_s", v.FAKE_CLOCK_DELAY_S),
        strict=given("strict", v.STRICT) is True,
    )


def default_gpu_mode(environ: Mapping[str, str]) -> str:
    """``PERSEUS_GPU`` (checked); where it is unset, ``zeusd`` if Zeus's ``ZEUSD_SOCK_PATH`` or
    ``ZEUSD_HOST_PORT`` is set (zeusd is there to set clocks), else ``nvml``."""
    if v.GPU.text(environ):
        return _read(v.GPU, environ)
    zeusd = v.ZEUSD_SOCK_PATH.text(environ) or v.ZEUSD_HOST_PORT.text(environ)
    return "zeusd" if zeusd else "nvml"


def _read(variable: Variable[T], environ: Mapping[str, str]) -> T:
    """A variable that has a default."""
    return _known(variable.read(environ))


def _known(value: T | None) -> T:
    if value is None:  # only a variable without a default reads as None
        raise SettingsError("a setting without a default was read as unset")
    return value


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
