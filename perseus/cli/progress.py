"""A progress line for long commands, drawn only on a terminal."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """Shows on a terminal what a long command is doing: its phase, a bar, the time so far.

    Used as a context manager: a thread redraws the line every ``interval_s`` seconds from
    ``delay_s`` on (so it keeps moving while a phase reports nothing, and commands quicker than
    ``delay_s`` stay silent), and it is erased at the end. Called as ``progress(done, total)``
    (the solver's callback) it fills the bar; the bar never moves back within a phase, even
    when the total grows. Nothing is drawn when the stream is not a terminal (logs, pipes).
    """

    _SPIN = "|/-\\"

    def __init__(
        self,
        stream: TextIO,
        *,
        enabled: bool = True,
        delay_s: float = 0.2,
        interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        width: int = 24,
        thread: bool = True,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._delay_s = delay_s
        self._interval_s = interval_s
        self._width = width
        self._enabled = enabled and stream.isatty()
        self._phase = "starting"
        self._fraction: float | None = None
        self._draws = 0
        self._drawn = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = (
            threading.Thread(target=self._run, name="perseus-progress", daemon=True)
            if thread and self._enabled
            else None
        )

    def __enter__(self) -> ProgressBar:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def phase(self, text: str) -> None:
        """Start a phase: ``text`` replaces the previous one and the bar empties."""
        self._phase = text
        self._fraction = None

    def __call__(self, done: int, total: int) -> None:
        if total > 0:
            fraction = min(max(done / total, 0.0), 1.0)
            self._fraction = max(fraction, self._fraction or 0.0)

    def draw(self) -> None:
        """Redraw the line now (the thread does this; tests call it with a fake clock)."""
        if not self._enabled:
            return
        elapsed = self._clock() - self._start
        if elapsed < self._delay_s:
            return
        spin = self._SPIN[self._draws % len(self._SPIN)]
        self._draws += 1
        fraction = self._fraction
        if fraction is None:
            bar = ""
        else:
            filled = round(fraction * self._width)
            bar = f" [{'#' * filled}{'.' * (self._width - filled)}] {100 * fraction:3.0f} %"
        with self._lock:
            self._stream.write(f"\r\033[Kperseus: {self._phase}{bar} {spin} {elapsed:.1f} s")
            self._stream.flush()
            self._drawn = True

    def close(self) -> None:
        """Stop redrawing and erase the line, if one was drawn."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()
        with self._lock:
            if self._drawn:
                self._stream.write("\r\033[K")
                self._stream.flush()
                self._drawn = False

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.draw()
