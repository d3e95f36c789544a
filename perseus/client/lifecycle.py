"""A rank's start and end: :func:`connect`, the exit hooks and the signal handlers.

:func:`connect` resolves the settings, builds the :class:`~perseus.client.rank.Rank` and, once
per process, puts hooks in place that reset every rank's GPU clocks however the process
ends: at exit (one multiprocessing finalizer, which also runs in forked children), and on
SIGTERM/SIGINT (reset first, then the previous handler). Exposed as
:func:`perseus.client.connect`.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from perseus.client.api.client import PlannerClient
from perseus.client.gpu.control import GpuControl, GpuMode
from perseus.client.profiling.online import WorkloadSource
from perseus.client.rank import Rank
from perseus.client.settings import load_settings
from perseus.client.torch_env import cuda_events, distributed
from perseus.core.settings import RANK

__all__ = ["close_all", "connect"]

_log = logging.getLogger("perseus.client")

_ranks: list[Rank] = []
_hooks_pid: int | None = None  # the process whose exit hooks are in place
_signals_installed = False  # signal handlers survive a fork, exit hooks need a new process
_said_off = False


def connect(
    *,
    workload: WorkloadSource = None,
    gpu: GpuControl | GpuMode | None = None,
    planner: PlannerClient | None = None,
    install_signal_handlers: bool = True,
    **settings: object,
) -> Rank:
    """Connect this training process to the planner.

    Args:
        workload: The stage's work for online profiling (the framework integrations bind
            one themselves), or a callable returning it once the first iteration has run.
        gpu: The GPU mode (``"nvml"``, ``"dry-run"``, ``"fake"``, else ``PERSEUS_GPU``), or
            a GPU object to drive instead (tests).
        planner: A planner client instead of one for ``PERSEUS_SERVER`` (tests).
        install_signal_handlers: Reset the GPU's clocks on SIGTERM and SIGINT (then let the
            previous handler run). Only possible from the main thread.
        **settings: Any :class:`~perseus.client.settings.ClientSettings` field (``server``,
            ``job``, ``token``, ``rank``, ``stage``, ``gpu_index``, ``profile_path``, ...);
            unset ones come from ``PERSEUS_*`` variables.

    Returns:
        The rank. Without a server it does nothing at all (and says so once).

    Raises:
        SettingsError: A setting is malformed.
        GpuControlError: The GPU cannot be opened (NVML missing, bad index) and
            ``PERSEUS_STRICT=1``; otherwise the rank logs one error line and is off (training
            goes on at default clocks, :attr:`Rank.failure` says why).
    """
    global _said_off
    if isinstance(gpu, str):
        settings["gpu"] = gpu
        gpu = None
    if "rank" not in settings:
        dist = distributed()
        if dist is not None and not os.environ.get(RANK.name) and not os.environ.get("RANK"):
            settings["rank"] = dist.get_rank()
    resolved = load_settings(None, **settings)
    if resolved.server is None:
        if not _said_off:
            _log.warning("perseus: PERSEUS_SERVER is not set; perseus does nothing in this run")
            _said_off = True
        return Rank(resolved)
    rank = Rank(
        resolved, gpu=gpu, planner=planner, workload=workload, record_event=cuda_events(resolved)
    )
    if not rank.active:  # the GPU could not be opened (logged): nothing to reset at exit
        return rank
    _ranks.append(rank)
    _install_exit_hooks(install_signal_handlers)
    return rank


def close_all(reason: str) -> None:
    """Close every rank this process connected (what the exit hooks run)."""
    for rank in list(_ranks):
        rank.close(reason)
    _ranks.clear()


def _install_exit_hooks(signals: bool) -> None:
    global _hooks_pid, _signals_installed
    if _hooks_pid != os.getpid():
        _hooks_pid = os.getpid()
        # multiprocessing runs its finalizers at every process's exit (through atexit), and
        # also in the children it forks, which leave through os._exit, past atexit.
        multiprocessing.util.Finalize(None, close_all, args=("exit",), exitpriority=100)
    if _signals_installed or not signals:
        return
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may; a later connect() from it installs them
    _signals_installed = True
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        signal.signal(signum, _make_handler(signum, previous))


def _forget_the_parents_ranks() -> None:
    # A forked child has copies of its parent's ranks, whose threads did not come along: they
    # are the parent's to close (closing them here would reset the parent's GPU under it).
    _ranks.clear()


os.register_at_fork(after_in_child=_forget_the_parents_ranks)


def _make_handler(
    signum: int, previous: Callable[[int, FrameType | None], Any] | int | None
) -> Callable[[int, FrameType | None], None]:
    name = signal.Signals(signum).name

    def handler(received: int, frame: FrameType | None) -> None:
        # Reset first: whatever the previous handler does next (exit, KeyboardInterrupt),
        # the GPU must not stay at a low clock.
        for rank in list(_ranks):
            rank.emergency_reset(name)
        if callable(previous):
            previous(received, frame)
            return
        if previous == signal.SIG_IGN:
            return
        close_all(name)
        signal.signal(received, signal.SIG_DFL)
        os.kill(os.getpid(), received)

    return handler
