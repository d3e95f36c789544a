"""The planner server under the attacks of issue 12, before and after: one row per attack.

    python benchmarks/server_abuse.py                       # before = a clone of HEAD
    python benchmarks/server_abuse.py --before /tmp/perseus-before-12 --after .

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

No asserts; the figures are printed as they come. Takes about 3 minutes.
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
    parser.add_argument("--after", type=Path, default=ROOT)
    args = parser.parse_args()
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
