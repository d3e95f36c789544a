"""The planner server and the rank under the attacks of issues 12 and 24, before and after.

    python benchmarks/server_abuse.py                       # before = a clone of HEAD
    python benchmarks/server_abuse.py --before /tmp/perseus-before-12 --after .
    python benchmarks/server_abuse.py --only 24                # issue 24's attacks only
    python benchmarks/server_abuse.py --only E                 # round E's (vs 237a349)

"before" is a checkout given by ``--before`` (made with ``git clone -q <repo> DIR`` when
missing), "after" the working tree; each runs as ``python -m perseus.server`` with
``PYTHONPATH`` set to its checkout, on loopback, with a fresh SQLite file, an open-file limit
of 1,024 (soft and hard, as ``ulimit -n 1024``) and its log captured. Attacks:

1. ``idle sockets``: 1,100 connections that never send a byte, then 20 ``/healthz`` and 20
   plan fetches (a new connection each, 1 s timeout): how many answer, their p99, and the
   "Too many open files" lines logged meanwhile.
2. ``big bodies``: eight 8 MB bodies at once, no token, to a job's profile route: the
   answers, the server's peak memory growth, ``/healthz`` p50 meanwhile. Then one body just
   under the new 2 MiB cap, no token (read or not before the token is checked).
3. ``keep-alive 4.95 s``: 40 requests each on a connection idle for 4.95 s (a client whose
   pool keeps connections 10 s): how many fail.
4. ``loose types``: booleans, numeric strings and 2.0 for integers in five requests: how
   many are accepted.
5. ``contract``: 12 malformed or misrouted requests (invalid JSON, invalid UTF-8, nesting
   10,000 deep, unknown path, wrong method, OPTIONS, an infeasible deadline, ...): how many
   answers are off the documented contract (status not in the OpenAPI document, or a body
   that is not ``{detail, error}`` with a list ``detail`` on 422, or 405/OPTIONS without
   ``Allow``).
6. ``token in log``: a plan fetch with ``?token=<job token>`` in the URL, and 20 plan polls:
   whether the token reaches the log, and the log lines the polls wrote.
7. ``planning bounds``: a 4-stage x 32,768-microbatch job gets its profiles: the answer to
   the last one, and whether a small job that arrives after it is planned within 20 s.
8. ``stalled bodies``: 200 requests with a valid token and ``Content-Length: 100000`` send a
   few bytes of body and stop (the server runs with ``PERSEUS_BODY_TIMEOUT_S=2``; older
   checkouts ignore it): how many connections the server still holds 5 s later, and
   whether ``/healthz`` answers meanwhile.
9. ``version going back``: two server processes on one database; the policy changes
   through one, and the other is asked for a plan newer than the old version (If-None-Match
   of the new one, ``wait_s=2``) right after: how often it answers with an older version.

Issue 24's attacks (``--only 24``; "before" is ``--before-24``, a clone at ``600bf05``):

10. ``304 at once``: a planner (a mock transport in the rank's process) that answers every
    plan poll with 304 at once, as a proxy cutting long polls would: the rank's plan requests
    per second and its CPU time over 5 s of training (the fake GPU).
11. ``20 MB plan``: the first plan has 262,144 instructions: the slowest training iteration,
    the rank's peak memory growth, and whether it follows the plan.
12. ``bad plan, then a good one``: plan v1 asks for a clock the GPU lacks, v2 (3 s later) is
    right: which version the rank follows, whether it still controls clocks, and how many
    iteration reports claim v1.
13. ``no NVML``: ``connect()`` with ``PERSEUS_GPU=nvml`` where the NVML library is missing.
14. ``PERSEUS_MAX_WAIT_S=0``: whether the server starts with it.
15. ``rank rejects its job``: a rank whose training runs 2 microbatches against a 4-microbatch
    job: what the job view shows.
16. ``one rank, two processes``: two ranks 0 of one job: what each ends with.
17. ``re-run``: every profile of a planned job re-reported: the plan version 15 s later, and
    whether ``perseus job replan`` exists.
18. ``read-only -shm, -wal, main``: the database on a tmpfs, one file made read-only with a
    read-only bind mount (root ignores file modes): whether the server lives, what three
    job creations and ``/healthz`` answer, and ``/healthz`` 2.5 s after the mount is gone.

Round E's attacks (``--only E``; "before" is ``--before-e``, a git worktree at ``237a349``
made when missing; PostgreSQL where ``PERSEUS_TEST_POSTGRES_URL`` is set):

19. ``1,050 jobs, the web page``: the overview query the checkout's own page sends first:
    its rows, whether the newest job is among them, the count its status line says, and how
    many jobs its pager reaches.
20. ``/metrics, planned after 1,050``: a job planned behind those 1,050: whether it has
    gauges, and how many plan-version series there are.
21. ``NUL in text``: a job name and a gave-up reason with a NUL, on SQLite and PostgreSQL:
    the answers, what was stored, and the tracebacks logged.
22. ``full disk while storing``: an 8 MB tmpfs filled to 96 KB of room once a job's last
    profile is in: the job's state, and 60 s after the space returns.
23. ``restored backup, rank at v3``: backed up at plan v1, two policy changes (v3), the
    backup restored, one more change (v2): what a rank sending ``If-None-Match: "3"`` gets.
24. ``profile stage 999999999999, plan`` / ``profile time 1e308, plan`` / ``profile stage
    999999999999, connect``: the shipped example profile with one typo row more, read by
    ``perseus plan`` or by a rank's ``connect()`` (``PERSEUS_PROFILE``) under a 4 GB
    address-space limit: the outcome, the lines it wrote to stderr, the peak RSS.

No asserts; the figures are printed as they come. Takes about 3 minutes per issue.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
FD_LIMIT = 1024
IDLE_SOCKETS = 1100
BIG_BODY = 8 * 1024 * 1024
TOKEN_PATTERN = "abuse-token-in-url"
STALLED_BODIES = 200
STALL_TIMEOUT_S = 2
STALL_WAIT_S = 5.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@dataclass
class Server:
    """One ``python -m perseus.server`` process of a checkout."""

    checkout: Path
    database: str
    log_path: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        self.port = _free_port()
        env = {
            **os.environ,
            "PYTHONPATH": str(self.checkout),
            "PYTHONUNBUFFERED": "1",
            "PERSEUS_POLISH_S": "0",
            "PERSEUS_WARM_PLANNER": "false",
            "PERSEUS_BODY_TIMEOUT_S": str(STALL_TIMEOUT_S),
        }
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "perseus.server", "--port", str(self.port),
             "--database", self.database],
            env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limit_files,
            cwd=self.checkout,  # python -m puts the working directory first on sys.path
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"server of {self.checkout} did not start; see {self.log_path}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def rss_mb(self) -> float:
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(match.group(1)) / 1024 if match else 0.0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _rows() -> dict[int, list[dict[str, Any]]]:
    from perseus.solver import load_profile, profile_to_json

    path = importlib_resources.files("perseus") / "data" / "example_profile.csv"
    with importlib_resources.as_file(path) as file:
        rows: dict[int, list[dict[str, Any]]] = {}
        for row in profile_to_json(load_profile(Path(file)))["rows"]:
            # 1F1B jobs: forward and backward (older checkouts take no other rows)
            if row["instruction"] in ("forward", "backward"):
                rows.setdefault(row.pop("stage"), []).append(row)
        return rows


ROWS = _rows()
CLOCKS = sorted({r["frequency_mhz"] for rows in ROWS.values() for r in rows})


@dataclass
class Job:
    job_id: str
    token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def create_job(url: str, stages: int = 4, microbatches: int = 4, plan: bool = True) -> Job:
    """A job of ``stages`` x 1 replica on the example profile; planned when ``plan``."""
    with httpx.Client(base_url=url, timeout=60) as c:
        spec = {"schedule": "1f1b", "stages": stages, "microbatches": microbatches,
                "data_parallel": 1, "tensor_parallel": 1, "p_block_w": 100.0}  # fmt: skip
        created = c.post("/v1/jobs", json=spec).json()
        job = Job(created["job_id"], created["token"])
        for stage in range(stages):
            reg = {"rank": stage, "stage": stage, "data_parallel_rank": 0,
                   "tensor_parallel_rank": 0, "gpu_name": "H200",
                   "supported_clocks_mhz": CLOCKS}  # fmt: skip
            c.post(f"/v1/jobs/{job.job_id}/ranks", json=reg, headers=job.auth)
        if plan:
            for stage in range(stages):
                body = {"rank": stage, "stage": stage, "rows": ROWS[stage % 4]}
                c.post(f"/v1/jobs/{job.job_id}/profiles", json=body, headers=job.auth)
            wait_plan(c, job, timeout_s=120)
    return job


def wait_plan(c: httpx.Client, job: Job, timeout_s: float) -> httpx.Response | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = c.get(f"/v1/jobs/{job.job_id}/plan", params={"rank": 0, "wait_s": 1}, headers=job.auth)
        if r.status_code == 200:
            return r
        time.sleep(0.2)
    return None


def _p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _timed_gets(url: str, path: str, headers: dict[str, str], n: int) -> tuple[int, list[float]]:
    ok, times = 0, []
    for _ in range(n):
        started = time.perf_counter()
        try:
            r = httpx.get(url + path, headers=headers, timeout=1.0)
            if r.status_code == 200:
                ok += 1
                times.append((time.perf_counter() - started) * 1000)
        except httpx.HTTPError:
            pass
    return ok, times


@contextlib.contextmanager
def idle_sockets(port: int, n: int) -> Iterator[list[socket.socket]]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


# -- the attacks: each returns its figure -------------------------------------------------


def attack_idle(server: Server, job: Job) -> str:
    before_log = len(server.log_text())
    with idle_sockets(server.port, IDLE_SOCKETS) as socks:
        time.sleep(1.0)
        h_ok, h_ms = _timed_gets(server.url, "/healthz", {}, 20)
        plan_path = f"/v1/jobs/{job.job_id}/plan?rank=0"
        p_ok, p_ms = _timed_gets(server.url, plan_path, job.auth, 20)
        held = len(socks)
    log = server.log_text()[before_log:]
    emfile = log.count("Too many open files")
    return (
        f"{held} idle: healthz {h_ok}/20 p99 {_p(h_ms, 0.99):.0f} ms, plan {p_ok}/20 "
        f"p99 {_p(p_ms, 0.99):.0f} ms, {emfile} EMFILE lines"
    )


def attack_bodies(server: Server, job: Job) -> str:
    body = b'{"rank": 0, "stage": 0, "rows": [' + b"1," * (BIG_BODY // 2 - 40) + b"1]}"
    path = f"{server.url}/v1/jobs/{job.job_id}/profiles"
    base = server.rss_mb()
    peak = base
    stop = threading.Event()
    health: list[float] = []

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, server.rss_mb())
            started = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(server.url + "/healthz", timeout=5)
                health.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)

    def send() -> int:
        try:
            headers = {"content-type": "application/json"}
            return httpx.post(path, content=body, headers=headers, timeout=60).status_code
        except httpx.HTTPError:
            return 0

    sampler = threading.Thread(target=sample)
    sampler.start()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: send(), range(8)))
    time.sleep(0.5)
    stop.set()
    sampler.join()
    # Just under the new cap: is it read before the token is checked?
    small = b'{"rank": 0, "stage": 0, "rows": [' + b"1," * (1_000_000 - 40) + b"1]}"
    started = time.perf_counter()
    r = httpx.post(path, content=small, headers={"content-type": "application/json"}, timeout=60)
    small_ms = (time.perf_counter() - started) * 1000
    shown = ",".join(sorted({str(c) for c in codes}))
    return (
        f"8x8MB -> {shown}; peak +{peak - base:.0f} MB, after +{server.rss_mb() - base:.0f} MB,"
        f" healthz p50 {_p(health, 0.5):.0f} ms; 2MB no token -> {r.status_code} "
        f"in {small_ms:.0f} ms"
    )


def attack_keepalive(server: Server, job: Job) -> str:
    failures = 0

    def trial() -> bool:
        limits = httpx.Limits(max_keepalive_connections=1, keepalive_expiry=10.0)
        with httpx.Client(base_url=server.url, limits=limits, timeout=5) as c:
            c.get("/healthz")
            time.sleep(4.95)
            try:
                c.get("/healthz")
            except httpx.HTTPError:
                return False
        return True

    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        results = list(pool.map(lambda _: trial(), range(40)))
    failures = results.count(False)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(8.0)
        sock.recv(4096)
        started = time.monotonic()
        try:
            while sock.recv(4096):
                pass
            idle = f"server closes idle at {time.monotonic() - started:.1f} s"
        except TimeoutError:
            idle = "server keeps idle > 8 s"
    planner = (server.checkout / "perseus" / "client" / "planner.py").read_text()
    match = re.search(r"KEEPALIVE_EXPIRY_S = ([0-9.]+)", planner)
    expiry = f"{float(match.group(1)):.0f} s" if match else "5 s (httpx default)"
    return f"{failures}/40 failed; {idle}, perseus client expiry {expiry}"


def attack_types(server: Server, job: Job) -> str:
    spec = {"schedule": "1f1b", "microbatches": 4, "data_parallel": 1, "tensor_parallel": 1}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        probes = [
            c.post("/v1/jobs", json={**spec, "stages": "2"}),
            c.post("/v1/jobs", json={**spec, "stages": 2.0}),
            c.post(
                "/v1/jobs",
                json={**spec, "stages": 2, "policy": {"kind": "zeus-cost", "eta": False}},
            ),
            c.post(
                f"/v1/jobs/{job.job_id}/ranks",
                headers=job.auth,
                json={
                    "rank": 0,
                    "stage": 0,
                    "data_parallel_rank": 0,
                    "tensor_parallel_rank": False,
                    "gpu_name": "H200",
                    "supported_clocks_mhz": CLOCKS,
                },
            ),
            c.post(
                f"/v1/jobs/{job.job_id}/iterations",
                headers=job.auth,
                json={
                    "rank": 0,
                    "iteration": 1,
                    "time_s": True,
                    "energy_j": 1.0,
                    "plan_version": 1,
                },
            ),
        ]
    accepted = sum(r.status_code < 300 for r in probes)
    return f"{accepted}/{len(probes)} accepted"


def _documented(spec: dict[str, Any], method: str, path: str) -> set[str] | None:
    for template, item in spec["paths"].items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            operation = item.get(method.lower())
            return set(operation["responses"]) if operation else None
    return None


def attack_contract(server: Server, job: Job) -> str:
    auth = {**job.auth, "content-type": "application/json"}
    profiles = f"/v1/jobs/{job.job_id}/profiles"
    probes: list[tuple[str, str, dict[str, str], bytes | None]] = [
        ("POST", profiles, auth, b"{bad json"),
        ("POST", profiles, auth, b'{"rank": "\xff\xfe"}'),
        ("POST", profiles, auth, b"[" * 10_000 + b"]" * 10_000),
        ("POST", profiles, auth, b'{"rank": 0}'),
        ("PUT", f"/v1/jobs/{job.job_id}/policy", auth, b'{"kind":"deadline","seconds":1e-6}'),
        ("GET", "/v1/nothing-here", {}, None),
        ("GET", "/v1/jobs/", {}, None),
        ("PATCH", f"/v1/jobs/{job.job_id}", job.auth, None),
        ("DELETE", profiles, job.auth, None),
        ("OPTIONS", f"/v1/jobs/{job.job_id}", {}, None),
        ("OPTIONS", "/v1/jobs", {}, None),
        ("GET", f"/v1/jobs/{job.job_id}/plan?rank=x", job.auth, None),
    ]
    with httpx.Client(base_url=server.url, timeout=30) as c:
        spec = c.get("/openapi.json").json()
        off: list[str] = []
        for method, path, headers, content in probes:
            r = c.request(method, path, headers=headers, content=content)
            label = f"{method} {path.rsplit('/', 1)[-1][:12]} {r.status_code}"
            if method == "OPTIONS" or r.status_code == 405:
                if "allow" not in r.headers:
                    off.append(f"{label} no Allow")
                continue
            documented = _documented(spec, method, path)
            body = (
                r.json()
                if r.headers.get("content-type", "").startswith("application/json")
                else None
            )
            if documented is not None and str(r.status_code) not in documented:
                off.append(f"{label} undocumented")
            elif not (isinstance(body, dict) and isinstance(body.get("error"), str)):
                off.append(f"{label} no error")
            elif r.status_code == 422 and not isinstance(body.get("detail"), list):
                off.append(f"{label} str detail")
    return f"{len(off)}/{len(probes)} off contract" + (f" ({'; '.join(off[:3])})" if off else "")


def attack_log(server: Server, job: Job) -> str:
    before = len(server.log_text())
    with httpx.Client(base_url=server.url, timeout=10) as c:
        c.get(f"/v1/jobs/{job.job_id}/plan?rank=0&token={job.token}")
        c.get(f"/v1/jobs/{job.job_id}/plan?rank=0&access_token={TOKEN_PATTERN}")
        mark = len(server.log_text())
        for _ in range(20):
            c.get(f"/v1/jobs/{job.job_id}/plan", params={"rank": 0}, headers=job.auth)
    time.sleep(0.5)
    log = server.log_text()
    leaked = job.token in log[before:] or TOKEN_PATTERN in log[before:]
    polls = sum("/plan" in line for line in log[mark:].splitlines())
    return f"token in log: {'yes' if leaked else 'no'}; 20 polls -> {polls} log lines"


def attack_planning(server: Server, job: Job) -> str:
    big = create_job(server.url, stages=4, microbatches=32_768, plan=False)
    with httpx.Client(base_url=server.url, timeout=120) as c:
        last = None
        for stage in range(4):
            body = {"rank": stage, "stage": stage, "rows": ROWS[stage]}
            last = c.post(f"/v1/jobs/{big.job_id}/profiles", json=body, headers=big.auth)
        answer = f"{last.status_code}" if last is not None else "-"
        if last is not None and last.status_code >= 400:
            answer += f" {last.json().get('error')}"
        started = time.monotonic()
        small = create_job(server.url, stages=2, microbatches=2, plan=False)
        for stage in range(2):
            body = {"rank": stage, "stage": stage, "rows": ROWS[stage]}
            c.post(f"/v1/jobs/{small.job_id}/profiles", json=body, headers=small.auth)
        planned = wait_plan(c, small, timeout_s=20) is not None
    waited = time.monotonic() - started
    return f"big job's last profile -> {answer}; small job after it " + (
        f"planned in {waited:.0f} s" if planned else "not planned in 20 s"
    )


def attack_versions(server: Server, job: Job, other: Server) -> str:
    went_back = 0
    trials = 10
    kinds = [{"kind": "max-slowdown", "factor": 1.05}, {"kind": "no-slowdown"}]
    with (
        httpx.Client(base_url=server.url, timeout=30) as a,
        httpx.Client(base_url=other.url, timeout=30) as b,
    ):
        plan = f"/v1/jobs/{job.job_id}/plan"
        for i in range(trials):
            b.get(plan, params={"rank": 0}, headers=job.auth)  # b caches the current version
            r = a.put(f"/v1/jobs/{job.job_id}/policy", json=kinds[i % 2], headers=job.auth)
            version = r.json().get("version")
            headers = {**job.auth, "If-None-Match": f'"{version}"'}
            got = b.get(plan, params={"rank": 0, "wait_s": 2}, headers=headers)
            if got.status_code == 200 and int(got.headers["etag"].strip('"')) < version:
                went_back += 1
    return f"older version served {went_back}/{trials}"


def attack_stalled_bodies(server: Server, job: Job) -> str:
    head = (
        f"POST /v1/jobs/{job.job_id}/profiles HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {job.token}\r\n"
        "Content-Length: 100000\r\n\r\n"
    ).encode() + b'{"rank": 0, "stage": 0, "rows": ['
    with idle_sockets(server.port, STALLED_BODIES) as socks:
        for sock in socks:
            sock.sendall(head)
        time.sleep(STALL_WAIT_S)
        ok, _ = _timed_gets(server.url, "/healthz", {}, 5)
        held = 0
        for sock in socks:
            sock.settimeout(0.05)
            try:
                held += sock.recv(1) != b""
            except TimeoutError:
                held += 1
            except OSError:
                pass
    return (f"{held}/{len(socks)} stalled bodies still held after {STALL_WAIT_S:.0f} s; "
            f"healthz {ok}/5")  # fmt: skip


ATTACKS: list[tuple[str, Callable[[Server, Job], str]]] = [
    ("idle sockets", attack_idle),
    ("big bodies, no token", attack_bodies),
    ("keep-alive reuse at 4.95 s", attack_keepalive),
    ("loose types", attack_types),
    ("contract drift", attack_contract),
    ("token in log, plan polls", attack_log),
    ("stalled bodies, with token", attack_stalled_bodies),
]


# ----------------------------------------------------------------------------- issue 24

RANK_SCRIPT = r"""
import json, logging, resource, sys, threading, time
from pathlib import Path
import httpx
attack = sys.argv[1]
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger("perseus").addHandler(Keep())
logging.getLogger("perseus").setLevel(logging.INFO)
if attack == "nonvml":
    import perseus.client
    try:
        rank = perseus.client.connect(gpu="nvml", server="http://127.0.0.1:9", job="j",
                                      token="t", install_signal_handlers=False)
    except Exception as err:
        print(f"connect() raised {type(err).__name__}: training dies")
    else:
        errors = [r for r in records if r.levelno >= logging.ERROR]
        tb = sum(r.exc_info is not None for r in errors)
        print(f"training goes on: {len(errors)} error line, {tb} tracebacks")
    raise SystemExit(0)
from perseus.client.gpu.fake import FakeGpu
from perseus.client.api.client import PlannerClient
from perseus.client.rank import Rank
from perseus.client.settings import load_settings
from perseus.schemas import JobView
JOB = "abuse"
ORDER = [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)]
VIEW = JobView.model_validate({"job_id": JOB, "name": None, "state": "ready", "reason": None,
    "spec": {"schedule": "1f1b", "stages": 1, "microbatches": 2, "data_parallel": 1,
             "tensor_parallel": 1},
    "policy": {"kind": "no-slowdown"}, "straggler": None, "version": 1,
    "counts": {"ranks_expected": 1, "ranks_registered": 1, "profiles_reported": 1,
               "stages_profiled": 1, "iterations_reported": 0},
    "frontier_points": None, "planning_s": None, "chosen": None, "telemetry": None}
).model_dump_json()
def plan(version, mhz, repeat=1):
    ins = [{"instruction": k, "microbatch": j, "chunk": None, "frequency_mhz": mhz,
            "time_s": 0.01} for k, j in ORDER * repeat]
    return json.dumps({"job_id": JOB, "version": version, "stage": 0, "time_s": 1.0,
                       "energy_j": 1.0, "instructions": ins}).encode()
class Planner:
    def __init__(self, plans, switch_s=None):
        self.plans, self.switch_s, self.t0 = plans, switch_s, time.monotonic()
        self.polls, self.reports = 0, []
    def current(self):
        late = self.switch_s is not None and time.monotonic() - self.t0 > self.switch_s
        return len(self.plans) if late else 1
    def handle(self, request):
        path = request.url.path.removeprefix(f"/v1/jobs/{JOB}")
        if request.method == "GET" and path == "":
            return httpx.Response(200, text=VIEW)
        if path == "/ranks":
            return httpx.Response(200, json={"rank": 0, "state": "ready", "ranks_registered": 1})
        if path == "/profiles":
            return httpx.Response(200, json={"rank": 0, "state": "ready",
                                             "profiles_reported": 1, "planning": False})
        if path == "/plan":
            self.polls += 1
            version = self.current()
            if not self.plans or request.headers.get("If-None-Match") == f'"{version}"':
                return httpx.Response(304)  # at once, as a proxy cutting long polls would
            return httpx.Response(200, content=self.plans[version - 1],
                                  headers={"ETag": f'"{version}"'})
        if path == "/iterations":
            report = json.loads(request.content)
            self.reports.append(report)
            return httpx.Response(200, json={"rank": 0, "iteration": report["iteration"],
                                             "version": 1})
        return httpx.Response(404, json={"detail": "no", "error": "JobNotFound"})
def run(planner, seconds):
    example = Path("perseus/data/example_profile.csv").resolve()
    settings = load_settings({"PERSEUS_BASELINE_ITERATIONS": "0"}, server="http://p.test",
        job=JOB, token="t", stage=0, gpu="fake", profile_path=str(example), poll_wait_s=30.0)
    http = httpx.Client(base_url="http://p.test", transport=httpx.MockTransport(planner.handle))
    rank = Rank(settings, gpu=FakeGpu(), planner=PlannerClient(http, JOB, "t"))
    times = []
    cpu0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        with rank.iteration():
            for kind, j in ORDER:
                with rank.instruction(kind, j):
                    time.sleep(0.002)
        times.append(time.monotonic() - t)
    cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) - cpu0
    version, enabled = rank.plan_version, rank.controller.enabled
    rank.close()
    return times, cpu, version, enabled
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
if attack == "poll304":
    p = Planner([])
    times, cpu, *_ = run(p, 5.0)
    print(f"{p.polls / 5:.0f} plan requests/s; {cpu:.1f} s CPU in 5 s of training")
elif attack == "hugeplan":
    p = Planner([plan(1, 1500, repeat=65536)])  # 262,144 instructions, ~20 MB
    times, cpu, version, _ = run(p, 6.0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0
    print(f"20 MB plan: slowest iteration {max(times):.2f} s (median "
          f"{sorted(times)[len(times) // 2] * 1e3:.0f} ms), RSS +{rss:.0f} MB, "
          f"follows {version}")
elif attack == "badplan":
    p = Planner([plan(1, 1234), plan(2, 1500)], switch_s=3.0)
    times, cpu, version, enabled = run(p, 8.0)
    claims = sum(r.get("plan_version") == 1 for r in p.reports)
    print(f"v1 (unsupported clock), then v2: follows v{version}, clock control "
          f"{'on' if enabled else 'off'}, {claims} reports claim v1")
"""

SERVER_RANK_SCRIPT = r"""
import logging, sys, time
attack, url, job, token = sys.argv[1:5]
from perseus.client.gpu.fake import FakeGpu
from perseus.client.api.client import PlannerClient
from perseus.client.rank import Rank
from perseus.client.settings import ClientSettings
def make():
    s = ClientSettings(server=url, job=job, token=token, stage=0, gpu="fake", poll_wait_s=1.0)
    return Rank(s, gpu=FakeGpu(), planner=PlannerClient.open(url, job, token))
if attack == "gaveup":
    rank = make()
    rank.bind(schedule="1f1b", microbatches=2)  # the job has 4
    time.sleep(4)
    rank.close()
elif attack == "tworanks":
    first, second = make(), make()
    time.sleep(4)
    print(f"first: {first.failure or 'fine'} | second: {second.failure or 'fine'}"[:200])
    first.close(); second.close()
"""


def _checkout_python(checkout: Path, script: str, *args: str, timeout_s: float = 120) -> str:
    """Run ``script`` with the checkout's perseus; its last line of output."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "PERSEUS_SERVER": ""}
    try:
        done = subprocess.run([sys.executable, "-c", script, *args], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"no answer in {timeout_s:.0f} s"
    lines = (done.stdout.strip() or done.stderr.strip() or "(nothing)").splitlines()
    return lines[-1][:150] if done.returncode == 0 else f"exit {done.returncode}: {lines[-1][:120]}"


def attack_max_wait_zero(checkout: Path, workdir: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(checkout), "PERSEUS_MAX_WAIT_S": "0"}
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "perseus.server", "--port", str(port),
         "--database", f"sqlite:///{workdir / 'wait0.db'}"],
        env=env, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return "accepted: the server starts and answers polls at once"
            time.sleep(0.1)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(20)
    text = process.stdout.read() if process.stdout else ""
    said = [line for line in text.splitlines() if "MAX_WAIT" in line]
    return f"refused at start: {said[0].strip()[:90]}" if said else "did not start"


def attack_gave_up(checkout: Path, server: Server) -> str:
    job = create_job(server.url, stages=1, microbatches=4, plan=False)
    _checkout_python(checkout, SERVER_RANK_SCRIPT, "gaveup", server.url, job.job_id, job.token)
    view = httpx.get(f"{server.url}/v1/jobs/{job.job_id}", headers=job.auth).json()
    gave_up = view.get("gave_up")
    if gave_up is None:
        return f"job view: state {view['state']}, no trace of the rank that gave up"
    return f"job view: state {view['state']}, {len(gave_up)} rank gave up: " + (
        gave_up[0]["reason"][:60] if gave_up else "-"
    )


def attack_two_ranks(checkout: Path, server: Server) -> str:
    job = create_job(server.url, stages=1, microbatches=2, plan=False)
    return _checkout_python(
        checkout, SERVER_RANK_SCRIPT, "tworanks", server.url, job.job_id, job.token
    )


def attack_rerun(checkout: Path, server: Server) -> str:
    job = create_job(server.url, stages=4, microbatches=4, plan=True)
    with httpx.Client(base_url=server.url, timeout=60) as c:

        def version_now() -> int:
            view = c.get(f"/v1/jobs/{job.job_id}", headers=job.auth).json()
            return int(view["version"]) if view["state"] == "ready" else 0

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and version_now() < 1:
            time.sleep(0.2)
        first = version_now()
        for stage in range(4):  # the re-run's profiles
            body = {"rank": stage, "stage": stage, "rows": ROWS[stage]}
            c.post(f"/v1/jobs/{job.job_id}/profiles", json=body, headers=job.auth)
        deadline = time.monotonic() + 15
        version = first
        while time.monotonic() < deadline and version <= first:
            version = version_now()
            time.sleep(0.2)
    replan = subprocess.run(
        [sys.executable, "-m", "perseus.cli", "job", "replan", "--help"],
        env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout, capture_output=True,
    ).returncode == 0  # fmt: skip
    command = "a 'perseus job replan' command" if replan else "no replan command"
    if version <= first:
        return f"profiles re-reported: still plan version {first} (old profiles); {command}"
    return f"profiles re-reported: replanned (version {first} -> {version}); {command}"


def _status(url: str) -> str:
    try:
        return str(httpx.get(url, timeout=5).status_code)
    except httpx.HTTPError:
        return "refused"


def attack_storage(checkout: Path, workdir: Path) -> str:
    where = workdir / "fs"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "none", str(where)]).returncode != 0:
        return "not run: mounting a tmpfs is not allowed"
    said = []
    try:
        for suffix in ("-shm", "-wal", ""):
            db = where / f"p{suffix or '-main'}.db"
            server = Server(checkout, f"sqlite:///{db}", workdir / "storage.log").start()
            try:
                create_job(server.url, stages=1, microbatches=2, plan=False)
                target = f"{db}{suffix}"
                bind = f"mount --bind {target} {target} && mount -o remount,ro,bind {target}"
                subprocess.run(bind, shell=True, check=True)
                spec = {"schedule": "1f1b", "stages": 1, "microbatches": 2,
                        "data_parallel": 1, "tensor_parallel": 1}  # fmt: skip
                codes = []
                for _ in range(3):
                    try:
                        answer = httpx.post(f"{server.url}/v1/jobs", json=spec)
                        codes.append(str(answer.status_code))
                    except httpx.HTTPError:
                        codes.append("refused")
                    time.sleep(0.3)
                # New connections (concurrent reads) open the files as they are now.
                with concurrent.futures.ThreadPoolExecutor(16) as pool:
                    reads = list(pool.map(_status, [f"{server.url}/v1/jobs"] * 32))
                codes.append(f"reads {sum(r == '200' for r in reads)}/32 ok")
                alive = server.process is not None and server.process.poll() is None
                health = "-"
                with contextlib.suppress(httpx.HTTPError):
                    health = str(httpx.get(f"{server.url}/healthz", timeout=2).status_code)
                if subprocess.run(["umount", target]).returncode != 0:
                    subprocess.run(["umount", "-l", target])
                time.sleep(2.5)
                after = "-"
                with contextlib.suppress(httpx.HTTPError):
                    after = str(httpx.get(f"{server.url}/healthz", timeout=2).status_code)
                code = server.process.poll() if server.process is not None else None
                state = "alive" if alive else f"dead (exit {code})"
                said.append(
                    f"{suffix or 'main'}: {state}, writes {'/'.join(codes)}, healthz "
                    f"{health}, then {after}"
                )
            finally:
                server.stop()
    finally:
        subprocess.run(["umount", "-l", str(where)])
    return "; ".join(said)


BEFORE_24 = "600bf05"
"""The commit issue 24's remaining items (3, 5, 10-14) were measured against."""

RANK_ATTACKS = [
    ("304 at once, rank polls", "poll304"),
    ("20 MB plan to a rank", "hugeplan"),
    ("bad plan, then a good one", "badplan"),
    ("no NVML, PERSEUS_GPU=nvml", "nonvml"),
]
SERVER_ATTACKS: list[tuple[str, Callable[[Path, Server], str]]] = [
    ("rank rejects its job", attack_gave_up),
    ("one rank, two processes", attack_two_ranks),
    ("re-run on a planned job", attack_rerun),
]
ISSUE_24 = [name for name, _ in RANK_ATTACKS] + [
    "PERSEUS_MAX_WAIT_S=0",
    *(name for name, _ in SERVER_ATTACKS),
    "read-only -shm, -wal, main",
]


def run_issue_24(checkout: Path, workdir: Path) -> dict[str, str]:
    """Issue 24's attacks on the rank (the checkout's client) and the server."""
    results: dict[str, str] = {}

    def record(name: str, run: Callable[[], str]) -> None:
        try:
            results[name] = run()
        except Exception as exc:  # a benchmark reports, it does not stop
            results[name] = f"error: {type(exc).__name__}: {exc}"[:120]
        print(f"  {checkout.name:<20} {name:<28} {results[name]}", flush=True)

    for name, attack in RANK_ATTACKS:
        record(name, lambda attack=attack: _checkout_python(checkout, RANK_SCRIPT, attack))
    record("PERSEUS_MAX_WAIT_S=0", lambda: attack_max_wait_zero(checkout, workdir))
    for name, server_attack in SERVER_ATTACKS:
        server = Server(checkout, f"sqlite:///{workdir / 'p24.db'}", workdir / "p24.log").start()
        try:
            record(name, lambda a=server_attack, s=server: a(checkout, s))
        finally:
            server.stop()
    record("read-only -shm, -wal, main", lambda: attack_storage(checkout, workdir))
    return results


# ----------------------------------------------------------------------------- round E

BEFORE_E = "237a349"
"""The commit round E's attacks were measured against."""
MANY_JOBS = 1050
SPEC = {"schedule": "1f1b", "stages": 4, "microbatches": 4, "data_parallel": 1,
        "tensor_parallel": 1, "p_block_w": 100.0}  # fmt: skip


def _page_query(checkout: Path) -> str:
    """The overview query the checkout's web page sends first (its own ui.js, read)."""
    script = (checkout / "perseus/server/api/static/ui.js").read_text()
    found = re.search(r"get\(\s*[`\"](overview[^`\"]*)[`\"]", script)
    query = found.group(1) if found else "overview"
    # The page's first fetch: its first page, in its default order.
    for name, value in (("PAGE", "50"), ("offset", "0"), ("order", "newest")):
        query = query.replace("${" + name + "}", value)
    return query


def attack_many_jobs(checkout: Path, server: Server) -> str:
    """1,050 jobs: what the checkout's page asks for, shows and says; then /metrics after a
    job planned behind them."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        ids = [c.post("/v1/jobs", json=SPEC).json()["job_id"] for _ in range(MANY_JOBS)]
        query = _page_query(checkout)
        page = c.get(f"/v1/{query}").json()
        shown = [v["job_id"] for v in page["jobs"]]
        said = page.get("total", len(shown))  # the status line: the total, else the rows
        reachable: set[str] = set(shown)
        if "offset=" in query:  # the page's pager: every page in turn
            for offset in range(len(shown), said, len(shown) or 1):
                more = c.get(f"/v1/{query.replace('offset=0', f'offset={offset}')}").json()
                reachable |= {v["job_id"] for v in more["jobs"]}
        newest = "yes" if ids[-1] in shown else "no"
        return (
            f"page: {len(shown)} rows, newest shown {newest}, says {said} jobs, "
            f"{len(reachable & set(ids))}/{MANY_JOBS} reachable"
        )


def attack_metrics_after_many(checkout: Path, server: Server) -> str:
    """A job planned behind 1,050 unplanned ones (the previous attack's): its gauges."""
    job = create_job(server.url)
    text = httpx.get(f"{server.url}/metrics", timeout=60).text
    series = [line for line in text.splitlines() if line.startswith("perseus_job_plan_version{")]
    has = any(f'job="{job.job_id}"' in line for line in series)
    return f"planned job's gauges: {'present' if has else 'missing'}, {len(series)} plan series"


def attack_nul(checkout: Path, server: Server) -> str:
    """NUL in a job name and a gave-up reason: the answers, and tracebacks logged."""
    with httpx.Client(base_url=server.url, timeout=30) as c:
        name = c.post("/v1/jobs", json={**SPEC, "name": "bert\x00"})
        created = c.post("/v1/jobs", json=SPEC).json()
        job = Job(created["job_id"], created["token"])
        path = f"/v1/jobs/{job.job_id}"
        reason = c.post(f"{path}/ranks:gave-up", json={"rank": 0, "reason": "no\x00clocks"},
                        headers=job.auth)  # fmt: skip
        kind = (
            "json"
            if reason.headers.get("content-type", "").startswith("application/json")
            else "text"
        )
        stored = "-"
        if reason.status_code == 200:
            stored = repr(c.get(path, headers=job.auth).json()["gave_up"][0]["reason"])
    time.sleep(0.5)
    tracebacks = server.log_text().count("Traceback")
    return (
        f"name {name.status_code}, reason {reason.status_code} {kind} (stored {stored}), "
        f"{tracebacks} tracebacks"
    )


def attack_full_disk(checkout: Path, workdir: Path) -> str:
    """The disk fills (96 KB left) once a job's last profile is in, while it plans: the
    job's state then, and 60 s after the space returns."""
    where = workdir / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "none", str(where)]).returncode:
        return "not run: mounting a tmpfs is not allowed"
    server = Server(checkout, f"sqlite:///{where / 'p.db'}", workdir / "full.log")
    # A long lease: few heartbeats while the disk is full.
    os.environ["PERSEUS_PLANNING_LEASE_S"] = "30"
    try:
        server.start()
        job = create_job(server.url, plan=False)
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for stage in range(4):
                body = {"rank": stage, "stage": stage, "rows": ROWS[stage]}
                c.post(f"/v1/jobs/{job.job_id}/profiles", json=body, headers=job.auth)
            room = os.statvfs(where)
            filler = where / "filler"
            filler.write_bytes(bytes(room.f_bavail * room.f_frsize - 96 * 1024))
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                state = c.get(f"/v1/jobs/{job.job_id}", headers=job.auth).json()["state"]
                if state != "planning" or "disk is full" in server.log_text():
                    break
                time.sleep(0.2)
            full = c.get(f"/v1/jobs/{job.job_id}", headers=job.auth).json()
            filler.unlink()
            got = wait_plan(c, job, timeout_s=60)
            after = c.get(f"/v1/jobs/{job.job_id}", headers=job.auth).json()
        then = f"ready v{after['version']}" if got is not None else after["state"]
        return f"disk full: {full['state']}; 60 s after space returns: {then}"
    finally:
        os.environ.pop("PERSEUS_PLANNING_LEASE_S", None)
        server.stop()
        subprocess.run(["umount", "-l", str(where)])


def attack_restored_backup(checkout: Path, workdir: Path) -> str:
    """Back up at plan v1, ranks reach v3, restore, a policy change (v2): what a rank
    sending If-None-Match "3" gets (wait_s=2)."""
    import shutil
    import sqlite3

    db = workdir / "restore.db"
    backup = workdir / "backup.db"
    server = Server(checkout, f"sqlite:///{db}", workdir / "restore.log").start()
    try:
        job = create_job(server.url)
        with sqlite3.connect(db) as source, sqlite3.connect(backup) as copy:
            source.backup(copy)
        for factor in (1.05, 1.1):
            httpx.put(f"{server.url}/v1/jobs/{job.job_id}/policy", headers=job.auth,
                      json={"kind": "max-slowdown", "factor": factor}, timeout=60)  # fmt: skip
    finally:
        server.stop()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, db)
    server = Server(checkout, f"sqlite:///{db}", workdir / "restore.log").start()
    try:
        httpx.put(f"{server.url}/v1/jobs/{job.job_id}/policy", headers=job.auth,
                  json={"kind": "max-slowdown", "factor": 1.2}, timeout=60)  # fmt: skip
        headers = {**job.auth, "If-None-Match": '"3"'}
        r = httpx.get(f"{server.url}/v1/jobs/{job.job_id}/plan", headers=headers,
                      params={"rank": 0, "wait_s": 2}, timeout=30)  # fmt: skip
        return (
            f'If-None-Match "3" after restore + v2: {r.status_code}, ETag {r.headers.get("etag")}'
        )
    finally:
        server.stop()


_PROFILE_FILE = """
import contextlib, io, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # MemoryError, not the OOM killer
where, row = sys.argv[1], sys.argv[2]
path = Path(sys.argv[3])
example = Path("perseus/data/example_profile.csv").read_text()
path.write_text(example + row + "\\n")
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        if where == "plan":
            from perseus.cli import main
            outcome = f"exit {main(['plan', str(path), '--microbatches', '4', '--p-block', '80'])}"
        else:
            import perseus.client
            rank = perseus.client.connect(gpu="fake", server="http://127.0.0.1:9", job="j",
                                          token="t", stage=0, profile_path=str(path),
                                          install_signal_handlers=False)
            rank.close()
            outcome = "connect() accepted it"
except BaseException as exc:
    outcome = f"{type(exc).__name__}"
    if type(exc).__name__ == "SettingsError":
        err.write(str(exc) + "\\n")
lines = err.getvalue().splitlines()
said = f"{len(lines)} line(s), {max(map(len, lines), default=0)} chars" if lines else "silent"
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"{outcome}; {said}; peak {peak} MB")
"""


def attack_profile_file(checkout: Path, workdir: Path, where: str, row: str) -> str:
    """A profile with one malformed row (a typo) read by ``perseus plan`` or by a rank's
    ``connect()`` (``PERSEUS_PROFILE``), under a 4 GB address-space limit: the outcome, what
    it said on stderr and the peak RSS."""
    path = workdir / f"typo-{where}.csv"
    return _checkout_python(checkout, _PROFILE_FILE, where, row, str(path), timeout_s=300)


ROUND_E = [
    "1,050 jobs, the web page",
    "/metrics, planned after 1,050",
    "NUL in text, SQLite",
    "NUL in text, PostgreSQL",
    "full disk while storing",
    "restored backup, rank at v3",
    "profile stage 999999999999, plan",
    "profile time 1e308, plan",
    "profile stage 999999999999, connect",
]
_TYPOS = {
    ROUND_E[6]: ("plan", "999999999999,forward,1410,0.05,24"),
    ROUND_E[7]: ("plan", "0,forward,1410,1e308,24"),
    ROUND_E[8]: ("connect", "999999999999,forward,1410,0.05,24"),
}


def run_round_e(checkout: Path, workdir: Path) -> dict[str, str]:
    """Round E's attacks on fresh servers of ``checkout``."""
    results: dict[str, str] = {}

    def record(name: str, run: Callable[[], str]) -> None:
        try:
            results[name] = run()
        except Exception as exc:  # a benchmark reports, it does not stop
            results[name] = f"error: {type(exc).__name__}: {exc}"[:120]
        print(f"  {checkout.name:<20} {name:<30} {results[name]}", flush=True)

    server = Server(checkout, f"sqlite:///{workdir / 'many.db'}", workdir / "many.log").start()
    try:
        record(ROUND_E[0], lambda: attack_many_jobs(checkout, server))
        record(ROUND_E[1], lambda: attack_metrics_after_many(checkout, server))
    finally:
        server.stop()
    postgres = os.environ.get("PERSEUS_TEST_POSTGRES_URL")
    for name, database in ((ROUND_E[2], f"sqlite:///{workdir / 'nul.db'}"), (ROUND_E[3], postgres)):
        if database is None:
            results[name] = "not run: PERSEUS_TEST_POSTGRES_URL is not set"
            continue
        if database.startswith("postgresql"):
            _empty_postgres(checkout, database)
        server = Server(checkout, database, workdir / f"nul-{len(results)}.log").start()
        try:
            record(name, lambda s=server: attack_nul(checkout, s))
        finally:
            server.stop()
    record(ROUND_E[4], lambda: attack_full_disk(checkout, workdir))
    record(ROUND_E[5], lambda: attack_restored_backup(checkout, workdir))
    for name, (where, row) in _TYPOS.items():
        record(name, lambda w=where, r=row: attack_profile_file(checkout, workdir, w, r))
    return results


def _empty_postgres(checkout: Path, url: str) -> None:
    script = (
        "import sys; from perseus.server.store.job_store import Store; "
        "s = Store(sys.argv[1]); s.drop_schema(); s.close()"
    )
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "-c", script, url], cwd=checkout, env=env, check=True,
                   capture_output=True)  # fmt: skip


def run_side(checkout: Path, workdir: Path) -> dict[str, str]:
    """Every attack on a fresh server process of ``checkout`` (one database, one job)."""
    results: dict[str, str] = {}
    database = f"sqlite:///{workdir / 'perseus.db'}"
    log = workdir / "server.log"
    server = Server(checkout, database, log).start()
    try:
        job = create_job(server.url)
    finally:
        server.stop()
    for name, attack in [*ATTACKS, ("version going back", None), ("planning bounds", None)]:
        server = Server(checkout, database, log).start()
        other = None
        try:
            if name == "version going back":
                other = Server(checkout, database, workdir / "other.log").start()
                results[name] = attack_versions(server, job, other)
            elif name == "planning bounds":
                results[name] = attack_planning(server, job)
            else:
                assert attack is not None
                results[name] = attack(server, job)
        except Exception as exc:  # a benchmark reports, it does not stop
            results[name] = f"error: {type(exc).__name__}: {exc}"[:120]
        finally:
            server.stop()
            if other is not None:
                other.stop()
        print(f"  {checkout.name:<20} {name:<28} {results[name]}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, default=Path("/tmp/perseus-before-12"))
    parser.add_argument("--before-24", type=Path, default=Path("/tmp/perseus-before-24"))
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument(
        "--only",
        choices=("12", "24", "E"),
        help="only the attacks of issue 12, of issue 24, or of round E",
    )
    parser.add_argument("--before-e", type=Path, default=Path("/tmp/perseus-before-e"))
    args = parser.parse_args()
    if args.only == "E":
        if not args.before_e.exists():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach",
                            str(args.before_e), BEFORE_E], check=True)  # fmt: skip
        sides_e = []
        for checkout in (args.before_e, args.after):
            with tempfile.TemporaryDirectory(prefix="perseus-abuse-e-") as tmp:
                sides_e.append(run_round_e(checkout.resolve(), Path(tmp)))
        width = max(len(n) for n in ROUND_E)
        print("\nround E: the server under attack, loopback")
        print(f"{'attack':<{width}}  {'before (' + BEFORE_E + ')':<72}  after")
        for name in ROUND_E:
            print(f"{name:<{width}}  {sides_e[0].get(name, '-'):<72}  {sides_e[1].get(name, '-')}")
        print(json.dumps({"before": sides_e[0], "after": sides_e[1]}))
        return 0
    if args.only != "12":
        if not args.before_24.exists():
            subprocess.run(["git", "clone", "-q", str(ROOT), str(args.before_24)], check=True)
            subprocess.run(["git", "-C", str(args.before_24), "checkout", "-q", BEFORE_24],
                           check=True)  # fmt: skip
        sides24 = []
        for checkout in (args.before_24, args.after):
            with tempfile.TemporaryDirectory(prefix="perseus-abuse-24-") as tmp:
                sides24.append(run_issue_24(checkout.resolve(), Path(tmp)))
        width = max(len(n) for n in ISSUE_24)
        print("\nissue 24: the rank and the server under attack, loopback")
        print(f"{'attack':<{width}}  {'before (' + BEFORE_24 + ')':<72}  after")
        for name in ISSUE_24:
            print(f"{name:<{width}}  {sides24[0].get(name, '-'):<72}  {sides24[1].get(name, '-')}")
        print(json.dumps({"before": sides24[0], "after": sides24[1]}))
        if args.only == "24":
            return 0
    if not args.before.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(args.before)], check=True)
    # This process holds the idle sockets: it needs more than 1,024 descriptors itself.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    sides: list[dict[str, str]] = []
    for checkout in (args.before, args.after):
        with tempfile.TemporaryDirectory(prefix="perseus-abuse-") as tmp:
            sides.append(run_side(checkout.resolve(), Path(tmp)))
    names = [name for name, _ in ATTACKS] + ["version going back", "planning bounds"]
    width = max(len(n) for n in names)
    print(f"\nserver under attack, open-file limit {FD_LIMIT}, loopback")
    print(f"{'attack':<{width}}  {'before (' + args.before.name + ')':<70}  after")
    for name in names:
        print(f"{name:<{width}}  {sides[0].get(name, '-'):<70}  {sides[1].get(name, '-')}")
    print(json.dumps({"before": sides[0], "after": sides[1]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
