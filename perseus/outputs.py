"""Writing output files: whole or not at all, and never in place of what a path names.

A regular file is written through a temporary file beside it, renamed into place, so a
failure (a full disk, an interrupt) leaves the old file or none, never half of one. A path
that is a symbolic link is followed: the link stays and the file it points to is replaced. A
path that names a device or a pipe (``/dev/null``, ``/dev/stdout``, a FIFO) is written
directly: renaming a file over it would replace the device node itself.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["resolve", "write_files"]


def resolve(path: str | os.PathLike[str]) -> Path:
    """Where writing ``path`` lands: symbolic links followed, the path made absolute."""
    return Path(os.path.realpath(path))


def write_files(files: Mapping[str, bytes]) -> None:
    """Write every ``path -> data`` of ``files``: all temporary files first, then the renames
    (and the direct writes to devices and pipes), so one that cannot be written stops the
    others before any is replaced.

    A replaced regular file keeps its permission bits; a new one gets ``0o666`` less the umask
    (``mkstemp`` alone would make it ``0o600``).

    Raises:
        OSError: a file could not be written (its ``filename`` says which); no temporary
            file is left behind.
    """
    umask = os.umask(0)
    os.umask(umask)
    staged: list[tuple[str | None, Path, bytes]] = []
    try:
        for path, data in files.items():
            target = resolve(path)
            try:
                mode = os.stat(target).st_mode
            except FileNotFoundError:
                mode = None
            if mode is not None and not stat.S_ISREG(mode):
                staged.append((None, target, data))  # a device or a pipe: written in place
                continue
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            staged.append((tmp, target, data))
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, stat.S_IMODE(mode) if mode is not None else 0o666 & ~umask)
        for staged_tmp, target, data in staged:
            if staged_tmp is None:
                with open(target, "wb") as handle:
                    handle.write(data)
            else:
                os.replace(staged_tmp, target)
    except BaseException:
        for leftover, _, _ in staged:
            if leftover is not None:
                Path(leftover).unlink(missing_ok=True)
        raise
