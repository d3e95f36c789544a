"""GPU clocks through zeusd, Zeus's privileged daemon: for ranks without root.

Setting clocks (``nvmlDeviceSetGpuLockedClocks``) needs root or ``CAP_SYS_ADMIN``, which most
clusters do not give training containers. zeusd runs beside them with that right and sets
clocks on request, over a Unix socket or TCP. :class:`ZeusdGpu` sends the two writes perseus
needs there and reads everything else (supported clocks, the clock in effect, energy, power)
through NVML, which needs no privilege.

The requests and answers are zeusd 0.5's (``zeusd/src/routes/gpu.rs``): query parameters, not
JSON bodies, unknown parameters refused, ``block=true`` to wait for NVML's answer::

    POST /gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=1410&max_clock_mhz=1410&block=true
    POST /gpu/reset_gpu_locked_clocks?gpu_ids=0&block=true

An empty 200 is success. Refusals come as ``{"error": "..."}`` (a group not enabled: 404; no or
a bad token: 401; a token without the ``gpu-control`` scope: 403; no GPU index: 400), as
``{"errors": {"0": "NVML error: ..."}}`` (NVML failed on a GPU), or as plain text (a malformed
query, a GPU index zeusd does not have: 400). Every refusal and every transport error is
translated where it enters, in :meth:`ZeusdDaemon._request`, into
:class:`~perseus.core.errors.ZeusdRefused` or :class:`~perseus.core.errors.ZeusdUnavailable`.

Where zeusd is (Zeus's own variables, so one setting serves Zeus and perseus):

- ``ZEUSD_SOCK_PATH``: zeusd's Unix socket (zeusd's default is ``/run/zeusd/zeusd.sock``);
- ``ZEUSD_HOST_PORT``: ``host:port`` (or ``host``, port 4938) of a zeusd in TCP mode;
- ``ZEUSD_TOKEN``: a token from ``zeusd token issue`` where zeusd requires one, sent as
  ``Authorization: Bearer <token>``.

GPU indices are NVML's as zeusd sees them: the rank's NVML index must name the same GPU (a
container that sees only some of the node's GPUs numbers them differently).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from perseus.client.gpu.nvml import NvmlGpu, validate_clock_mhz
from perseus.core import settings as variables
from perseus.core.errors import GpuControlError, ZeusdRefused, ZeusdUnavailable

if TYPE_CHECKING:
    from perseus.client.gpu.control import GpuControl

__all__ = [
    "DEFAULT_SOCKET_PATH",
    "DEFAULT_TCP_PORT",
    "TIMEOUT",
    "ZeusdDaemon",
    "ZeusdEndpoint",
    "ZeusdGpu",
    "open_zeusd_gpu",
    "reset_clocks_through_zeusd",
]

log = logging.getLogger("perseus.client")

#: zeusd 0.5's default ``--socket-path`` (``zeusd serve``), used when neither variable is set.
DEFAULT_SOCKET_PATH = "/run/zeusd/zeusd.sock"
#: zeusd's default TCP port (``--tcp-bind-address 127.0.0.1:4938``).
DEFAULT_TCP_PORT = 4938
#: zeusd answers a clock change within milliseconds (one NVML call); a daemon that takes longer
#: than this is treated as unreachable, so a hung daemon never holds the clock thread for long.
TIMEOUT = httpx.Timeout(1.0, connect=0.5)

SET_LOCKED_CLOCKS = "/gpu/set_gpu_locked_clocks"
RESET_LOCKED_CLOCKS = "/gpu/reset_gpu_locked_clocks"
DISCOVER = "/discover"

_START_HINT = (
    "is zeusd running (`sudo zeusd serve --socket-path /run/zeusd/zeusd.sock` or its systemd "
    "unit), and is its socket mounted into this container?"
)


# Where zeusd is -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ZeusdEndpoint:
    """Where zeusd listens, and the token to show it.

    Attributes:
        socket_path: zeusd's Unix socket; None for TCP.
        host: zeusd's host in TCP mode; None for a socket.
        port: zeusd's TCP port.
        token: A JWT from ``zeusd token issue``, or None where zeusd requires none.
    """

    socket_path: str | None = DEFAULT_SOCKET_PATH
    host: str | None = None
    port: int = DEFAULT_TCP_PORT
    token: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ZeusdEndpoint:
        """The endpoint Zeus's variables name: ``ZEUSD_SOCK_PATH`` first, then
        ``ZEUSD_HOST_PORT``, else zeusd's default socket; ``ZEUSD_TOKEN`` as the token.

        Raises:
            GpuControlError: ``ZEUSD_HOST_PORT`` is malformed (the message quotes it).
        """
        token = variables.ZEUSD_TOKEN.read(environ)
        socket_path = variables.ZEUSD_SOCK_PATH.read(environ) or ""
        if socket_path:
            return cls(socket_path=socket_path, token=token)
        host_port = variables.ZEUSD_HOST_PORT.read(environ) or ""
        if not host_port:
            return cls(token=token)
        host, port = _host_port(host_port)
        return cls(socket_path=None, host=host, port=port, token=token)

    @property
    def where(self) -> str:
        """The endpoint in words, for messages: ``unix:/run/zeusd/zeusd.sock``, ``node1:4938``."""
        if self.socket_path is not None:
            return f"unix:{self.socket_path}"
        return f"{self._url_host}:{self.port}"

    @property
    def _url_host(self) -> str:
        host = self.host or "localhost"
        return f"[{host}]" if ":" in host else host  # an IPv6 address

    def open_client(self, timeout: httpx.Timeout = TIMEOUT) -> httpx.Client:
        """An HTTP client for zeusd: its transport (socket or TCP), token and timeouts.

        Proxy variables are ignored (``trust_env=False``): zeusd is on this node, and
        ``HTTP_PROXY``, often set on clusters, would send its requests elsewhere.
        """
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.socket_path is not None:
            transport = httpx.HTTPTransport(uds=self.socket_path, retries=0)
            base_url = "http://localhost"
        else:
            transport = httpx.HTTPTransport(retries=0)
            base_url = f"http://{self._url_host}:{self.port}"
        return httpx.Client(
            base_url=base_url,
            transport=transport,
            headers=headers,
            timeout=timeout,
            trust_env=False,
        )


def _host_port(text: str) -> tuple[str, int]:
    """``host:port`` or ``host`` (port 4938), as Zeus reads ``ZEUSD_HOST_PORT``."""
    host, sep, port_text = text.rpartition(":")
    if not sep or "]" in port_text:  # no port, or a bare bracketed IPv6 address
        host, port_text = text, str(DEFAULT_TCP_PORT)
    host = host.strip().removeprefix("[").removesuffix("]")
    valid = port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536
    port = int(port_text) if valid else 0
    if not host or port == 0 or any(c.isspace() or c in "/?#@" for c in host):
        raise GpuControlError(
            f"ZEUSD_HOST_PORT: expected host:port (or host, port {DEFAULT_TCP_PORT}), got {text!r}"
        )
    return host, port


# The daemon -----------------------------------------------------------------------------------


class ZeusdDaemon:
    """zeusd's GPU clock routes; thread-safe.

    Resets go over an HTTP client of their own: the rank's signal handlers reset the clock
    on the main thread, which may be in the middle of a clock change, and a client whose
    connection pool that change holds would wait on it for ever.

    Args:
        endpoint: Where zeusd listens.
    """

    def __init__(self, endpoint: ZeusdEndpoint) -> None:
        self.endpoint = endpoint
        self._http = endpoint.open_client()
        self._reset_http = endpoint.open_client()

    def close(self) -> None:
        """Close the HTTP clients."""
        self._http.close()
        self._reset_http.close()

    def set_gpu_locked_clocks(self, index: int, min_clock_mhz: int, max_clock_mhz: int) -> None:
        """Lock GPU ``index``'s SM clock between the two clocks; returns once NVML has.

        Raises:
            ZeusdUnavailable: zeusd cannot be reached or did not answer in time.
            ZeusdRefused: zeusd answered with an error.
        """
        self._request(
            SET_LOCKED_CLOCKS,
            {
                "gpu_ids": str(index),
                "min_clock_mhz": str(min_clock_mhz),
                "max_clock_mhz": str(max_clock_mhz),
                "block": "true",
            },
        )

    def reset_gpu_locked_clocks(self, index: int) -> None:
        """Remove GPU ``index``'s SM clock lock; returns once NVML has.

        Raises:
            ZeusdUnavailable: zeusd cannot be reached or did not answer in time.
            ZeusdRefused: zeusd answered with an error.
        """
        self._request(
            RESET_LOCKED_CLOCKS, {"gpu_ids": str(index), "block": "true"}, http=self._reset_http
        )

    def gpu_ids(self) -> tuple[int, ...]:
        """The GPUs zeusd manages (``GET /discover``), ascending.

        Raises:
            ZeusdUnavailable: zeusd cannot be reached or did not answer in time.
            ZeusdRefused: zeusd answered with an error, or with no GPU list.
        """
        reply = self._request(DISCOVER, None, method="GET", http=self._reset_http)
        try:
            body = reply.json()
            # zeusd 0.5 lists "gpu_ids"; later versions "gpus": [{"id": 0, ...}, ...].
            ids = body["gpu_ids"] if "gpu_ids" in body else [gpu["id"] for gpu in body["gpus"]]
            return tuple(sorted(int(i) for i in ids))
        except (ValueError, TypeError, KeyError) as err:
            raise ZeusdRefused(
                f"zeusd at {self.endpoint.where}: GET {DISCOVER} answered no GPU list: "
                f"{_excerpt(reply.text)}",
                reply.status_code,
            ) from err

    def _request(
        self,
        path: str,
        params: dict[str, str] | None,
        *,
        method: str = "POST",
        http: httpx.Client | None = None,
    ) -> httpx.Response:
        """One request; the one place httpx errors and zeusd's refusals are translated."""
        with _translated(self.endpoint, f"{method} {path}"):
            reply = (http or self._http).request(method, path, params=params)
        if reply.status_code != 200:
            raise _refusal(self.endpoint, method, path, reply)
        return reply


@contextlib.contextmanager
def _translated(endpoint: ZeusdEndpoint, request: str) -> Iterator[None]:
    """httpx's errors become :class:`ZeusdUnavailable`, raised from the original."""
    try:
        yield
    except httpx.TimeoutException as err:
        raise ZeusdUnavailable(
            f"zeusd at {endpoint.where} did not answer {request} within "
            f"{TIMEOUT.read:g} s ({type(err).__name__})"
        ) from err
    except httpx.HTTPError as err:
        reason = str(err) or type(err).__name__
        raise ZeusdUnavailable(
            f"zeusd at {endpoint.where} cannot be reached ({request}: {reason}); {_START_HINT}"
        ) from err


def _refusal(
    endpoint: ZeusdEndpoint, method: str, path: str, reply: httpx.Response
) -> ZeusdRefused:
    """zeusd's error answer as :class:`ZeusdRefused`: its words, and what fixes it."""
    status = reply.status_code
    said, structured = _said(reply)
    hint = ""
    if status == 401:
        hint = (
            "zeusd requires a token: set ZEUSD_TOKEN to one issued by `zeusd token issue "
            "--user USER --scope gpu-control --expires 30d`"
            if endpoint.token is None
            else "ZEUSD_TOKEN is not accepted (expired, or signed with another key): "
            "issue a new one with `zeusd token issue`"
        )
    elif status == 403 and "scope" in said:
        hint = "the token needs the gpu-control scope (`zeusd token issue --scope gpu-control`)"
    elif status == 403 or "permission" in said.lower():
        hint = (
            "zeusd itself may not change clocks: run it as root (in a container with "
            "`--cap-add SYS_ADMIN`)"
        )
    elif status == 404 and structured:
        hint = "start zeusd with the gpu-control group enabled (`--enable gpu-control,gpu-read`)"
    elif status == 404:
        hint = f"this zeusd has no {path}: perseus speaks zeusd 0.5's API, upgrade zeusd"
    elif "does not exist" in said:
        hint = "zeusd numbers GPUs as the node's NVML does: set PERSEUS_GPU_INDEX to that index"
    text = f"zeusd at {endpoint.where} refused {method} {path} ({status}): {said}"
    return ZeusdRefused(f"{text}; {hint}" if hint else text, status)


def _said(reply: httpx.Response) -> tuple[str, bool]:
    """What zeusd said in an error answer, and whether it said it in its JSON shape."""
    try:
        body: Any = json.loads(reply.text)
    except ValueError:
        return (_excerpt(reply.text) or reply.reason_phrase or "no reason given"), False
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"], True
    if isinstance(body, dict) and isinstance(body.get("errors"), dict):
        per_gpu = sorted(body["errors"].items(), key=lambda item: str(item[0]))
        return "; ".join(f"GPU {gpu}: {message}" for gpu, message in per_gpu), True
    return _excerpt(reply.text), False


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The GPU --------------------------------------------------------------------------------------


class ZeusdGpu:
    """One GPU: clock changes through zeusd, everything else read through ``reader`` (NVML).

    Implements :class:`~perseus.client.gpu.control.GpuControl`. The reader's optional
    ``work_observer`` (a simulated GPU's) is this GPU's too.

    Args:
        index: The GPU's index as zeusd numbers it (NVML's on the node).
        daemon: zeusd.
        reader: Reads the same GPU (:class:`~perseus.client.gpu.nvml.NvmlGpu`); never asked to
            change clocks.
    """

    def __init__(self, index: int, daemon: ZeusdDaemon, reader: GpuControl) -> None:
        self._index = index
        self._daemon = daemon
        self._reader = reader
        self._can_set = True

    def __enter__(self) -> ZeusdGpu:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP client and the reader (where it has ``close``)."""
        self._daemon.close()
        closing = getattr(self._reader, "close", None)
        if closing is not None:
            closing()

    @property
    def daemon(self) -> ZeusdDaemon:
        """zeusd, as this GPU talks to it."""
        return self._daemon

    @property
    def index(self) -> int:
        """The GPU's index."""
        return self._index

    @property
    def name(self) -> str:
        """The GPU's product name (read through the reader)."""
        return self._reader.name

    @property
    def can_set_clocks(self) -> bool:
        """True until zeusd refused a change for a reason that will not pass by itself."""
        return self._can_set

    @property
    def work_observer(self) -> object:
        """The reader's work observer, if it has one (a simulated GPU does, NVML does not)."""
        return getattr(self._reader, "work_observer", None)

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """SM clocks supported at the highest memory clock, descending (through the reader)."""
        return self._reader.supported_clocks_mhz()

    def default_clock_mhz(self) -> int:
        """The highest supported SM clock."""
        return self._reader.default_clock_mhz()

    def current_clock_mhz(self) -> int:
        """The SM clock now (through the reader)."""
        return self._reader.current_clock_mhz()

    def applied_clock_mhz(self) -> int:
        """The SM clock in effect now (through the reader)."""
        return self._reader.applied_clock_mhz()

    def lock_clock(self, frequency_mhz: int) -> None:
        """Lock the SM clock to ``frequency_mhz`` through zeusd (minimum = maximum).

        Raises:
            GpuControlError: The clock is not supported (nothing is sent).
            ZeusdUnavailable: zeusd cannot be reached or did not answer in time.
            ZeusdRefused: zeusd refused; for a missing right (token, scope, group, zeusd's own
                permission) :attr:`can_set_clocks` becomes False.
        """
        f = validate_clock_mhz(frequency_mhz, self.supported_clocks_mhz(), index=self._index)
        self._write(self._daemon.set_gpu_locked_clocks, self._index, f, f)

    def reset_clock(self) -> None:
        """Remove the SM clock lock through zeusd.

        Raises:
            ZeusdUnavailable: zeusd cannot be reached or did not answer in time.
            ZeusdRefused: zeusd refused (see :meth:`lock_clock`).
        """
        self._write(self._daemon.reset_gpu_locked_clocks, self._index)

    def energy_j(self) -> float:
        """The GPU's energy counter, in joules (through the reader)."""
        return self._reader.energy_j()

    def power_w(self) -> float:
        """The GPU's power reading, in watts (through the reader)."""
        return self._reader.power_w()

    def _write(self, request: Any, *args: int) -> None:
        try:
            request(*args)
        except ZeusdRefused as err:
            if err.status_code in (401, 403, 404):
                self._can_set = False
            raise


# Entry points ---------------------------------------------------------------------------------


def open_zeusd_gpu(
    index: int, endpoint: ZeusdEndpoint, *, reader: GpuControl | None = None
) -> ZeusdGpu:
    """Open GPU ``index`` with clocks through zeusd at ``endpoint``.

    zeusd is asked first to reset the GPU's clock lock: a request that changes nothing the
    rank has set yet, and shows at once whether zeusd is there and lets this process change
    clocks (token, scope, enabled groups, zeusd's own permission, the GPU index).

    Args:
        index: The GPU's NVML index (zeusd's numbering).
        endpoint: Where zeusd listens.
        reader: What reads the GPU; None: :class:`~perseus.client.gpu.nvml.NvmlGpu` ``(index)``.

    Returns:
        The GPU.

    Raises:
        ZeusdUnavailable: zeusd cannot be reached.
        ZeusdRefused: zeusd refused the reset (the message says what fixes it).
        GpuControlError: NVML cannot read the GPU.
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise GpuControlError(f"GPU index must be an integer >= 0, got {index!r}")
    daemon = ZeusdDaemon(endpoint)
    try:
        daemon.reset_gpu_locked_clocks(index)
        gpu = ZeusdGpu(index, daemon, reader if reader is not None else NvmlGpu(index))
    except BaseException:
        daemon.close()
        raise
    log.info("perseus: GPU %d: clocks through zeusd at %s", index, endpoint.where)
    return gpu


def reset_clocks_through_zeusd(indices: Sequence[int] | None, endpoint: ZeusdEndpoint) -> list[str]:
    """Remove the SM clock lock of each GPU through zeusd (``perseus reset-clocks``).

    Args:
        indices: The GPUs' indices; None for every GPU zeusd manages (``GET /discover``).
        endpoint: Where zeusd listens.

    Returns:
        One line per GPU, e.g. ``"GPU 0: SM clock lock removed (zeusd at unix:/run/zeusd/
        zeusd.sock)"``.

    Raises:
        ZeusdUnavailable: zeusd cannot be reached.
        ZeusdRefused: zeusd refused (stops at the first GPU refused; the message names it).
    """
    daemon = ZeusdDaemon(endpoint)
    lines = []
    try:
        for index in daemon.gpu_ids() if indices is None else indices:
            daemon.reset_gpu_locked_clocks(index)
            lines.append(f"GPU {index}: SM clock lock removed (zeusd at {endpoint.where})")
    finally:
        daemon.close()
    return lines
