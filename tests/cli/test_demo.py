"""``perseus demo``: the shipped example planned, its files and plots written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

from .plans import reference_label


def test_demo_as_a_subprocess(tmp_path: Path) -> None:
    outdir = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "perseus.cli", "demo", "--outdir", str(outdir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reference = reference_label(outdir / "frontier.json")
    for label in (reference, "global clock", "per-stage clock", "no-slowdown"):
        assert label in done.stdout
    # The demo leaves its profile beside the plans, so that perseus simulate can replay them.
    assert (outdir / "example_profile.csv").read_bytes() == (
        resources.files("perseus") / "data" / "example_profile.csv"
    ).read_bytes()
    assert f"profile   {outdir / 'example_profile.csv'}: 4 stages" in done.stdout
    for name in ("frontier.png", "timeline.png"):
        assert (outdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {outdir / name}" in done.stdout
    assert json.loads((outdir / "frontier.json").read_text())["format"] == "perseus.frontier/1"
    # A real saving at no slowdown: the chosen point's saving column.
    found = re.search(
        r"^no-slowdown \(point \d+ of \d+\)\s+\S+\s+\S+\s+([0-9.]+) %\s+0\.00 %", done.stdout, re.M
    )
    assert found and float(found.group(1)) > 3.0, done.stdout
