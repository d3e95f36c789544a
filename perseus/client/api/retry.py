"""Retrying calls to the planner: exponential backoff with jitter, and which errors to retry.

Pure and free of I/O (the waits go through a ``threading.Event`` the caller can set to stop),
so it is tested without a server. Every request :class:`~perseus.client.api.client.PlannerClient`
makes is safe to repeat.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from perseus.client.api.http import AnswerNotUnderstood
from perseus.core.errors import PlannerUnavailable, PlanNotReady

__all__ = ["NOT_UNDERSTOOD_ATTEMPTS", "Backoff", "retry_call", "retryable"]

NOT_UNDERSTOOD_ATTEMPTS = 5
"""Answers in a row a caller may not understand (:class:`AnswerNotUnderstood`) before it
stops asking: a proxy's error page passes in a moment, a server of an incompatible version
does not (with the default backoff, about 8 s of retries)."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: how long to wait before the next attempt.

    Attributes:
        initial_s: the wait after the first failure.
        factor: each further failure multiplies the wait by this.
        max_s: the longest wait.
        jitter: fraction of the wait taken off at random, so that a thousand ranks that
            failed together do not come back together; 0 for none.

    Raises:
        ValueError: a field is out of range.
    """

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial_s) and self.initial_s > 0):
            raise ValueError(f"initial_s must be a finite number > 0, got {self.initial_s!r}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"factor must be a finite number >= 1, got {self.factor!r}")
        if not (math.isfinite(self.max_s) and self.max_s >= self.initial_s):
            raise ValueError(f"max_s must be finite and >= initial_s, got {self.max_s!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """The wait after failed attempt number ``attempt`` (0 for the first failure).

        The result lies in ``[b * (1 - jitter), b]`` where
        ``b = min(max_s, initial_s * factor ** attempt)``.

        Raises:
            ValueError: ``attempt`` is negative.
        """
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        # Compare in logarithms: factor ** attempt overflows a float long before attempts
        # stop (a rank may retry for days).
        if attempt * math.log(self.factor) >= math.log(self.max_s / self.initial_s):
            base = self.max_s
        else:
            base = self.initial_s * self.factor**attempt
        return base * (1 - self.jitter * rng.random())


def retryable(exc: BaseException) -> bool:
    """Whether the same request may succeed later, unchanged.

    Yes for :class:`~perseus.core.errors.PlannerUnavailable` (unreachable, timed out, 5xx,
    garbage) and :class:`~perseus.core.errors.PlanNotReady`; no for everything else (a bad
    token, an unknown job, a rejected request, a job in the wrong state).
    """
    return isinstance(exc, PlannerUnavailable | PlanNotReady)


def retry_call(
    fn: Callable[[], T],
    *,
    backoff: Backoff,
    stop: threading.Event,
    rng: random.Random,
    on_error: Callable[[BaseException, int], None] | None = None,
    not_understood_attempts: int = NOT_UNDERSTOOD_ATTEMPTS,
) -> T:
    """Call ``fn`` until it succeeds, retrying :func:`retryable` errors until ``stop`` is set,
    or until ``not_understood_attempts`` answers in a row were not understood.

    Between attempts it waits :meth:`Backoff.delay_s` (at least the server's
    ``Retry-After`` when the error carries one, up to ``backoff.max_s``) with ``stop.wait``,
    so setting ``stop`` ends the wait at once. ``fn`` is called at least once.

    Args:
        fn: the request, e.g. ``lambda: client.register(body)``.
        backoff: the waits.
        stop: set it to give up.
        rng: the jitter's randomness.
        on_error: called with each retryable error and its attempt number (from 0) before
            the wait, e.g. to log it.
        not_understood_attempts: the most :class:`AnswerNotUnderstood` errors in a row.

    Returns:
        What ``fn`` returned.

    Raises:
        Exception: the first error that is not retryable, the last one once ``stop`` is
            set, or the last :class:`AnswerNotUnderstood` of ``not_understood_attempts``
            in a row.
    """
    attempt = 0
    not_understood = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not retryable(exc):
                raise
            not_understood = not_understood + 1 if isinstance(exc, AnswerNotUnderstood) else 0
            if not_understood >= not_understood_attempts:
                raise
            if on_error is not None:
                on_error(exc, attempt)
            delay_s = backoff.delay_s(attempt, rng)
            retry_after_s = exc.retry_after_s if isinstance(exc, PlanNotReady) else None
            if retry_after_s is not None:
                delay_s = max(delay_s, min(retry_after_s, backoff.max_s))
            if stop.is_set() or stop.wait(delay_s):
                raise
            attempt += 1
