"""The retry pieces (Backoff, retryable, retry_call), without any server."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from perseus.client.api.http import AnswerNotUnderstood
from perseus.client.api.retry import Backoff, retry_call, retryable
from perseus.core.errors import (
    AuthError,
    JobNotFound,
    JobStateError,
    PlannerUnavailable,
    PlanNotReady,
    ProfileError,
    RequestRejected,
)


def test_backoff_grows_to_its_cap_without_overflow() -> None:
    backoff = Backoff(jitter=0.0)
    rng = random.Random(0)
    delays = [backoff.delay_s(a, rng) for a in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff.delay_s(10**9, rng) == 30.0


def test_backoff_jitter_stays_within_its_fraction() -> None:
    backoff = Backoff(initial_s=1.0, factor=3.0, max_s=100.0, jitter=0.25)
    rng = random.Random(7)
    for attempt in range(8):
        base = min(100.0, 3.0**attempt)
        draws = [backoff.delay_s(attempt, rng) for _ in range(200)]
        assert all(base * 0.75 <= d <= base for d in draws)
        assert len(set(draws)) > 100  # spread, not one value
    again = random.Random(7)
    assert backoff.delay_s(0, again) == Backoff(1.0, 3.0, 100.0, 0.25).delay_s(0, random.Random(7))


@pytest.mark.parametrize(
    "fields",
    [{"initial_s": 0}, {"factor": 0.5}, {"max_s": 0.1}, {"jitter": 1.0}, {"jitter": -0.1}],
)
def test_backoff_rejects_bad_fields(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**fields)


def test_retryable() -> None:
    assert retryable(PlannerUnavailable("down"))
    assert retryable(PlanNotReady("not yet", "planning"))
    for exc in (
        AuthError("no", 401),
        AuthError("wrong", 403),
        JobNotFound("no job"),
        JobStateError("not registered"),
        RequestRejected("body.stage: bad"),
        ProfileError("bad rows"),
        ValueError("bug"),
    ):
        assert not retryable(exc), exc


class _Stop(threading.Event):
    """A stop event that records the waits and never sleeps; set after ``stop_after`` waits."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.waits: list[float] = []
        self._stop_after = stop_after

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        if self._stop_after is not None and len(self.waits) >= self._stop_after:
            self.set()
        return self.is_set()


def _failing(*errors: BaseException) -> Callable[[], str]:
    pending = list(errors)

    def call() -> str:
        if pending:
            raise pending.pop(0)
        return "done"

    return call


def test_retry_call_retries_until_success() -> None:
    stop = _Stop()
    seen: list[tuple[str, int]] = []
    result = retry_call(
        _failing(PlannerUnavailable("down"), PlanNotReady("not yet", "planning")),
        backoff=Backoff(jitter=0.0),
        stop=stop,
        rng=random.Random(0),
        on_error=lambda exc, attempt: seen.append((type(exc).__name__, attempt)),
    )
    assert result == "done"
    assert stop.waits == [0.5, 1.0]
    assert seen == [("PlannerUnavailable", 0), ("PlanNotReady", 1)]


def test_retry_call_waits_at_least_retry_after_up_to_the_cap() -> None:
    stop = _Stop()
    retry_call(
        _failing(
            PlanNotReady("x", "planning", retry_after_s=5.0),
            PlanNotReady("x", "planning", retry_after_s=3600.0),
        ),
        backoff=Backoff(jitter=0.0, max_s=30.0),
        stop=stop,
        rng=random.Random(0),
    )
    assert stop.waits == [5.0, 30.0]


def test_retry_call_raises_the_last_error_once_stopped() -> None:
    last = PlannerUnavailable("still down")
    stop = _Stop(stop_after=2)
    with pytest.raises(PlannerUnavailable) as raised:
        retry_call(
            _failing(PlannerUnavailable("down"), last, PlannerUnavailable("never")),
            backoff=Backoff(),
            stop=stop,
            rng=random.Random(0),
        )
    assert raised.value is last
    already = _Stop()
    already.set()
    calls = _failing(PlannerUnavailable("down"))
    with pytest.raises(PlannerUnavailable):
        retry_call(calls, backoff=Backoff(), stop=already, rng=random.Random(0))
    assert already.waits == []  # called once, no wait


def test_retry_call_stops_after_answers_in_a_row_it_does_not_understand() -> None:
    # An incompatible planner answers the same every time: the caller gives up rather than
    # asking forever; one understood failure between them starts the count again.
    stop = _Stop()
    odd = [AnswerNotUnderstood(f"odd {n}") for n in range(4)]
    with pytest.raises(AnswerNotUnderstood) as raised:
        retry_call(
            _failing(odd[0], PlannerUnavailable("down"), odd[1], odd[2], odd[3], "never"),
            backoff=Backoff(jitter=0.0),
            stop=stop,
            rng=random.Random(0),
            not_understood_attempts=3,
        )
    assert raised.value is odd[3]
    assert len(stop.waits) == 4
    assert retryable(odd[0])  # one odd answer alone is retried like any garbage


def test_retry_call_does_not_retry_auth_errors() -> None:
    stop = _Stop()
    errors: list[BaseException] = []
    with pytest.raises(AuthError):
        retry_call(
            _failing(AuthError("wrong", 403)),
            backoff=Backoff(),
            stop=stop,
            rng=random.Random(0),
            on_error=lambda exc, attempt: errors.append(exc),
        )
    assert stop.waits == []
    assert errors == []


def test_setting_stop_interrupts_a_long_wait() -> None:
    stop = threading.Event()
    started = threading.Event()

    def call() -> str:
        started.set()
        raise PlannerUnavailable("down")

    outcome: list[BaseException] = []

    def run() -> None:
        try:
            retry_call(
                call, backoff=Backoff(initial_s=600.0, max_s=600.0), stop=stop, rng=random.Random()
            )
        except PlannerUnavailable as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(10)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert len(outcome) == 1
