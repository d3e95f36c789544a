"""Tokens (perseus.server.api.auth): the admin token and each job's own."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from perseus.core.errors import AuthError
from perseus.server.api.auth import (
    bearer_token,
    check_admin,
    check_job_token,
    hash_token,
    new_token,
)
from perseus.server.settings import Settings

from .conftest import create_job


def test_job_token_is_required_and_scoped(client: TestClient) -> None:
    a = create_job(client)
    b = create_job(client)
    assert client.get(a.url()).status_code == 401
    assert client.get(a.url()).headers["www-authenticate"] == "Bearer"
    assert client.get(a.url(), headers=b.auth).status_code == 403
    assert client.get(a.url(), headers={"Authorization": "Bearer nonsense"}).status_code == 403
    assert client.get(a.url(), headers={"Authorization": "Basic abc"}).status_code == 401
    assert client.get(a.url(), headers=a.auth).status_code == 200
    assert client.delete(a.url(), headers=b.auth).status_code == 403
    for method, suffix in (("post", "/ranks"), ("put", "/policy"), ("get", "/plan?rank=0")):
        r = client.request(method, a.url(suffix), headers=b.auth, json={})
        assert r.status_code == 403, (method, suffix)


def test_admin_token_guards_create_list_delete(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"admin_token": SecretStr("s3cret")}))
    admin = {"Authorization": "Bearer s3cret"}
    body = {
        "schedule": "1f1b",
        "stages": 2,
        "microbatches": 2,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    assert client.post("/v1/jobs", json=body).status_code == 401
    assert (
        client.post("/v1/jobs", json=body, headers={"Authorization": "Bearer no"}).status_code
        == 403
    )
    job = create_job(client, headers=admin, stages=2, microbatches=2, data_parallel=1)
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers=job.auth).status_code == 403
    assert len(client.get("/v1/jobs", headers=admin).json()["jobs"]) == 1
    assert client.get(job.url(), headers=admin).status_code == 200  # admin may read any job
    assert client.delete(job.url(), headers=job.auth).status_code == 403
    assert client.delete(job.url(), headers=admin).status_code == 204


def test_tokens_are_stored_hashed(client: TestClient, sqlite_url: str) -> None:
    job = create_job(client)
    path = sqlite_url.removeprefix("sqlite:///")
    with open(path, "rb") as f:
        assert job.token.encode() not in f.read()


# ----------------------------------------------------------------------------- the checks


def test_new_tokens_are_long_random_and_url_safe() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{43}", t) for t in tokens)


def test_the_stored_hash_is_the_tokens_sha256() -> None:
    assert hash_token("abc") == hashlib.sha256(b"abc").hexdigest()
    assert hash_token("\udcff")  # a lone surrogate from a latin-1 header still hashes


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer s3cret", "s3cret"),
        ("bearer  s3cret ", "s3cret"),
        ("Basic abc", None),
        ("Bearer ", None),
        ("Bearer", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_tokens_are_read_from_the_header(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_without_an_admin_token_anyone_is_admin() -> None:
    check_admin(None, None)
    check_admin("anything", None)


def test_the_admin_check_answers_401_without_and_403_with_a_wrong_token() -> None:
    admin = hash_token("admin")
    check_admin("admin", admin)
    for token, status in ((None, 401), ("other", 403)):
        with pytest.raises(AuthError) as caught:
            check_admin(token, admin)
        assert caught.value.status_code == status


def test_a_job_takes_its_own_token_or_the_admin_token() -> None:
    job, admin = hash_token("job"), hash_token("admin")
    check_job_token("job", job, None)
    check_job_token("admin", job, admin)
    for token, admin_hash, status in (
        (None, admin, 401),
        ("another job's", admin, 403),
        ("admin", None, 403),  # no admin token configured: just a wrong one
    ):
        with pytest.raises(AuthError) as caught:
            check_job_token(token, job, admin_hash)
        assert caught.value.status_code == status
