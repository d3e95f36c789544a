"""One request to the planner (:func:`call_planner`) against scripted answers (MockTransport):
the token, the statuses it expects, every error the server sends read back as its class,
transport failures and garbage as PlannerUnavailable, bounded reads (PlanTooLarge), and
:func:`parse_reply`. The planner client's methods over it: test_planner.py."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perseus.client.api.http import (
    AnswerNotUnderstood,
    PlanTooLarge,
    call_planner,
    garbage_error,
    parse_reply,
    shown_body,
)
from perseus.client.api.retry import retryable
from perseus.core.errors import (
    AuthError,
    JobNotFound,
    JobStateError,
    PerseusError,
    PlannerUnavailable,
    PlanNotReady,
    RequestRejected,
    SolverTimeout,
)
from perseus.schemas import JobView, PlanResponse
from perseus.server.api.routes import error_response, error_status
from perseus.server.lifecycle.jobs import RequestFieldError
from perseus.server.store.storage import StorageFault

BASE = "http://planner:7787"
PATH = "/v1/jobs/j"


def scripted(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(base_url=BASE, transport=httpx.MockTransport(handler))


def answer(status: int, body: Any = None, **headers: str) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.Response(status, content=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return scripted(handler)


def get(http: httpx.Client, **options: Any) -> httpx.Response:
    return call_planner(http, "GET", PATH, token="the-token", **options)


# ----------------------------------------------------------------------------- what is sent


def test_the_token_and_headers_are_sent_and_the_expected_answer_returned() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    http = scripted(handler)
    response = call_planner(
        http,
        "PUT",
        PATH,
        token="the-token",
        json={"a": 1},
        params={"rank": 2},
        headers={"If-None-Match": '"3"'},
        timeout=httpx.Timeout(7.0),
        expect=frozenset({204}),
    )
    assert response.status_code == 204
    call_planner(http, "GET", PATH, token=None, expect=frozenset({204}))
    sent, anonymous = seen
    assert sent.method == "PUT" and sent.url.path == PATH and dict(sent.url.params) == {"rank": "2"}
    assert sent.headers["Authorization"] == "Bearer the-token"
    assert sent.headers["If-None-Match"] == '"3"'
    assert json.loads(sent.content) == {"a": 1}
    assert sent.extensions["timeout"]["read"] == 7.0
    assert "Authorization" not in anonymous.headers


@pytest.mark.parametrize("status", [200, 302, 304])
def test_a_success_that_was_not_asked_for_is_garbage(status: int) -> None:
    with pytest.raises(PlannerUnavailable, match="not an answer this request can have"):
        get(answer(status, {}), expect=frozenset({201}))


# ----------------------------------------------------------------------------- errors


def _subclasses(cls: type[PerseusError]) -> list[type[PerseusError]]:
    """Every subclass of ``cls``, depth first."""
    found: list[type[PerseusError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_status_the_server_maps_comes_back_as_its_class() -> None:
    examples: dict[type[PerseusError], PerseusError] = {
        PlanNotReady: PlanNotReady("not ready yet", "planning"),
        RequestFieldError: RequestFieldError(("body", "rows", 3, "time_s"), "too slow"),
    }
    expected: dict[type[PerseusError], type[PerseusError]] = {
        RequestFieldError: RequestRejected,
        SolverTimeout: PlannerUnavailable,  # any 5xx
        PlanTooLarge: RequestRejected,  # the rank's own refusal: no server sends it
        StorageFault: PlannerUnavailable,  # a 503
    }
    mapped: set[str] = set()
    for cls in _subclasses(PerseusError):
        if issubclass(cls, AuthError):
            continue  # its status is its own, below
        exc = examples.get(cls) or cls(f"a {cls.__name__}")
        code = error_status(exc)
        if code == 400:
            continue  # not in the server's table
        mapped.add(cls.__name__)
        response = error_response(exc)
        body = json.loads(bytes(response.body))
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        with pytest.raises(PerseusError) as raised:
            get(answer(code, body, **headers))
        assert type(raised.value) is expected.get(cls, cls), cls
    assert mapped >= {  # the server's table, at least
        "JobNotFound", "PlanNotReady", "JobStateError", "PlanError", "RequestFieldError",
        "ProfileError", "ScheduleError", "PolicyError", "InfeasibleDeadline",
        "PlanningTooLarge", "SolverTimeout",
    }  # fmt: skip
    for code in (401, 403):
        response = error_response(AuthError("no", code))
        with pytest.raises(AuthError) as auth:
            get(answer(code, json.loads(bytes(response.body))))
        assert auth.value.status_code == code


def test_not_ready_carries_state_and_retry_after() -> None:
    http = answer(
        409,
        {
            "detail": "not ready yet: job x is planning",
            "error": "PlanNotReady",
            "state": "planning",
        },
        **{"Retry-After": "2"},
    )
    with pytest.raises(PlanNotReady) as raised:
        get(http)
    assert raised.value.state == "planning"
    assert raised.value.retry_after_s == 2.0
    assert retryable(raised.value)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (503, {"detail": "the exact solve ran out of time", "error": "SolverTimeout"}),
        (500, b"Internal Server Error"),
        (502, b"<html>bad gateway</html>"),
    ],
)
def test_5xx_is_unavailable(status: int, body: Any) -> None:
    with pytest.raises(PlannerUnavailable, match=f"HTTP {status}") as raised:
        get(answer(status, body))
    assert retryable(raised.value)


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
        httpx.RemoteProtocolError("server disconnected"),
    ],
)
def test_transport_errors_are_unavailable_from_the_original(error: httpx.TransportError) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    with pytest.raises(PlannerUnavailable, match="unreachable") as raised:
        get(scripted(handler))
    assert raised.value.__cause__ is error
    assert "http://planner:7787" in str(raised.value)
    assert "the-token" not in str(raised.value)


@pytest.mark.parametrize(
    ("status", "body", "what"),
    [
        (200, b"<html>hello</html>", "not a JobView"),
        (200, {"job_id": "j"}, "not a JobView"),
        (404, b"<html>not found</html>", "not a planner error"),
        (400, {"message": "who knows"}, "not a planner error"),
        (422, {"detail": [{"where": 1}], "error": "ValidationError"}, "not a planner error"),
    ],
)
def test_garbage_is_unavailable(status: int, body: Any, what: str) -> None:
    with pytest.raises(PlannerUnavailable, match="garbage") as raised:
        parse_reply(JobView, get(answer(status, body)))
    assert what in str(raised.value)


def test_an_answer_that_cannot_be_decoded_is_unavailable_not_a_foreign_error() -> None:
    # A proxy that says gzip and sends HTML: httpx raises DecodingError, which is no
    # TransportError; it must still reach the rank's threads as a retryable PlannerUnavailable.
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"Content-Encoding": "gzip"}, stream=httpx.ByteStream(b"<html>")
        )

    for max_bytes in (None, 1 << 20):  # read whole, or streamed and bounded
        with pytest.raises(PlannerUnavailable, match="garbage") as raised:
            get(scripted(handler), max_bytes=max_bytes)
        assert isinstance(raised.value.__cause__, httpx.DecodingError)
        assert retryable(raised.value)


def test_auth_and_unknown_job() -> None:
    for status in (401, 403):
        with pytest.raises(AuthError) as raised:
            get(answer(status, {"detail": "the token", "error": "AuthError"}))
        assert raised.value.status_code == status
        assert not retryable(raised.value)
    with pytest.raises(JobNotFound, match="no job"):
        get(answer(404, {"detail": "no job 'x'", "error": "JobNotFound"}))


def test_validation_errors_name_their_fields() -> None:
    detail = [
        {
            "loc": ["body", "rows", 3, "time_s"],
            "msg": "Input should be greater than 0",
            "type": "x",
        },
        {"loc": ["body", "stage"], "msg": "Field required", "type": "missing"},
    ]
    with pytest.raises(RequestRejected) as raised:
        get(answer(422, {"detail": detail, "error": "ValidationError"}))
    assert str(raised.value) == (
        "body.rows.3.time_s: Input should be greater than 0; body.stage: Field required"
    )
    assert not retryable(raised.value)
    with pytest.raises(RequestRejected, match="exceeds") as too_large:
        get(answer(413, {"detail": "request body exceeds 1024 bytes", "error": "PayloadTooLarge"}))
    assert too_large.value.status_code == 413


@pytest.mark.parametrize("value", ["Wed, 21 Oct 2026 07:28:00 GMT", "-1", "inf", "nan", ""])
def test_a_retry_after_that_is_no_number_of_seconds_is_left_out(value: str) -> None:
    body = {"detail": "wait", "error": "PlanNotReady", "state": "profiling"}
    with pytest.raises(PlanNotReady) as raised:
        get(answer(409, body, **{"Retry-After": value}))
    assert raised.value.state == "profiling" and raised.value.retry_after_s is None


def test_not_ready_without_a_state_is_still_a_state_error() -> None:
    with pytest.raises(JobStateError) as raised:
        get(answer(409, {"detail": "wait", "error": "PlanNotReady"}))
    assert type(raised.value) is JobStateError


def test_an_error_the_rank_does_not_know_is_a_rejected_request() -> None:
    with pytest.raises(RequestRejected, match=r"^new rules$") as raised:
        get(answer(400, {"detail": "new rules", "error": "SomethingNew"}))
    assert raised.value.status_code == 400


# ----------------------------------------------------------------------------- bounded reads


def test_a_plan_longer_than_allowed_by_its_length_is_refused_unread() -> None:
    body = b"x" * 5000
    with pytest.raises(
        PlanTooLarge, match="5,000 bytes, more than this rank takes \\(4,096\\)"
    ) as raised:
        get(answer(200, body, ETag='W/"7"'), max_bytes=4096)
    assert (raised.value.version, raised.value.size_bytes) == (7, 5000)


def test_a_streamed_plan_longer_than_allowed_is_refused_once_the_limit_is_read() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        chunks = [b"y" * 1000] * 10  # no Content-Length: a chunked answer
        return httpx.Response(
            200, stream=httpx.ByteStream(b"".join(chunks)), headers={"ETag": "junk"}
        )

    with pytest.raises(PlanTooLarge, match="more than 4,096 bytes") as raised:
        get(scripted(handler), max_bytes=4096)
    assert raised.value.version is None and raised.value.size_bytes > 4096


def test_an_answer_within_the_bound_is_read_whole_and_decoded() -> None:
    body = json.dumps({"plan": list(range(100))}).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=gzip.compress(body), headers={"Content-Encoding": "gzip"}
        )

    response = get(scripted(handler), max_bytes=len(body))
    assert response.content == body and response.json() == {"plan": list(range(100))}
    assert "Content-Encoding" not in response.headers  # it describes the wire, not the body
    with pytest.raises(PlanTooLarge):
        get(scripted(handler), max_bytes=len(body) - 1)


def test_a_long_error_is_bounded_too_and_still_mapped() -> None:
    detail = "no job " + "x" * 100
    with pytest.raises(JobNotFound, match=detail):
        get(answer(404, {"detail": detail, "error": "JobNotFound"}), max_bytes=10)


# ----------------------------------------------------------------------------- replies


def test_parse_reply_names_the_field_that_is_wrong() -> None:
    with pytest.raises(PlannerUnavailable) as raised:
        parse_reply(JobView, get(answer(200, {"job_id": 1})))
    assert str(raised.value).startswith(f"GET {PATH}: the server answered garbage (HTTP 200): ")
    assert "not a JobView: job_id:" in str(raised.value)


def test_a_reply_that_does_not_parse_is_an_answer_not_understood() -> None:
    with pytest.raises(AnswerNotUnderstood, match="not a PlanResponse: version:"):
        parse_reply(PlanResponse, get(answer(200, {"job_id": "j", "version": "two"})))


def test_fields_a_newer_server_adds_are_ignored_at_every_depth() -> None:
    plan = {
        "job_id": "j",
        "version": 2,
        "stage": 0,
        "time_s": 1.5,
        "energy_j": 300.0,
        "instructions": [
            {"instruction": "forward", "microbatch": 0, "frequency_mhz": 1410, "power_w": 250.0},
            {"instruction": "backward_input", "microbatch": 0, "frequency_mhz": 1200},
        ],
        "planned_from_s": 1.7e9,  # a field this client has never heard of
        "hints": {"nested": [1, 2]},
    }
    parsed = parse_reply(PlanResponse, get(answer(200, plan)))
    assert parsed.version == 2 and len(parsed.instructions) == 2
    assert parsed.instructions[1].instruction == "backward_input"
    assert "planned_from_s" not in parsed.model_dump()
    # the model itself stays strict: what the server validates requests with is unchanged
    assert PlanResponse.model_config["extra"] == "forbid"
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        PlanResponse.model_validate(plan)


def test_an_error_body_with_fields_this_client_does_not_know_is_still_mapped() -> None:
    with pytest.raises(JobNotFound, match="no job 'x'"):
        get(answer(404, {"detail": "no job 'x'", "error": "JobNotFound", "hint": "list jobs"}))
    body = {
        "detail": [{"loc": ["body", "rank"], "msg": "too big", "type": "x", "url": "u"}],
        "error": "ValidationError",
        "request_id": "r1",
    }
    with pytest.raises(RequestRejected, match="rank: too big"):
        get(answer(422, body))


@given(st.binary(max_size=600))
def test_a_shown_body_is_its_start_quoted(content: bytes) -> None:
    shown = shown_body(content)
    assert shown.endswith(" ...") == (len(content) > 200)
    assert shown.startswith(("'", '"'))
    assert len(shown) <= 4 * 200 + 10  # escaped at most four characters a byte


def test_garbage_is_unavailable_and_retryable() -> None:
    error = garbage_error("GET /x", 200, "not JSON")
    assert isinstance(error, PlannerUnavailable) and retryable(error)
    assert str(error) == "GET /x: the server answered garbage (HTTP 200): not JSON"
