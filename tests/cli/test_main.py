"""``perseus`` itself: dispatch, one-line errors, a fast --help, extras named when missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import perseus
from perseus.cli import main


def test_no_command_and_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "perseus: error: " in capsys.readouterr().err
    assert main(["plan", "x.csv", "--microbatches", "2", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perseus: error: ") and "--bogus" in err


def test_help_and_version_load_no_heavy_module() -> None:
    code = (
        "import sys\n"
        "from perseus.cli import main\n"
        "for argv in (['--help'], ['--version']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = {'numpy', 'scipy', 'networkx', 'matplotlib', 'pydantic', 'highspy'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    *_, last = done.stdout.strip().splitlines()
    assert last == "[]", done.stdout
    assert f"perseus {perseus.__version__}" in done.stdout
    assert "plan" in done.stdout and "reset-clocks" in done.stdout


_BARE = """
import sys
for name in ("httpx", "pydantic_settings", "fastapi", "uvicorn", "torch", "sqlalchemy", "pynvml"):
    sys.modules[name] = None  # as if the extras were not installed
from perseus.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["serve"], "server"),
        (["job", "status"], "client"),
        (["profile", "--gpu", "fake", "--clocks", "every:50"], "torch"),
    ],
)
def test_every_help_works_without_the_extras_and_running_says_which_to_install(
    argv: list[str], extra: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PERSEUS_SERVER": "http://127.0.0.1:9", "PERSEUS_JOB": "j",
           "PERSEUS_TOKEN": "t"}  # fmt: skip
    run = [sys.executable, "-c", _BARE]
    helped = subprocess.run([*run, *argv, "--help"], capture_output=True, text=True, env=env)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(f"usage: perseus {argv[0]}")
    ran = subprocess.run(
        [*run, *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert ran.returncode == 2
    assert f"pip install 'perseus-planner[{extra}]'" in ran.stderr, ran.stderr


def test_the_core_install_plans_without_scipy_or_networkx(tmp_path: Path) -> None:
    """scipy and networkx are test extras only: the demo, an exact plan and a simulation run
    with them (and every extra) absent."""
    bare = _BARE.replace('"pynvml")', '"pynvml", "scipy", "networkx")')
    run = [sys.executable, "-c", bare]
    demo = subprocess.run([*run, "demo"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert demo.returncode == 0, demo.stderr
    rows = ["stage,instruction,frequency,time,energy"] + [
        f"{g},{kind},{f},{t * (1 + g / 10):.4f},{t * f / 10:.4f}"
        for g in range(2)
        for kind, base in (("forward", 1.0), ("backward", 2.0))
        for f, t in ((1400, base), (1200, base * 1.1), (1000, base * 1.3))
    ]
    (tmp_path / "tiny.csv").write_text("\n".join(rows) + "\n")
    exact = subprocess.run(
        [*run, "plan", "tiny.csv", "--microbatches", "2", "--p-block", "50", "--exact",
         "--output", "exact.json"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert exact.returncode == 0, exact.stderr
    assert "gap" in exact.stdout
    simulate = subprocess.run(
        [*run, "simulate", "example_profile.csv", "frontier.json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert simulate.returncode == 0, simulate.stderr
