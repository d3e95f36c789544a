"""The progress line of long commands."""

from __future__ import annotations

import io
import time

from perseus.cli.progress import ProgressBar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_the_phase_and_a_bar_that_never_moves_back() -> None:
    now = [0.0]
    terminal = _Terminal()
    bar = ProgressBar(terminal, clock=lambda: now[0], delay_s=0.2, thread=False)
    bar.phase("loading the solver")
    now[0] = 0.1
    bar.draw()
    assert terminal.getvalue() == ""  # quick commands stay silent
    now[0] = 0.3
    bar.draw()
    assert "perseus: loading the solver" in terminal.getvalue()
    bar.phase("planning")
    bar(5, 10)
    bar.draw()
    line = terminal.getvalue().rsplit("\r", 1)[-1]
    assert "planning [" in line and " 50 %" in line and "0.3 s" in line
    bar(5, 40)  # the total grew: the bar holds its place
    now[0] = 0.4
    bar.draw()
    assert " 50 %" in terminal.getvalue().rsplit("\r", 1)[-1]
    bar.close()
    assert terminal.getvalue().endswith("\r\033[K")

    log = io.StringIO()  # not a terminal
    bar = ProgressBar(log, clock=lambda: now[0], thread=False)
    now[0] = 5.0
    bar(5, 10)
    bar.draw()
    bar.close()
    assert log.getvalue() == ""


def test_progress_bar_thread_redraws_until_closed() -> None:
    terminal = _Terminal()
    with ProgressBar(terminal, delay_s=0.0, interval_s=0.01) as bar:
        bar.phase("working")
        deadline = time.monotonic() + 5
        while terminal.getvalue().count("perseus: working") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert terminal.getvalue().count("perseus: working") >= 3
    assert terminal.getvalue().endswith("\r\033[K")
