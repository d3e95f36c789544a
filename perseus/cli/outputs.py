"""Writing output files: whole or not at all, and never in place of what a path names.

A regular file is written through a temporary file beside it, renamed into place, so a
failure (a full disk, an interrupt) leaves the old file or none, never half of one; the
replaced file keeps its permission bits (and, when root writes it, its owner). A path that is
a symbolic link is followed: the link stays and the file it points to is replaced. A path
that names a character device or a pipe (``/dev/null``, a FIFO), or an open file through
``/dev/stdout``, ``/dev/fd/N`` or ``/proc/PID/fd/N`` (a shell's ``>(...)``), is written
directly: renaming a file over it would replace the device node itself, or a file that a
shell redirection still writes to.

:class:`Outputs` is a command's set of files: checked before the long work, written at the end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from perseus.cli.arguments import UsageError

__all__ = ["Outputs", "check_writable", "resolve", "write_files", "written_in_place"]

_MAX_LINKS = 40  # as the kernel's symlink limit


def resolve(path: str | os.PathLike[str]) -> Path:
    """Where writing ``path`` lands: symbolic links followed, the path made absolute."""
    return Path(os.path.realpath(path))


# Links that name a process's open file, not a place to rename into.
_DESCRIPTOR = re.compile(r"^/(dev/(fd/|std(in|out|err)$)|proc/[^/]+/fd/)")


def written_in_place(path: str | os.PathLike[str]) -> bool:
    """Is ``path`` written directly: a character device or a pipe, or an open file named
    through ``/dev/stdout``, ``/dev/fd/N`` or ``/proc/PID/fd/N``?"""
    hop = os.path.abspath(path)
    for _ in range(_MAX_LINKS):
        if _DESCRIPTOR.match(hop):
            return True
        if not os.path.islink(hop):
            break
        hop = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_writable(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be written, as a message naming it (``out.json is a directory``,
    ``x/out.json: directory x does not exist``), or None if it can; for checking before long
    work."""
    reason = _why_not(path)
    if reason is None:
        return None
    return f"{path}{' ' if reason.startswith('is ') else ': '}{reason}"


def _why_not(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be written, or None.

    The answer is what :func:`write_files` will do: write a device or pipe in place (it must
    be writable), or rename a new file into its directory (which must exist and be writable;
    an existing file there must be a regular file the caller may write, as a shell's ``>``
    would require).
    """
    if written_in_place(path):
        return None if os.access(path, os.W_OK) else "is not writable"
    target = resolve(path)
    if target.is_dir():
        return "is a directory"
    if target.exists() and not target.is_file():
        return "is neither a regular file, a character device nor a pipe"
    if target.exists() and not os.access(target, os.W_OK):
        return "is not writable (permission denied)"
    parent = target.parent
    if not parent.is_dir():
        return f"directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"directory {parent} is not writable"
    return None


def write_files(files: Mapping[str, bytes]) -> None:
    """Write every ``path -> data`` of ``files``: first every temporary file, then the
    direct writes (devices, pipes), then the renames, so a file that cannot be written stops
    the others before any is replaced.

    Raises:
        OSError: a file could not be written; its ``filename`` is the path given (not a
            temporary file), and no temporary file is left behind.
    """
    staged: list[tuple[str, Path, str | None]] = []  # (path given, target, temporary file)
    try:
        for path, data in files.items():
            if written_in_place(path):
                staged.append((path, Path(path), None))
                continue
            target = resolve(path)
            reason = _why_not(path)
            if reason is not None:  # refused before anything is written
                raise OSError(_errno_of(reason), reason, path)
            tmp = str(target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp")
            staged.append((path, target, tmp))
            _stage(tmp, target, data, path)
        for given, place, staged_tmp in staged:
            if staged_tmp is None:
                _write_in_place(place, files[given], given)
        for given, place, staged_tmp in staged:
            if staged_tmp is not None:
                try:
                    os.replace(staged_tmp, place)
                except OSError as err:
                    raise OSError(err.errno, err.strerror, given) from err
    except BaseException:
        for _, _, leftover in staged:
            if leftover is not None:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        raise


def _errno_of(reason: str) -> int:
    """The errno that :func:`_why_not`'s ``reason`` stands for."""
    if reason == "is a directory":
        return errno.EISDIR
    if reason.startswith("directory") and reason.endswith("does not exist"):
        return errno.ENOENT
    return errno.EACCES


def _stage(tmp: str, target: Path, data: bytes, path: str) -> None:
    """Write ``data`` to the new file ``tmp``, with the mode (and, as root, the owner) that
    ``target`` has, or the umask's for a new file."""
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    try:
        # 0o666 less the umask for a new file, as any program's output (mkstemp makes 0o600)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode) & 0o777)
            if os.geteuid() == 0:
                with contextlib.suppress(OSError):
                    os.chown(tmp, old.st_uid, old.st_gid)
    except OSError as err:
        raise OSError(err.errno, err.strerror, path) from err


def _write_in_place(target: Path, data: bytes, path: str) -> None:
    try:
        with open(target, "wb") as handle:
            handle.write(data)
    except OSError as err:
        raise OSError(err.errno, err.strerror, path) from err


@dataclass
class Outputs:
    """Files to write at the very end, all or none (:func:`write_files`).

    ``paths[i]`` is what option ``options[i]`` names (None: not asked for). Every destination
    is checked when this is made, rather than fail after the long computation.

    Raises:
        UsageError: A path is ``-``, cannot be written, or is another option's file too.
    """

    paths: list[str | None]
    options: list[str]
    _pending: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: dict[Path, str] = {}
        for path, option in zip(self.paths, self.options, strict=True):
            if path is None:
                continue
            if path == "-":
                raise UsageError(
                    f"{option}: '-': this command prints its table on standard output; give a "
                    f"file name"
                )
            refused = check_writable(path)
            if refused is not None:
                raise UsageError(f"{option}: {refused}")
            target = resolve(path)
            if target in seen and not target.is_char_device():
                raise UsageError(f"{option}: {path} is also {seen[target]}'s file")
            seen[target] = option

    def put(self, path: str, data: bytes) -> None:
        """Keep ``data`` to write to ``path`` at the end."""
        self._pending[path] = data

    def write(self) -> list[str]:
        """Write every pending file (see :func:`write_files`); returns their paths.

        Raises:
            UsageError: A file could not be written (none was replaced).
        """
        try:
            write_files(self._pending)
        except OSError as err:
            raise UsageError(f"cannot write {err.filename or 'output'}: {err.strerror}") from err
        return list(self._pending)
