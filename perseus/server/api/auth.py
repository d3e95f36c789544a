"""Tokens: the admin token (from settings) and one secret token per job.

Job tokens are random (256 bits), so a plain SHA-256 is a sound way to store them: the
store never holds a token, and comparisons run in constant time on the digests.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from perseus.core.errors import AuthError

__all__ = ["bearer_token", "check_admin", "check_job_token", "hash_token", "new_token"]


def new_token() -> str:
    """A fresh job token (43 URL-safe characters)."""
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token, as stored."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _matches(token: str, token_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), token_hash)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def check_admin(token: str | None, admin_token_hash: str | None) -> None:
    """Allow job creation, listing and deletion.

    Args:
        token: the caller's bearer token.
        admin_token_hash: hash of the configured admin token; None means no admin token
            is configured and anyone may proceed.

    Raises:
        AuthError: 401 without a token, 403 with a wrong one.
    """
    if admin_token_hash is None:
        return
    if token is None:
        raise AuthError("this server needs the admin token (Authorization: Bearer ...)", 401)
    if not _matches(token, admin_token_hash):
        raise AuthError("the token is not the admin token", 403)


def check_job_token(token: str | None, token_hash: str, admin_token_hash: str | None) -> None:
    """Allow a request under one job: its own token or the admin token.

    Raises:
        AuthError: 401 without a token, 403 with another job's token or a wrong one.
    """
    if token is None:
        raise AuthError("this job needs its token (Authorization: Bearer ...)", 401)
    if _matches(token, token_hash):
        return
    if admin_token_hash is not None and _matches(token, admin_token_hash):
        return
    raise AuthError("the token does not belong to this job", 403)
