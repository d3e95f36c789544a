"""A zeusd for tests: zeusd 0.5's HTTP API over fake GPUs, on a Unix socket or TCP.

What it answers follows zeusd 0.5's source (ml-energy/zeus, ``zeusd/src/``): ``routes/gpu.rs``
(write routes take ``gpu_ids``, their fields and ``block`` as query parameters into structs
with ``#[serde(deny_unknown_fields)]``; ``gpu_ids`` is a comma-separated list, entries that are
no number are dropped and an empty list answers 400 ``{"error": ...}``; an index past the GPUs
answers ``ZeusdError::GpuNotFoundError``; NVML errors of a blocking request come back per GPU
as 500 ``{"errors": {"0": "..."}}``), ``error.rs`` (actix's default error answer: the error's
words as ``text/plain``, ``GpuNotFoundError`` 400), ``auth.rs`` (a route of a group not enabled
answers 404 ``{"error": "API group '...' is not enabled on this server."}`` before anything
else; with a signing key every route but ``/discover`` and ``/time`` needs ``Authorization:
Bearer <JWT>``, HS256, claims ``sub``, ``scopes``, ``exp``: 401 without or with a bad one, 403
for a missing scope), ``config.rs`` (groups ``gpu-control``, ``gpu-read``, ``cpu-read``), and
``routes/server.rs`` with Zeus's client (``GET /discover``). actix answers a malformed query
400 ``Query deserialize error: <serde's words>``, and an unknown route 404 with no body.

Only what perseus uses is served: ``/gpu/set_gpu_locked_clocks``,
``/gpu/reset_gpu_locked_clocks``, ``/gpu/get_cumulative_energy``, ``/discover``, ``/time``.
Each GPU has a worker thread that runs its commands in order, as zeusd's per-GPU management
tasks do: ``block=false`` answers once the command is queued. A fake GPU locks exact clocks
only, so a range (``min_clock_mhz != max_clock_mhz``) fails as NVML's invalid argument would.
With ``aggregate_status=True`` per-GPU errors answer with the worst status instead of 500,
as zeusd's later ``aggregate_error_response`` does (NVML's no-permission: 403).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import queue
import socketserver
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from perseus.client.gpu.control import GpuControl
from perseus.client.gpu.zeusd import ZeusdEndpoint
from perseus.core.errors import GpuControlError

GROUPS = ("gpu-control", "gpu-read", "cpu-read")
# nvml-wrapper's words for the NVML errors a fake GPU can meet (perseus does not parse them).
NVML_NO_PERMISSION = "NVML error: The current user does not have permission for operation"
NVML_INVALID_ARG = "NVML error: A supplied argument is invalid"

# The query structs of the routes served: field -> type ("u32", "bool", "str"; "str?" optional).
WRITE_FIELDS = {
    "/gpu/set_gpu_locked_clocks": {
        "gpu_ids": "str",
        "min_clock_mhz": "u32",
        "max_clock_mhz": "u32",
        "block": "bool",
    },
    "/gpu/reset_gpu_locked_clocks": {"gpu_ids": "str", "block": "bool"},
}
READ_FIELDS = {"/gpu/get_cumulative_energy": {"gpu_ids": "str?"}}

Answer = tuple[int, dict[str, str], bytes]


def issue_token(key: bytes, user: str, scopes: Sequence[str], expires_at: int | None) -> str:
    """A token like ``zeusd token issue``'s: HS256 JWT, claims ``sub``, ``scopes``, ``exp``."""
    claims: dict[str, Any] = {"sub": user, "scopes": list(scopes)}
    if expires_at is not None:
        claims["exp"] = expires_at
    header = _b64(json.dumps({"typ": "JWT", "alg": "HS256"}).encode())
    payload = _b64(json.dumps(claims).encode())
    signature = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class FakeZeusd:
    """zeusd over ``gpus`` (index = position), on ``socket_path`` or TCP on loopback.

    Args:
        gpus: The GPUs it manages (fake ones: it calls their ``lock_clock``/``reset_clock``).
        socket_path: Listen on this Unix socket; None: TCP on 127.0.0.1, a free port.
        enable: The API groups enabled (``--enable``).
        signing_key: Require tokens signed with it (``--signing-key-path``); None: no auth.
        nvml_refuses: NVML refuses every change (zeusd without the right to change clocks).
        aggregate_status: Per-GPU errors answer the worst status instead of 500.
    """

    def __init__(
        self,
        gpus: Sequence[GpuControl],
        *,
        socket_path: Path | None = None,
        enable: Sequence[str] = GROUPS,
        signing_key: bytes | None = None,
        nvml_refuses: bool = False,
        aggregate_status: bool = False,
    ) -> None:
        self.gpus = list(gpus)
        self.enable = tuple(enable)
        self.signing_key = signing_key
        self.nvml_refuses = nvml_refuses
        self.aggregate_status = aggregate_status
        self.requests: list[tuple[str, str, dict[str, str], int]] = []
        """Every request: method, path, query parameters, the status answered."""
        self.socket_path = socket_path
        self._queues: list[queue.Queue[Any]] = [queue.Queue() for _ in self.gpus]
        self._workers = [
            threading.Thread(target=self._work, args=(i,), daemon=True)
            for i in range(len(self.gpus))
        ]
        handler = _handler_for(self)
        self._server: socketserver.BaseServer
        if socket_path is not None:
            self._server = _UnixHttpServer(str(socket_path), handler)
            self.port = 0
        else:
            tcp = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            tcp.daemon_threads = True
            self._server = tcp
            self.port = tcp.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def endpoint(self, token: str | None = None) -> ZeusdEndpoint:
        """Where it listens, as perseus names it."""
        if self.socket_path is not None:
            return ZeusdEndpoint(socket_path=str(self.socket_path), token=token)
        return ZeusdEndpoint(socket_path=None, host="127.0.0.1", port=self.port, token=token)

    def environ(self, token: str | None = None) -> dict[str, str]:
        """Zeus's variables naming it."""
        env = (
            {"ZEUSD_SOCK_PATH": str(self.socket_path)}
            if self.socket_path is not None
            else {"ZEUSD_HOST_PORT": f"127.0.0.1:{self.port}"}
        )
        return env | ({"ZEUSD_TOKEN": token} if token else {})

    def __enter__(self) -> FakeZeusd:
        for worker in self._workers:
            worker.start()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        for q in self._queues:
            q.put(None)
        for worker in self._workers:
            worker.join(timeout=5)
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)

    # The API ---------------------------------------------------------------------------------

    def answer(self, method: str, target: str, headers: dict[str, str]) -> Answer:
        """The answer to one request."""
        parts = urlsplit(target)
        path, query = parts.path, parse_qsl(parts.query, keep_blank_values=True)
        status, extra, body = self._answer(method, path, query, headers)
        self.requests.append((method, path, dict(query), status))
        return status, extra, body

    def _answer(
        self, method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str]
    ) -> Answer:
        group = _group(path)
        if group is not None and group not in self.enable:
            return _json(404, {"error": f"API group '{group}' is not enabled on this server."})
        if self.signing_key is not None and path not in ("/discover", "/time"):
            refused = self._authorize(headers.get("authorization", ""), group)
            if refused is not None:
                return refused
        if method == "GET" and path == "/discover":
            return _json(
                200,
                {
                    "gpu_ids": list(range(len(self.gpus))),
                    "cpu_ids": [],
                    "dram_available": [],
                    "enabled_api_groups": list(self.enable),
                    "auth_required": self.signing_key is not None,
                },
            )
        if method == "GET" and path == "/time":
            return _json(200, {"timestamp_ms": int(time.time() * 1000)})
        if method == "POST" and path in WRITE_FIELDS:
            fields, error = _deserialize(query, WRITE_FIELDS[path])
            return error or self._write(path, fields)
        if method == "GET" and path in READ_FIELDS:
            fields, error = _deserialize(query, READ_FIELDS[path])
            return error or self._energy(fields.get("gpu_ids"))
        return 404, {}, b""

    def _authorize(self, header: str, group: str | None) -> Answer | None:
        assert self.signing_key is not None
        challenge = {"WWW-Authenticate": 'Bearer realm="zeusd"'}
        if not header.startswith("Bearer "):
            words = "Authentication required. Provide an Authorization: Bearer <token> header."
            status, _, body = _json(401, {"error": words})
            return status, challenge, body
        claims, reason = _verify(header.removeprefix("Bearer "), self.signing_key)
        if claims is None:
            status, _, body = _json(401, {"error": reason})
            return status, challenge, body
        scopes = claims.get("scopes", [])
        if group is not None and group not in scopes:
            listed = ", ".join(f"'{s}'" for s in scopes)
            return _json(
                403,
                {
                    "error": f"Token for user '{claims.get('sub')}' lacks required scope "
                    f"'{group}'. Token scopes: [{listed}]"
                },
            )
        return None

    def _write(self, path: str, fields: dict[str, Any]) -> Answer:
        ids = _gpu_ids(fields["gpu_ids"])
        if not ids:
            return _json(400, {"error": "gpu_ids must contain at least one GPU index"})
        for i in ids:
            if i >= len(self.gpus):
                return _text(400, f"GPU index {i} does not exist.")
        command = (
            ("set", fields["min_clock_mhz"], fields["max_clock_mhz"])
            if path == "/gpu/set_gpu_locked_clocks"
            else ("reset",)
        )
        if not fields["block"]:
            for i in ids:
                self._queues[i].put((command, None))
            return 200, {}, b""
        replies: dict[int, queue.Queue[str | None]] = {}
        for i in ids:
            replies[i] = queue.Queue()
            self._queues[i].put((command, replies[i]))
        errors = {str(i): error for i, r in replies.items() if (error := r.get()) is not None}
        if not errors:
            return 200, {}, b""
        status = 500
        if self.aggregate_status:
            status = max(403 if e == NVML_NO_PERMISSION else 400 for e in errors.values())
        return _json(status, {"errors": errors})

    def _energy(self, raw: str | None) -> Answer:
        ids = list(range(len(self.gpus))) if raw is None else _gpu_ids(raw)
        if not ids:
            return _json(400, {"error": "gpu_ids must contain at least one GPU index"})
        for i in ids:
            if i >= len(self.gpus):
                return _text(400, f"GPU index {i} does not exist.")
        return _json(200, {str(i): {"energy_mj": int(self.gpus[i].energy_j() * 1000)} for i in ids})

    def _work(self, index: int) -> None:
        """GPU ``index``'s management task: its commands, in order."""
        gpu = self.gpus[index]
        while (item := self._queues[index].get()) is not None:
            command, reply = item
            error: str | None = None
            if self.nvml_refuses:
                error = NVML_NO_PERMISSION
            elif command[0] == "reset":
                gpu.reset_clock()
            elif command[1] != command[2]:
                error = NVML_INVALID_ARG  # a fake GPU locks exact clocks only
            else:
                try:
                    gpu.lock_clock(command[1])
                except GpuControlError:
                    error = NVML_INVALID_ARG
            if reply is not None:
                reply.put(error)


def _group(path: str) -> str | None:
    if path.startswith(("/gpu/set_", "/gpu/reset_")):
        return "gpu-control"
    if path.startswith("/gpu/"):
        return "gpu-read"
    if path.startswith("/cpu/"):
        return "cpu-read"
    return None


def _verify(token: str, key: bytes) -> tuple[dict[str, Any] | None, str]:
    """The token's claims, or None and the words zeusd answers (jsonwebtoken's error kinds)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None, "Invalid token: InvalidToken"
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except ValueError:
        return None, "Invalid token: InvalidToken"
    if header.get("alg") != "HS256":
        return None, "Invalid token: InvalidAlgorithm"
    expected = hmac.new(key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(signature, expected):
        return None, "Invalid token: InvalidSignature"
    if "exp" in claims and claims["exp"] < time.time():
        return None, "Token has expired."
    return claims, ""


def _deserialize(
    query: list[tuple[str, str]], fields: dict[str, str]
) -> tuple[dict[str, Any], Answer | None]:
    """The query as serde_urlencoded reads it into a ``deny_unknown_fields`` struct."""
    values: dict[str, Any] = {}
    for name, text in query:
        if name not in fields:
            names = [f"`{f}`" for f in fields]
            expected = (
                f"expected {names[0]}"
                if len(names) == 1
                else f"expected {names[0]} or {names[1]}"
                if len(names) == 2
                else f"expected one of {', '.join(names)}"
            )
            return {}, _bad_query(f"unknown field `{name}`, {expected}")
        if name in values:
            return {}, _bad_query(f"duplicate field `{name}`")
        kind = fields[name].rstrip("?")
        if kind == "bool":
            if text not in ("true", "false"):
                return {}, _bad_query("provided string was not `true` or `false`")
            values[name] = text == "true"
        elif kind == "u32":
            if not text:
                return {}, _bad_query("cannot parse integer from empty string")
            if not (text.isascii() and text.lstrip("+").isdigit()):
                return {}, _bad_query("invalid digit found in string")
            if int(text) > 2**32 - 1:
                return {}, _bad_query("number too large to fit in target type")
            values[name] = int(text)
        else:
            values[name] = text
    for name, kind in fields.items():
        if name not in values and not kind.endswith("?"):
            return {}, _bad_query(f"missing field `{name}`")
    return values, None


def _gpu_ids(raw: str) -> list[int]:
    # zeusd's parse_gpu_ids: split on commas, trim, drop what is no number
    ids = []
    for part in raw.split(","):
        part = part.strip()
        if part.isascii() and part.lstrip("+").isdigit():
            ids.append(int(part))
    return ids


def _bad_query(words: str) -> Answer:
    return _text(400, f"Query deserialize error: {words}")


def _json(status: int, body: object) -> Answer:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


def _text(status: int, words: str) -> Answer:
    return status, {"Content-Type": "text/plain; charset=utf-8"}, words.encode()


class _UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _handler_for(zeusd: FakeZeusd) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, extra, body = zeusd.answer(self.command, self.path, headers)
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a Unix socket has no client address to log

    return Handler
