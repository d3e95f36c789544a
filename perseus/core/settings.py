"""Every ``PERSEUS_*`` variable, in one place: its name, type, default, meaning and check.

The rank (:mod:`perseus.client.settings`), the ``perseus`` command
(:mod:`perseus.cli.job_context`) and the planner server (:mod:`perseus.server.settings`,
whose pydantic fields are built from these entries) all read their variables through this
module, so a variable is spelled, defaulted and checked the same way on every side. A bad
value raises :class:`~perseus.core.errors.SettingsError` naming the variable and why
(``PERSEUS_PROFILE_WINDOW_S: must be a finite number >= 0.05, got 0.01``).

Adding a variable is one entry below (``NAME = Variable("PERSEUS_NAME", Kind(...),
default, "what it means")``), listed in :data:`VARIABLES`; the side that uses it then
reads it (``NAME.read(environ)``) or, on the server, declares its field
(``name: int = variable_field(NAME)``).

Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

from perseus.core import defaults
from perseus.core.errors import SettingsError

__all__ = [
    "VARIABLES",
    "Choice",
    "Flag",
    "Kind",
    "Number",
    "Text",
    "Url",
    "Variable",
    "Whole",
    "has_host",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Kind(Protocol[T_co]):
    """How one type of setting is read from text (a variable) and checked as a value (an
    argument); each raises SettingsError naming ``where``."""

    def parse(self, text: str, where: str) -> T_co: ...

    def check(self, value: object, where: str) -> T_co: ...


@dataclass(frozen=True, slots=True)
class Text:
    """Any text (a job id, a token, a path)."""

    def parse(self, text: str, where: str) -> str:
        return text

    def check(self, value: object, where: str) -> str:
        return str(value)


@dataclass(frozen=True, slots=True)
class Url:
    """An ``http://`` or ``https://`` URL with a host (the port may be left out)."""

    def parse(self, text: str, where: str) -> str:
        if not text.startswith(("http://", "https://")) or not has_host(text):
            raise SettingsError(f"{where}: expected http://host:port, got {text!r}")
        return text

    def check(self, value: object, where: str) -> str:
        return self.parse(str(value), where)


@dataclass(frozen=True, slots=True)
class Choice:
    """One of a few words."""

    options: tuple[str, ...]

    def parse(self, text: str, where: str) -> str:
        if text not in self.options:
            raise SettingsError(f"{where}: expected one of {', '.join(self.options)}, got {text!r}")
        return text

    def check(self, value: object, where: str) -> str:
        return self.parse(str(value), where)


@dataclass(frozen=True, slots=True)
class Flag:
    """On or off: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off`` (any case)."""

    def parse(self, text: str, where: str) -> bool:
        text = text.strip().lower()
        if text in ("", "0", "false", "no", "off"):
            return False
        if text in ("1", "true", "yes", "on"):
            return True
        raise SettingsError(f"{where}: expected 1 or 0, got {text!r}")

    def check(self, value: object, where: str) -> bool:
        if not isinstance(value, bool):
            raise SettingsError(f"{where}: must be True or False, got {value!r}")
        return value


@dataclass(frozen=True, slots=True)
class Whole:
    """A whole number from ``minimum`` (to ``maximum``, when given)."""

    minimum: int = 0
    maximum: int | None = None

    def parse(self, text: str, where: str) -> int:
        text = text.strip()
        # isdigit() alone admits digits int() refuses ("²")
        if not (text.isascii() and text.isdigit()) or not self._fits(int(text)):
            raise SettingsError(f"{where}: expected a whole number {self._range()}, got {text!r}")
        return int(text)

    def check(self, value: object, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not self._fits(value):
            raise SettingsError(f"{where}: must be a whole number {self._range()}, got {value!r}")
        return value

    def _fits(self, value: int) -> bool:
        return value >= self.minimum and (self.maximum is None or value <= self.maximum)

    def _range(self) -> str:
        top = "" if self.maximum is None else f" and <= {self.maximum}"
        return f">= {self.minimum}{top}"


@dataclass(frozen=True, slots=True)
class Number:
    """A finite number from ``minimum`` (or above ``above``) to ``maximum``."""

    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    """An open lower bound (the number must be more than it)."""

    def parse(self, text: str, where: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise SettingsError(f"{where}: not a number: {text!r}") from None
        if not self._fits(value):
            raise SettingsError(
                f"{where}: must be a finite number {self._range()}, got {text.strip()}"
            )
        return value

    def check(self, value: object, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SettingsError(f"{where}: must be a number, got {value!r}")
        if not self._fits(value):
            raise SettingsError(f"{where}: must be a finite number {self._range()}, got {value}")
        return float(value)

    def _fits(self, value: float) -> bool:
        return (
            math.isfinite(value)
            and (self.minimum is None or value >= self.minimum)
            and (self.above is None or value > self.above)
            and (self.maximum is None or value <= self.maximum)
        )

    def _range(self) -> str:
        low = (
            f">= {self.minimum:g}"
            if self.minimum is not None
            else f"> {self.above:g}"
            if self.above is not None
            else ""
        )
        top = "" if self.maximum is None else f" and <= {self.maximum:g}"
        return f"{low}{top}".strip()


@dataclass(frozen=True, slots=True)
class Variable(Generic[T]):
    """One environment variable.

    Attributes:
        name: its name (``PERSEUS_...``).
        kind: how its text is read and checked.
        default: its value when unset (None: none).
        help: what it means, for documentation and ``--help``.
        fallbacks: variables read when it is unset, in order (a launcher's ``RANK``).
    """

    name: str
    kind: Kind[T]
    default: T | None
    help: str = ""
    fallbacks: tuple[str, ...] = ()

    def read(self, environ: Mapping[str, str]) -> T | None:
        """Its value in ``environ`` (or a fallback's), else its default. Blank is unset.

        Raises:
            SettingsError: the text is malformed; the message names the variable read.
        """
        for name in (self.name, *self.fallbacks):
            text = environ.get(name, "").strip()
            if text:
                return self.kind.parse(text, name)
        return self.default

    def text(self, environ: Mapping[str, str]) -> str | None:
        """Its text as set (stripped), None when unset or blank; not checked."""
        return environ.get(self.name, "").strip() or None

    @property
    def field(self) -> str:
        """The setting's name without the prefix, lower case (``PERSEUS_PORT`` -> ``port``)."""
        return self.name.removeprefix("PERSEUS_").lower()


def has_host(url: str) -> bool:
    """Does ``url`` name a host (and a usable port, if any), with no white space?"""
    # Checked when read, not at the first request: a URL httpx cannot use would otherwise
    # fail at connect() with httpx's words, or pass as an endless outage of a host named "".
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a malformed or out-of-range port
    except ValueError:
        return False
    return bool(parts.hostname) and port != 0 and not any(c.isspace() for c in url)


# ----------------------------------------------------------------------------- the rank


SERVER = Variable("PERSEUS_SERVER", Url(), None, "planner URL; unset: perseus is off")
JOB = Variable("PERSEUS_JOB", Text(), None, "job id from ``perseus job create``")
TOKEN = Variable("PERSEUS_TOKEN", Text(), None, "the job's token")
RANK = Variable("PERSEUS_RANK", Whole(0), None, "this rank (else ``RANK``, else 0)", ("RANK",))
STAGE = Variable("PERSEUS_STAGE", Whole(0), None, "pipeline stage of this rank")
DATA_PARALLEL_RANK = Variable(
    "PERSEUS_DATA_PARALLEL_RANK", Whole(0), None, "data-parallel replica of this rank"
)
TENSOR_PARALLEL_RANK = Variable(
    "PERSEUS_TENSOR_PARALLEL_RANK", Whole(0), None, "rank within the tensor group"
)
GPU_INDEX = Variable(
    "PERSEUS_GPU_INDEX",
    Whole(0),
    None,
    "NVML index of this rank's GPU (else ``LOCAL_RANK``, else 0)",
    ("LOCAL_RANK",),
)
GPU = Variable(
    "PERSEUS_GPU",
    Choice(("nvml", "dry-run", "fake", "zeusd")),
    "nvml",
    "how clocks are set: ``nvml``, ``zeusd``, ``dry-run`` or ``fake`` (unset: ``zeusd`` where "
    "``ZEUSD_SOCK_PATH`` or ``ZEUSD_HOST_PORT`` is set, else ``nvml``)",
)
ZEUSD_SOCK_PATH = Variable("ZEUSD_SOCK_PATH", Text(), None, "zeusd's Unix socket (Zeus's own)")
ZEUSD_HOST_PORT = Variable(
    "ZEUSD_HOST_PORT", Text(), None, "``host:port`` of a zeusd in TCP mode (Zeus's own)"
)
ZEUSD_TOKEN = Variable("ZEUSD_TOKEN", Text(), None, "a token zeusd accepts (Zeus's own)")
STRICT = Variable(
    "PERSEUS_STRICT", Flag(), False, "``1``: a GPU that cannot be opened fails ``connect()``"
)
PROFILE = Variable("PERSEUS_PROFILE", Text(), None, "a saved profile to upload instead")
PROFILE_WINDOW_S = Variable(
    "PERSEUS_PROFILE_WINDOW_S", Number(minimum=0.05), 0.6, "seconds measured per loop and clock"
)
PROFILE_SETTLE_S = Variable(
    "PERSEUS_PROFILE_SETTLE_S", Number(minimum=0.0), 0.2, "seconds after a clock change"
)
PROFILE_CLOCKS = Variable(
    "PERSEUS_PROFILE_CLOCKS",
    Text(),
    "auto",
    "``auto`` (coarse then fine where plans go), ``all``, ``every:N`` or ``1980,1900``",
)
PROFILE_MAX_S = Variable(
    "PERSEUS_PROFILE_MAX_S", Number(minimum=1.0), 600.0, "stop the sweep after this long"
)
PROFILE_BLOCKING_S = Variable(
    "PERSEUS_PROFILE_BLOCKING_S",
    Number(minimum=0.1),
    1.2,
    "seconds the blocking power is measured",
)
CLOCK_LOG = Variable("PERSEUS_CLOCK_LOG", Text(), None, "directory for ``rank{R}.jsonl``")
POLL_WAIT_S = Variable(
    "PERSEUS_POLL_WAIT_S", Number(minimum=0.1), 30.0, "longest wait of one plan poll"
)
CLOCK_LATENCY_S = Variable(
    "PERSEUS_CLOCK_LATENCY_S",
    Number(minimum=0.0, maximum=1.0),
    0.03,
    "clock-change latency assumed until measured (seconds)",
)
BASELINE_ITERATIONS = Variable(
    "PERSEUS_BASELINE_ITERATIONS",
    Whole(0),
    defaults.BASELINE_ITERATIONS,
    "iterations at default clocks before the first plan",
)
FAKE_TRACE = Variable(
    "PERSEUS_FAKE_TRACE",
    Text(),
    None,
    "a folder: the fake GPU writes one JSON line per unit of work to fake-rank<RANK>.jsonl",
)
FAKE_CLOCK_DELAY_S = Variable(
    "PERSEUS_FAKE_CLOCK_DELAY_S",
    Number(minimum=0.0),
    None,
    "the fake GPU's clock-change delay (seconds; unset: the model's)",
)

# ----------------------------------------------------------------------------- the command

ADMIN_TOKEN = Variable(
    "PERSEUS_ADMIN_TOKEN",
    Text(),
    None,
    "When set, creating, listing and deleting jobs needs it.",
)

# ----------------------------------------------------------------------------- the server

HOST = Variable("PERSEUS_HOST", Text(), "127.0.0.1", "Address to bind; loopback by default.")
PORT = Variable("PERSEUS_PORT", Whole(0, 65535), 7787)
DATABASE = Variable(
    "PERSEUS_DATABASE",
    Text(),
    "sqlite:///./perseus.db",
    "SQLAlchemy URL: an SQLite file, or postgresql+psycopg://user:pw@host/db.",
)
WORKERS = Variable("PERSEUS_WORKERS", Whole(1, 256), 1, "Server processes (uvicorn).")
PLANNING_WORKERS = Variable(
    "PERSEUS_PLANNING_WORKERS",
    Whole(1, 256),
    1,
    "Planning runs at a time per server, each in a process of its own; one more runs a "
    "small job (1/16 of planning_max_cells) when these are all busy.",
)
PLANNING_MAX_CELLS = Variable(
    "PERSEUS_PLANNING_MAX_CELLS",
    Whole(1_000_000),
    defaults.MAX_CELLS,
    "Most planning work a job may imply, instructions x frontier deadlines (estimated from "
    "its profiles; about 12 bytes and 1 us each); a job over it gets 422 naming what would "
    "fit. The default admits 16 stages x 128 microbatches interleaved (1.5e8) and refuses "
    "what would take many GiB or minutes.",
)
CLOCK_CHANGE_DELAY_S = Variable(
    "PERSEUS_CLOCK_CHANGE_DELAY_S",
    Number(minimum=0.0, maximum=0.5),
    defaults.CLOCK_CHANGE_DELAY_S,
    "How long a clock change takes to land on the ranks (seconds): plans keep every run of "
    "one clock long enough for its changes to land in turn. 0: plan without.",
)
PLANNING_TIMEOUT_S = Variable(
    "PERSEUS_PLANNING_TIMEOUT_S",
    Number(above=0, maximum=86_400),
    900.0,
    "Wall-clock limit of one planning run; past it the run's process is killed and the job "
    "fails with a reason. About twice what a job at planning_max_cells takes on a busy "
    "2-core host.",
)
PLANNING_MEMORY_MB = Variable(
    "PERSEUS_PLANNING_MEMORY_MB",
    Whole(512),
    8192,
    "Memory limit of one planning process (RLIMIT_DATA, MiB); a run that needs more fails "
    "with a reason. Unset: no limit.",
)
PLANNING_LEASE_S = Variable(
    "PERSEUS_PLANNING_LEASE_S",
    Number(above=0),
    30.0,
    "A planning job whose server stops sending heartbeats for this long is taken over by "
    "another server (or by the same one after a restart).",
)
POLISH_S = Variable(
    "PERSEUS_POLISH_S",
    Number(minimum=0, maximum=3600),
    defaults.POLISH_S,
    "Seconds a frontier computation may spend improving the no-slowdown point with a branch "
    "and bound (0, the default: off; timed, so the frontier then depends on the machine's "
    "speed).",
)
WARM_PLANNER = Variable(
    "PERSEUS_WARM_PLANNER",
    Flag(),
    True,
    "Start a planning process at startup, not at the first job.",
)
CACHE_TTL_S = Variable(
    "PERSEUS_CACHE_TTL_S",
    Number(minimum=0),
    1.0,
    "How long a process trusts its cached job state; changes made by other server processes "
    "become visible within this time.",
)
TELEMETRY_FLUSH_S = Variable(
    "PERSEUS_TELEMETRY_FLUSH_S",
    Number(above=0, maximum=60),
    0.25,
    "Iteration reports are written this often.",
)
MAX_WAIT_S = Variable(
    "PERSEUS_MAX_WAIT_S",
    Number(above=0, maximum=3600),
    60.0,
    "Longest plan long poll; more than 0 (0 would answer every poll at once: the ranks would "
    "each poll as fast as their floor allows).",
)
CHANGE_POLL_S = Variable(
    "PERSEUS_CHANGE_POLL_S",
    Number(above=0, maximum=60),
    0.1,
    "While ranks long-poll, how often other server processes' changes are looked for "
    "(PostgreSQL also notifies at once).",
)
MAX_BODY_BYTES = Variable(
    "PERSEUS_MAX_BODY_BYTES",
    Whole(1024),
    2 * 1024 * 1024,
    "Larger request bodies get 413. The largest legitimate request, a 10,000-row profile "
    "report with 17-digit numbers, is 1.16 MB as the perseus client sends it (1.58 MB "
    "indented): 2 MiB leaves a margin and no more.",
)
KEEP_ALIVE_S = Variable(
    "PERSEUS_KEEP_ALIVE_S",
    Whole(1, 3600),
    75,
    "An idle keep-alive connection is closed after this long. Keep it longer than any "
    "client's pool expiry (the perseus client's is 60 s, httpx's default 5 s): a client that "
    "reuses a connection just as the server closes it sees an error.",
)
HEADER_TIMEOUT_S = Variable(
    "PERSEUS_HEADER_TIMEOUT_S",
    Number(above=0, maximum=3600),
    10.0,
    "A connection must send a complete request head within this long of opening (or of its "
    "first byte after a keep-alive pause); else it is closed.",
)
BODY_TIMEOUT_S = Variable(
    "PERSEUS_BODY_TIMEOUT_S",
    Number(above=0, maximum=3600),
    60.0,
    "A request must send its whole body within this long of its head; else its connection "
    "is closed and nothing of it is stored. The largest legitimate body (2 MiB at most) "
    "takes well under a second in a cluster.",
)
WRITE_TIMEOUT_S = Variable(
    "PERSEUS_WRITE_TIMEOUT_S",
    Number(above=0, maximum=3600),
    30.0,
    "Output a client does not read must be taken within this long once 64 KiB of it wait "
    "(and a closing connection's within this long of closing); else the connection is "
    "aborted. A client that sends requests and never reads the answers would otherwise hold "
    "its connection, and its request, forever.",
)
MAX_JOBS = Variable(
    "PERSEUS_MAX_JOBS",
    Whole(1),
    10_000,
    "Jobs stored at once; creating one more answers 409 (delete finished jobs). Unset: no limit.",
)
MAX_RANKS_PER_JOB = Variable(
    "PERSEUS_MAX_RANKS_PER_JOB",
    Whole(1),
    16_384,
    "A job's ranks, stages x data_parallel x tensor_parallel; a larger job answers 422 at "
    "creation. Unset: no limit.",
)
MAX_PROFILE_ROWS = Variable(
    "PERSEUS_MAX_PROFILE_ROWS",
    Whole(2),
    10_000,
    "Rows of one rank's profile; more answers 422 (a full sweep of an H200's clocks is ~220 "
    "rows per instruction kind). Unset: no limit.",
)
MAX_JOB_PROFILE_BYTES = Variable(
    "PERSEUS_MAX_JOB_PROFILE_BYTES",
    Whole(1024),
    256 * 2**20,
    "Profile rows one job stores, as JSON, over all its ranks; a profile past it answers "
    "409. Planning loads them all into the server. Unset: no limit.",
)
CACHED_JOBS = Variable(
    "PERSEUS_CACHED_JOBS",
    Whole(16),
    4096,
    "Job rows kept in each server process's memory; the least recently changed beyond it "
    "are read again from the database when asked for.",
)
MAX_CONNECTIONS = Variable(
    "PERSEUS_MAX_CONNECTIONS",
    Whole(16),
    None,
    "Open connections per server process; past it the ones that have waited longest for a "
    "request are closed, and when none waits, requests get 503. Unset: the open-file limit "
    "(raised to its hard limit at start) less 128.",
)
LOG_LEVEL = Variable("PERSEUS_LOG_LEVEL", Text(), "info")
CACHE_DIR = Variable(
    "PERSEUS_CACHE_DIR",
    Text(),
    None,
    "where the planner caches its compiled kernels (``numba`` below it; default "
    "``$XDG_CACHE_HOME/perseus``, else ``~/.cache/perseus``); read by the solver's kernel cache",
)
COMPILE_KERNELS = Variable(
    "PERSEUS_COMPILE_KERNELS",
    Flag(),
    True,
    "``0``: a first large plan does not compile the kernels in the background for later runs",
)
BUDGET_DEFAULT_GPU_W = Variable(
    "PERSEUS_BUDGET_DEFAULT_GPU_W",
    Number(above=0, maximum=100_000),
    700.0,
    "Under a cluster power budget, what each GPU of a job without a plan or measured "
    "iterations is counted at (watts).",
)


VARIABLES: tuple[Variable[Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Variable)
)
"""Every variable above, in order."""
