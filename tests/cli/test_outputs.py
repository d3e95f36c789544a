"""Output files: written whole or not at all, through symbolic links, and never in place of a
device or a pipe (``perseus plan --output /dev/null`` once replaced the device node)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from perseus.cli import main, outputs
from perseus.cli.outputs import check_writable, write_files

EXAMPLE = Path(__file__).resolve().parents[2] / "perseus" / "data" / "example_profile.csv"


def test_a_new_file_gets_the_usual_mode_and_a_replaced_one_keeps_its_own(tmp_path: Path) -> None:
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("old")
    old.chmod(0o640)
    umask = os.umask(0o022)
    try:
        write_files({str(new): b"new", str(old): b"replaced"})
    finally:
        os.umask(umask)
    assert new.read_bytes() == b"new" and stat.S_IMODE(new.stat().st_mode) == 0o644
    assert old.read_bytes() == b"replaced" and stat.S_IMODE(old.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "old.json"]


def test_a_symlink_stays_and_its_target_is_replaced(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real.name)
    write_files({str(link): b"new"})
    assert link.is_symlink() and os.readlink(link) == real.name
    assert real.read_bytes() == b"new"


@pytest.fixture
def null_device(tmp_path: Path) -> str:
    """A null device to write to: as root (who could replace /dev/null itself, should a
    regression rename over it) a private node in tmp_path, else /dev/null (which a user
    cannot replace)."""
    if os.geteuid() != 0:
        return os.devnull
    node = tmp_path / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return str(node)


def test_a_device_is_written_in_place_not_replaced(null_device: str) -> None:
    write_files({null_device: b"nothing"})
    assert stat.S_ISCHR(os.stat(null_device).st_mode)
    assert os.path.getsize(null_device) == 0


def test_a_fifo_is_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_files({str(fifo): b"through the pipe"})
    reader.join(timeout=10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_descriptor_path_is_written_in_place(tmp_path: Path) -> None:
    """/dev/stdout, /dev/fd/N, /proc/self/fd/N and a shell's >(...) name open files: when
    one is a pipe, its target does not exist as a path; when one is a regular file (stdout
    redirected), renaming over it would leave the shell writing to the old, unlinked file."""
    read_end, write_end = os.pipe()
    try:
        write_files({f"/dev/fd/{write_end}": b"piped"})
        assert os.read(read_end, 100) == b"piped"
    finally:
        os.close(read_end)
        os.close(write_end)
    redirected = tmp_path / "out.txt"
    with redirected.open("wb") as handle:
        inode = redirected.stat().st_ino
        write_files({f"/proc/self/fd/{handle.fileno()}": b"json"})
    assert redirected.stat().st_ino == inode and redirected.read_bytes() == b"json"


def test_only_descriptors_devices_and_pipes_are_written_in_place(tmp_path: Path) -> None:
    """/dev/shm (tmpfs) holds ordinary files: only descriptor links, devices and pipes are
    written in place."""
    for path in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", os.devnull):
        assert outputs.written_in_place(path), path
    for path in ("/dev/shm/perseus-not-there.json", str(tmp_path / "x.json")):
        assert not outputs.written_in_place(path), path


def test_a_replaced_file_loses_setuid_bits_and_an_unwritable_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "x.json"
    target.write_text("old")
    target.chmod(0o4755)
    write_files({str(target): b"new"})
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    monkeypatch.setattr(outputs.os, "access", lambda path, mode: Path(path) != target)
    assert check_writable(str(target)) == f"{target} is not writable (permission denied)"
    with pytest.raises(PermissionError) as caught:
        write_files({str(target): b"newer"})
    assert caught.value.filename == str(target) and target.read_text() == "new"


def test_a_failed_rename_names_the_path_given_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename that fails (another user's file in a sticky /tmp) is reported for the path
    the user gave, not for the temporary file."""

    def refuse(src: str, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted", src)

    monkeypatch.setattr(outputs.os, "replace", refuse)
    target = tmp_path / "r.json"
    with pytest.raises(PermissionError) as caught:
        write_files({str(target): b"x"})
    assert caught.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_device_that_fails_is_written_before_any_file_is_replaced(tmp_path: Path) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    with pytest.raises(OSError) as caught:
        write_files({str(kept): b"new", "/dev/full": b"x" * 100_000})
    assert caught.value.filename == "/dev/full"
    assert kept.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.json"]


def test_one_file_that_cannot_be_written_leaves_every_other_untouched(tmp_path: Path) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    with pytest.raises(OSError):
        write_files({str(kept): b"new", str(tmp_path / "missing" / "x.json"): b"x"})
    assert kept.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.json"]  # no temporary left


def _plan(*extra: str) -> list[str]:
    return [
        "plan", str(EXAMPLE), "--microbatches", "4", "--p-block", "100", *extra,
    ]  # fmt: skip


def test_plan_output_to_devnull_keeps_the_device(
    null_device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_plan("--output", null_device)) == 0
    assert stat.S_ISCHR(os.stat(null_device).st_mode)
    assert f"wrote {null_device}" in capsys.readouterr().out


def test_plan_refuses_one_file_for_two_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = tmp_path / "a.json"
    argv = _plan("--output", str(same), "--plan-output", f"{tmp_path}/./a.json")
    assert main(argv) == 2
    assert "--plan-output" in capsys.readouterr().err and not same.exists()


def test_plan_output_dash_is_refused_before_planning(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_plan("--output", "-")) == 2
    err = capsys.readouterr().err
    assert "--output: '-'" in err and "give a file name" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--clocks", "every:0"], "--clocks: expected a whole number >= 1, got '0'"),
        (["-o", "/nonexistent-dir/x.csv"], "x.csv: directory /nonexistent-dir does not exist"),
    ],
)
def test_profile_checks_its_flags_before_opening_the_gpu(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed --clocks is named as the flag (not the variable the rank-side client
    reads), and neither it nor a missing directory gets as far as the GPU's header."""
    pytest.importorskip("httpx")
    assert main(["profile", "--gpu", "fake", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
