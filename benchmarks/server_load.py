"""Load on the planner server: 1,024 simulated ranks (8 stages x 128 data-parallel replicas).

    python benchmarks/server_load.py                     # one server process, 2 client processes
    python benchmarks/server_load.py --workers 2         # two uvicorn workers sharing SQLite (WAL)
    python benchmarks/server_load.py --seconds 5         # shorter timed phases
    python benchmarks/server_load.py --http httpx        # clients on httpx (about 1 ms CPU/req)

Starts a real server (``python -m perseus.server``, loopback, a fresh SQLite file) and drives it
from ``--clients`` asyncio processes on the same machine, ranks split between them; phases 1-5
use a lean keep-alive HTTP/1.1 client (or httpx with ``--http httpx``), phase 6 httpx. Any
response but a success, 304, or 409 "no plan yet" stops the run:

1. ``register``: every rank registers (``POST /ranks``).
2. ``profile``: every rank reports its stage's profile with its own measurement noise; the last
   report starts the frontier computation. The profile is the real bloom A100 one from
   ``../shared`` when present, else the project's synthetic H200-like model.
3. ``while planning``: for ``--seconds``, a frontier is always being computed (recomputed
   with ``plan:compute`` as soon as one is stored) while ranks send, at the rate of training
   (open loop: per rank and ``--iteration-s``, an iteration report and a plan poll; now and
   then a re-registration or a job status read), what they send during training. Latency
   counts from when a request was due, so a stalled server shows.
4. ``plan fetch 200``: ranks fetch their full plan (no ETag), for ``--seconds``.
5. ``plan poll 304``: ranks poll with ``If-None-Match`` of the version they hold.
6. ``long-poll wake``: all 1,024 ranks long-poll at once (one connection each, one process);
   the policy changes; latency is from the change's reply to each rank's new plan.

Phases 1, 2, 4 and 5 are closed loops with ``--concurrency`` requests in flight (one
connection each): they measure throughput. Latencies are per request, measured in the
clients. "server ms/req" is the CPU time of the server process(es) during the phase divided
by its requests (planning processes not counted): the server's own cost, apart from the
clients' ("client ms/req"; with httpx several times the server's). "server p99 ms" is the
bucket of the server's own latency histogram (``/metrics``: from the request reaching the
app to the response sent) that holds the 99th percentile.
Fixed seed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json as jsonlib
import multiprocessing
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

SEED = 0
REPO = Path(__file__).resolve().parents[1]
SHARED_PROFILE = REPO / ".." / "shared" / "data" / "profiles" / "bloom+a100_sxm_bf16.csv"
SHARED_P_BLOCK_W = 83.64
STAGES = 8
REPLICAS = 128
MICROBATCHES = 12

Rank = tuple[int, int, int]  # rank, stage, data-parallel rank

# What ranks send during training, per rank and iteration: an iteration report and a plan
# poll; now and then a rank restarts and registers again, or someone reads the job's status.
_TRAINING_MIX = ("iteration", "plan poll") * 500 + ("register", "register", "status")
_OPEN_LOOP_CONNECTIONS = 128  # per client process
_CLIENT_NICENESS = 5


@dataclass(frozen=True)
class PhaseSpec:
    """One client process's share of a phase."""

    kind: str
    url: str
    job: str
    token: str
    ranks: tuple[Rank, ...]
    concurrency: int
    seconds: float = 0.0
    rate: float = 0.0
    clocks: tuple[int, ...] = ()
    rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    version: int = 0
    seed: int = SEED
    http: str = "raw"


@dataclass
class Phase:
    name: str
    requests: int
    seconds: float
    latencies_s: list[float]
    server_cpu_s: float | None = None
    note: str = ""
    server_p99_s: float | None = None
    client_cpu_s: float | None = None

    def row(self) -> list[str]:
        lat = sorted(self.latencies_s)

        def pct(q: float) -> str:
            return f"{1000 * lat[min(len(lat) - 1, int(q * len(lat)))]:.1f}" if lat else "-"

        rate = self.requests / self.seconds if self.seconds > 0 else 0.0

        def per_request(cpu_s: float | None) -> str:
            return (
                f"{1000 * cpu_s / self.requests:.2f}"
                if cpu_s is not None and self.requests
                else "-"
            )

        return [
            self.name,
            str(self.requests),
            f"{self.seconds:.1f}",
            f"{rate:,.0f}",
            pct(0.50),
            pct(0.99),
            f"{1000 * lat[-1]:.1f}" if lat else "-",
            "-" if self.server_p99_s is None else f"<= {1000 * self.server_p99_s:g}",
            per_request(self.server_cpu_s),
            per_request(self.client_cpu_s),
            self.note,
        ]


# ----------------------------------------------------------------------------- client side


@dataclass(frozen=True, slots=True)
class _RawResponse:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


class _RawClient:
    """HTTP/1.1 over one keep-alive connection, with the least client CPU per request.

    The clients stand for ranks on other machines; here they share the server's two cores,
    and httpx spends several times the server's own CPU per request (see "client ms/req"),
    which shows up as latency. This client only writes a request and reads a
    ``Content-Length`` response (what the server sends).
    """

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(
        self,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> _RawResponse:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return await self._request("GET", path + query, None, headers or {})

    async def post(self, path: str, *, json: Any, headers: dict[str, str]) -> _RawResponse:
        body = jsonlib.dumps(json, separators=(",", ":")).encode()
        return await self._request("POST", path, body, headers)

    async def _request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> _RawResponse:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self._host}:{self._port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None
        self._writer.write(data)
        status = await self._reader.readline()
        if not status:  # no retry: a dropped connection is a finding, not noise
            raise ConnectionResetError(f"{method} {path}: connection closed by the server")
        length, close = 0, False
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection":
                close = value.strip().lower() == "close"
        content = await self._reader.readexactly(length) if length else b""
        if close:
            await self.aclose()
        return _RawResponse(int(status.split()[1]), content)

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None


def _registration(rank: Rank, clocks: Sequence[int]) -> dict[str, Any]:
    return {
        "rank": rank[0],
        "stage": rank[1],
        "data_parallel_rank": rank[2],
        "tensor_parallel_rank": 0,
        "gpu_name": "NVIDIA A100-SXM4-40GB",
        "supported_clocks_mhz": list(clocks),
    }


async def _run_phase(spec: PhaseSpec) -> tuple[float, float, list[tuple[str, float]]]:
    """One phase from this process: (seconds, client CPU seconds, (kind, latency) pairs)."""
    rng = random.Random(spec.seed)
    auth = {"Authorization": f"Bearer {spec.token}"}
    etag = {**auth, "If-None-Match": f'"{spec.version}"'}
    job = spec.job
    # One client (one connection) each: httpx's pool scans every connection per request.
    # In the open loop, many: ranks each have their own connection, and a request must not
    # wait here for a free one.
    connections = spec.concurrency if spec.kind != "training" else _OPEN_LOOP_CONNECTIONS
    clients: list[Any]
    if spec.http == "raw":
        clients = [_RawClient(spec.url) for _ in range(connections)]
    else:
        tls = ssl.create_default_context()  # one for all clients (each would load the CA file)
        clients = [
            httpx.AsyncClient(base_url=spec.url, timeout=120, verify=tls)
            for _ in range(connections)
        ]
    latencies: list[tuple[str, float]] = []

    def kind_of(i: int) -> str:
        return _TRAINING_MIX[i % len(_TRAINING_MIX)] if spec.kind == "training" else spec.kind

    def request(client: Any, i: int) -> Awaitable[Any]:
        rank = spec.ranks[i % len(spec.ranks)]
        kind = kind_of(i)
        if kind == "register":
            return client.post(f"{job}/ranks", json=_registration(rank, spec.clocks), headers=auth)
        if kind == "profile":
            rows = [
                {
                    **row,
                    "time_s": row["time_s"] * rng.uniform(0.995, 1.005),
                    "energy_j": row["energy_j"] * rng.uniform(0.99, 1.01),
                }
                for row in spec.rows[rank[1]]
            ]
            body = {"rank": rank[0], "stage": rank[1], "rows": rows}
            return client.post(f"{job}/profiles", json=body, headers=auth)
        if kind == "iteration":
            body = {"rank": rank[0], "iteration": i, "time_s": 3.0, "energy_j": 900.0}
            return client.post(f"{job}/iterations", json=body, headers=auth)
        if kind == "status":
            return client.get(job, headers=auth)
        headers = etag if kind in ("poll", "plan poll") else auth
        return client.get(f"{job}/plan", params={"rank": rank[0]}, headers=headers)

    async def call(client: Any, i: int, since: float) -> None:
        response = await request(client, i)
        latencies.append((kind_of(i), time.perf_counter() - since))
        # Anything but success, 304, or "no plan yet" (409 while the first frontier is
        # computed) means the request measured is not the one meant.
        if response.status_code >= 400 and response.status_code != 409:
            raise SystemExit(f"{spec.kind}: HTTP {response.status_code}: {response.text[:300]}")

    if spec.kind == "training":
        # Open every connection before the clock starts, as ranks that have been running do.
        await asyncio.gather(*(client.get("/healthz") for client in clients))
    started = time.perf_counter()
    cpu_started = time.process_time()
    deadline = started + spec.seconds
    if spec.kind == "training":
        # Open loop: requests at a fixed rate, as ranks send them, whether or not the
        # server keeps up; latency counts from when a request was due, so a stalled
        # server shows as waiting here too.
        idle: asyncio.Queue[Any] = asyncio.Queue()
        for client in clients:
            idle.put_nowait(client)
        tasks: list[asyncio.Task[None]] = []

        async def due(i: int, at: float) -> None:
            client = await idle.get()
            try:
                await call(client, i, at)
            finally:
                idle.put_nowait(client)

        i = 0
        while (at := started + i / spec.rate) < deadline:
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.ensure_future(due(i, at)))
            i += 1
        await asyncio.gather(*tasks)
    else:
        # Closed loop: each connection sends its next request when the last one returns.
        counter = iter(range(len(spec.ranks) if spec.kind in ("register", "profile") else 2**62))

        async def worker(client: Any) -> None:
            for i in counter:
                if spec.seconds and time.perf_counter() > deadline:
                    return
                await call(client, i, time.perf_counter())

        await asyncio.gather(*(worker(client) for client in clients))
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    for client in clients:
        await client.aclose()
    return elapsed, cpu_s, latencies


def run_phase(spec: PhaseSpec) -> tuple[float, float, list[tuple[str, float]]]:
    # The client's own garbage-collector pauses would show as server latency.
    gc.collect()
    gc.disable()
    try:
        return asyncio.run(_run_phase(spec))
    finally:
        gc.enable()


# ----------------------------------------------------------------------------- orchestration


def load_rows() -> tuple[dict[int, list[dict[str, Any]]], float, str]:
    """stage -> wire profile rows, blocking power, where they came from."""
    from perseus.solver import load_profile, profile_from_rows, profile_to_json
    from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, synthetic_profile

    if SHARED_PROFILE.is_file():
        profile = load_profile(SHARED_PROFILE)
        p_block_w, source = SHARED_P_BLOCK_W, "bloom+a100 (shared)"
    else:
        profile = profile_from_rows(synthetic_profile(STAGES, seed=SEED))
        p_block_w, source = EXAMPLE_P_BLOCK_W, "synthetic H200"
    rows: dict[int, list[dict[str, Any]]] = {}
    for row in profile_to_json(profile)["rows"]:
        rows.setdefault(row.pop("stage"), []).append(row)
    return rows, p_block_w, source


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(port: int, database: str, workers: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env["PERSEUS_WARM_PLANNER"] = "true"
    command = [
        sys.executable, "-m", "perseus.server", "--host", "127.0.0.1", "--port", str(port),
        "--database", database, "--workers", str(workers), "--log-level", "warning",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=out, cwd=REPO)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                time.sleep(3.0)  # let the warm-up planning processes finish importing
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit("server did not start")


def server_latency_buckets(url: str) -> dict[float, int]:
    """The server's own request latency histogram (all routes), from ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=60).text
    buckets: dict[float, int] = {}
    for line in text.splitlines():
        if line.startswith("perseus_http_request_duration_seconds_bucket{") and (
            'route="/metrics"' not in line
        ):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0) + int(line.rsplit(" ", 1)[1])
    return buckets


def bucket_quantile(before: dict[float, int], after: dict[float, int], q: float) -> float:
    """Upper bound of the bucket holding quantile ``q`` of the requests between two reads."""
    counts = {b: after.get(b, 0) - before.get(b, 0) for b in after}
    total = counts.get(float("inf"), 0)
    for bound in sorted(counts):
        if counts[bound] >= q * total:
            return bound
    return float("inf")


def server_cpu_s(pid: int, workers: int) -> float:
    """CPU seconds of the server process, or of its worker processes (not planning ones)."""

    def own(p: int) -> float:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    total = own(pid)
    if workers > 1:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == pid:
                    total += own(int(entry.name))
    return total


def drive(
    url: str,
    pid: int,
    workers: int,
    clients: int,
    concurrency: int,
    seconds: float,
    rate: float,
    http: str = "raw",
) -> tuple[list[Phase], dict[str, Any]]:
    rows, p_block_w, source = load_rows()
    clocks = tuple(sorted({r["frequency_mhz"] for r in rows[0]}))
    ranks = [(d * STAGES + s, s, d) for d in range(REPLICAS) for s in range(STAGES)]
    info: dict[str, Any] = {"profile": source}
    r = httpx.post(
        f"{url}/v1/jobs",
        json={
            "name": "server_load",
            "schedule": "1f1b",
            "stages": STAGES,
            "microbatches": MICROBATCHES,
            "data_parallel": REPLICAS,
            "tensor_parallel": 1,
            "p_block_w": p_block_w,
        },
    )
    r.raise_for_status()
    job_id, token = r.json()["job_id"], r.json()["token"]
    job = f"/v1/jobs/{job_id}"
    auth = {"Authorization": f"Bearer {token}"}
    phases: list[Phase] = []
    has_cpu = Path(f"/proc/{pid}/stat").exists()

    with ProcessPoolExecutor(clients, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_start_client, range(clients)))

        def phase(
            name: str, kind: str, note: str = "", *, version: int = 0, span: float = 0.0
        ) -> None:
            specs = [
                PhaseSpec(
                    kind,
                    url,
                    job,
                    token,
                    tuple(ranks[c::clients]),
                    max(1, concurrency // clients),
                    span,
                    rate / clients,
                    clocks,
                    rows,
                    version,
                    SEED + c,
                    http,
                )
                for c in range(clients)
            ]
            cpu0 = server_cpu_s(pid, workers) if has_cpu else None
            hist0 = server_latency_buckets(url)
            results = list(pool.map(run_phase, specs))
            cpu = server_cpu_s(pid, workers) - cpu0 if cpu0 is not None else None
            hist1 = server_latency_buckets(url)
            server_p99 = bucket_quantile(hist0, hist1, 0.99)
            tagged = [pair for _, _, pairs in results for pair in pairs]
            elapsed = max(seconds_ for seconds_, _, _ in results)
            client_cpu = sum(cpu_s for _, cpu_s, _ in results)
            phases.append(
                Phase(
                    name,
                    len(tagged),
                    elapsed,
                    [t for _, t in tagged],
                    cpu,
                    note,
                    server_p99,
                    client_cpu,
                )
            )
            if kind == "training":
                for sub in sorted({k for k, _ in tagged}):
                    lat = [t for k, t in tagged if k == sub]
                    phases.append(Phase(f"  {sub}", len(lat), elapsed, lat))

        phase("register", "register")
        phase("profile", "profile", f"{len(rows[0])} rows each; the last starts planning")
        # Keep a frontier computing for the whole phase: recompute as soon as one is done.
        replanning = _Replanner(url, job, auth, seconds)
        replanning.start()
        phase(
            "while planning",
            "training",
            f"open loop, {rate:.0f}/s: the rows below",
            span=seconds,
        )
        replanning.join()
        info["frontiers"] = replanning.frontiers
        info["planning_share"] = replanning.planning_share
        view = httpx.get(f"{url}{job}", headers=auth, timeout=60).json()
        info["frontier_points"] = view["frontier_points"]
        info["server_planning_s"] = view["planning_s"]
        phase("plan fetch 200", "fetch", f"{2 * MICROBATCHES} instructions/plan", span=seconds)
        phase(
            "plan poll 304", "poll", "If-None-Match: current", version=view["version"], span=seconds
        )

    phases.append(asyncio.run(_long_poll_wake(url, job, auth, ranks, view["version"])))
    return phases, info


class _Replanner(threading.Thread):
    """Keeps the job's frontier computing for ``seconds``: ``plan:compute`` whenever done."""

    def __init__(self, url: str, job: str, auth: dict[str, str], seconds: float) -> None:
        super().__init__(daemon=True)
        self.url, self.job, self.auth, self.seconds = url, job, auth, seconds
        self.frontiers = 0
        self.planning_share = 0.0

    def run(self) -> None:
        started = time.perf_counter()
        planning_s = 0.0
        headers: dict[str, str] = {}
        with httpx.Client(base_url=self.url, headers=self.auth, timeout=120) as client:
            # The last profile report started the first computation; a long poll for a
            # newer plan returns when the next frontier is stored.
            while True:
                began = time.perf_counter()
                r = client.get(
                    f"{self.job}/plan", params={"rank": 0, "wait_s": 60}, headers=headers
                )
                r.raise_for_status()
                headers = {"If-None-Match": r.headers["etag"]}
                planning_s += time.perf_counter() - began
                self.frontiers += 1
                if time.perf_counter() - started >= self.seconds:
                    break
                client.post(f"{self.job}/plan:compute").raise_for_status()
        self.planning_share = planning_s / (time.perf_counter() - started)


def _start_client(_: int) -> None:
    """Runs first in each client process (and so starts them all up front).

    The clients stand for ranks on other machines: here they share the server's CPUs, and
    at equal priority they would take its time slices and show that as server latency.
    """
    os.nice(_CLIENT_NICENESS)


async def _long_poll_wake(
    url: str, job: str, auth: dict[str, str], ranks: Sequence[Rank], version: int
) -> Phase:
    etag = {**auth, "If-None-Match": f'"{version}"'}
    arrived: list[float] = []
    # A client (one connection) per rank, like real ranks; one TLS context for all of them.
    ssl_context = ssl.create_default_context()
    clients = [httpx.AsyncClient(base_url=url, timeout=120, verify=ssl_context) for _ in ranks]

    async def long_poll(client: httpx.AsyncClient, rank: int) -> None:
        r = await client.get(f"{job}/plan", params={"rank": rank, "wait_s": 60}, headers=etag)
        arrived.append(time.perf_counter())
        if r.status_code != 200:
            raise SystemExit(f"long poll: HTTP {r.status_code}: {r.text[:300]}")

    polls = [
        asyncio.ensure_future(long_poll(client, rank))
        for client, (rank, _, _) in zip(clients, ranks, strict=True)
    ]
    await asyncio.sleep(5.0)  # every poll is parked on the server
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        changed = await client.put(
            f"{job}/policy", json={"kind": "max-slowdown", "factor": 1.05}, headers=auth
        )
    changed.raise_for_status()
    changed_at = time.perf_counter()
    await asyncio.gather(*polls)
    for client in clients:
        await client.aclose()
    wake = [t - changed_at for t in arrived]
    return Phase(
        "long-poll wake", len(wake), max(wake), wake, None, "policy change -> every rank has it"
    )


def print_table(phases: Sequence[Phase], header: str) -> None:
    titles = [
        "phase", "requests", "seconds", "req/s", "p50 ms", "p99 ms", "max ms", "server p99 ms",
        "server ms/req", "client ms/req", "note",
    ]  # fmt: skip
    rows = [titles] + [p.row() for p in phases]
    widths = [max(len(r[i]) for r in rows) for i in range(len(titles))]
    print(header)
    for n, r in enumerate(rows):
        cells = [
            r[i].ljust(widths[i]) if i in (0, len(titles) - 1) else r[i].rjust(widths[i])
            for i in range(len(titles))
        ]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="server processes")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of timed phases")
    parser.add_argument(
        "--iteration-s",
        type=float,
        default=3.0,
        help="training iteration time: sets the open-loop rate while planning",
    )
    parser.add_argument(
        "--http",
        choices=("raw", "httpx"),
        default="raw",
        help="client of phases 1-5: a lean keep-alive HTTP/1.1 client (default) or httpx",
    )
    args = parser.parse_args(argv)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(port, f"sqlite:///{tmp}/perseus.db", args.workers, Path(tmp) / "log")
        try:
            per_rank = len(_TRAINING_MIX) / _TRAINING_MIX.count("iteration")
            rate = per_rank * STAGES * REPLICAS / args.iteration_s
            phases, info = drive(
                f"http://127.0.0.1:{port}",
                server.pid,
                args.workers,
                args.clients,
                args.concurrency,
                args.seconds,
                rate,
                args.http,
            )
        except BaseException:
            print(f"server log:\n{(Path(tmp) / 'log').read_text()[-3000:]}", file=sys.stderr)
            raise
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    try:
        import httptools  # noqa: F401

        parser_name = "httptools"
    except ImportError:
        parser_name = "h11"
    header = (
        f"perseus server load: {STAGES} stages x {REPLICAS} replicas = {STAGES * REPLICAS} ranks, "
        f"1F1B x {MICROBATCHES} microbatches, profile {info['profile']}\n"
        f"server: {args.workers} process(es), SQLite, uvicorn with {parser_name}; clients: "
        f"{args.clients} processes ({args.http}; long polls: httpx), "
        f"{args.concurrency} requests in flight; "
        f"{os.cpu_count()} CPUs shared by both\n"
        f"frontier: {info['frontier_points']} points in {info['server_planning_s']:.1f} s "
        f"(worker process); while planning: {info['frontiers']} frontiers back to back, "
        f"computing {100 * info['planning_share']:.0f} % of the time\n"
    )
    print_table(phases, header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
