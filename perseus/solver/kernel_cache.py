"""Where the compiled kernels are cached, whether they are ready, and compiling them for later.

numba is optional: without it the planner runs numpy's passes, which give the same plans,
times and energies as the kernels (:mod:`perseus.solver.kernels`). With it, the kernels are
compiled once and cached in a per-user folder, never inside the installed package (a
system-wide installation is not writable by its users, and files left in an installed
package's folder survive ``pip uninstall`` and shadow a later editable installation):

- ``$PERSEUS_CACHE_DIR/numba`` where ``PERSEUS_CACHE_DIR`` is set,
- else ``$XDG_CACHE_HOME/perseus/numba``,
- else ``~/.cache/perseus/numba``.

Where that folder cannot be written, the kernels compile in memory, for the process alone.

Compiling takes 6-15 s, more than numpy's passes take to plan anything a one-off command
plans; so a one-off process uses the kernels only once they are *ready* (compiled and cached
for this installation: :func:`ready`), and otherwise plans with numpy's passes and starts a
compile for the next process (:func:`compile_later`), which waits until this process has
exited, so that the two never share the cores. A planner server's workers compile or load
them ahead of their jobs instead (:func:`perseus.solver.planner.warm_kernels`).

Standard library only: nothing here imports numba.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = [
    "CACHE_DIR_ENV",
    "COMPILE_LATER_ENV",
    "cache_root",
    "compile_later",
    "mark_ready",
    "numba_cache_dir",
    "numba_installed",
    "ready",
]

#: Overrides the cache's root folder (the kernels go in its ``numba`` folder).
CACHE_DIR_ENV = "PERSEUS_CACHE_DIR"
#: ``0`` stops one-off processes from compiling the kernels for later ones.
COMPILE_LATER_ENV = "PERSEUS_COMPILE_KERNELS"

_KERNELS = Path(__file__).with_name("kernels.py")
# A compile for later that started this long ago and left its lock behind has died.
_LOCK_STALE_S = 900.0
# What this process started: the compile for later (kept so that its pipe stays open).
_started: list[tuple[subprocess.Popen[bytes], int]] = []


def cache_root() -> Path:
    """The perseus cache folder (see the module's docstring); not created here."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "perseus"


def numba_cache_dir() -> Path | None:
    """The folder the kernels are cached in, created; None where it cannot be written."""
    folder = cache_root() / "numba"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return None
    return folder


def numba_installed() -> bool:
    """Whether numba can be found (without importing it: that takes half a second)."""
    return _numba_origin() is not None


def _numba_origin() -> str | None:
    """The file numba would be imported from, or None where it cannot be found."""
    try:
        spec = importlib.util.find_spec("numba")
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin or ""


def _marker_name() -> str:
    """The ready marker's file name: it names this installation's kernels (their file, its
    size and time), numba's installation (its file and time), Python's version and the
    machine's architecture, so that a change of any of them (after which numba compiles
    again) reads as not ready."""
    origin = _numba_origin()
    try:
        stat = _KERNELS.stat()
        numba_stat = os.stat(origin) if origin else None
    except OSError:
        return ""
    if numba_stat is None:
        return ""
    key = "\0".join([str(_KERNELS.resolve()), str(stat.st_size), str(stat.st_mtime_ns),
                     str(origin), str(numba_stat.st_mtime_ns), sys.version,
                     platform.machine()])  # fmt: skip
    return "ready-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def ready() -> bool:
    """Whether the kernels are compiled and cached for this installation, so that a process
    loads them (about 0.5 s with numba's import) rather than compiling them. A few file
    checks."""
    name = _marker_name()
    return bool(name) and (cache_root() / "numba" / name).is_file()


def mark_ready() -> None:
    """Record that the kernels are compiled and cached (after a process compiled or loaded
    every one of them from :func:`numba_cache_dir`); nothing where the cache is not written."""
    folder = numba_cache_dir()
    name = _marker_name()
    if folder is None or not name:
        return
    with contextlib.suppress(OSError):
        (folder / name).touch()


def compile_later() -> bool:
    """Start compiling the kernels into the cache for the next process, once this one has
    exited (a background process at low priority, that waits on a pipe this process holds
    open until it exits). At most once a process; nothing where numba is missing, the cache
    cannot be written, another compile is on its way, or ``PERSEUS_COMPILE_KERNELS=0``.

    Returns:
        Whether a compile was started.
    """
    if _started or os.environ.get(COMPILE_LATER_ENV, "1") == "0" or not numba_installed():
        return False
    folder = numba_cache_dir()
    if folder is None:
        return False
    lock = folder / "compiling"
    try:
        if time.time() - lock.stat().st_mtime < _LOCK_STALE_S:
            return False
    except OSError:
        pass
    read_end, write_end = os.pipe()
    root = str(Path(__file__).resolve().parents[2])  # the folder this perseus is imported from
    env = dict(os.environ)
    env[CACHE_DIR_ENV] = str(cache_root())
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _LATER, root, str(lock), repr(_LOCK_STALE_S)],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=tempfile.gettempdir(),
        )  # fmt: skip
    except OSError:
        os.close(write_end)
        return False
    finally:
        os.close(read_end)
    _started.append((process, write_end))
    return True


# The compile for later: wait for the parent to exit (the pipe's end), take the lock, compile
# (unless another process has meanwhile).
_LATER = """
import os, sys, time
sys.stdin.buffer.read()
root, lock, stale_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    os.nice(10)
except OSError:
    pass
try:
    fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
except FileExistsError:
    if time.time() - os.stat(lock).st_mtime < stale_s:
        sys.exit(0)
    fd = os.open(lock, os.O_CREAT | os.O_WRONLY)
os.close(fd)
try:
    sys.path.insert(0, root)
    from perseus.solver import kernel_cache, planner
    if not kernel_cache.ready():
        planner.warm_kernels()
finally:
    os.unlink(lock)
"""
