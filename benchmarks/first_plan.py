"""Time to the first plan: the whole fake-GPU flow with default settings, start to plan.

    python benchmarks/first_plan.py                      # this checkout only
    python benchmarks/first_plan.py --before DIR         # and an older checkout beside it

For each flow (2-rank ZBV: ``zbv``, 2 stages of 2 chunks, 8 microbatches; 4-rank 1F1B: 4 stages,
8 microbatches) and each checkout, a planner server (``python -m perseus.server``, SQLite in a
temporary folder) and ``torchrun`` ranks running ``examples/torch_pipeline.py`` with
``PERSEUS_GPU=fake`` and no other setting (the online profile's defaults) start from that
checkout's code; "seconds" is from the launch of ``torchrun`` until every rank's
``GET /v1/jobs/{job}/plan`` returns a plan. "clocks" is what rank 0 logged as profiled, "load"
the 1-minute load average when the flow started and when it ended (the fake GPU runs its work
on the CPU, so a loaded host slows every flow). The flows run one after the other, the older
checkout's first; nothing is random.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 1200.0


@dataclass(frozen=True)
class Flow:
    label: str
    schedule: str
    ranks: int
    virtual_stages: int
    microbatches: int = 8


FLOWS = (Flow("zbv 2 ranks", "zbv", 2, 2), Flow("1f1b 4 ranks", "1f1b", 4, 1))


@dataclass(frozen=True)
class Result:
    seconds: float | None  # None: no plan within TIMEOUT_S
    clocks: str
    load: str


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(checkout: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env.update(PYTHONPATH=str(checkout), OMP_NUM_THREADS="1")
    return env


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_flow(checkout: Path, flow: Flow, tmp: Path) -> Result:
    load_before = os.getloadavg()[0]
    port = _port()
    url = f"http://127.0.0.1:{port}"
    env = _env(checkout)
    server_log = (tmp / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "perseus.server", "--host", "127.0.0.1", "--port", str(port),
         "--database", f"sqlite:///{tmp / 'perseus.db'}", "--log-level", "warning"],
        env=env, cwd=checkout, stdout=server_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    ranks_log = tmp / "torchrun.log"
    launch: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"server did not start: {(tmp / 'server.log').read_text()}")
            time.sleep(0.2)
        spec = {
            "schedule": flow.schedule,
            "stages": flow.ranks,
            "microbatches": flow.microbatches,
            "virtual_stages": flow.virtual_stages,
            "data_parallel": 1,
            "tensor_parallel": 1,
        }
        created = httpx.post(f"{url}/v1/jobs", json=spec, timeout=10).json()
        job, token = created["job_id"], created["token"]
        env.update(PERSEUS_SERVER=url, PERSEUS_JOB=job, PERSEUS_TOKEN=token, PERSEUS_GPU="fake")
        with ranks_log.open("wb") as out:
            started = time.monotonic()
            launch = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                 str(flow.ranks), "--master-addr", "127.0.0.1", "--master-port", str(_port()),
                 "examples/torch_pipeline.py", "--schedule", flow.schedule,
                 "--microbatches", str(flow.microbatches), "--steps", "100000"],
                env=env, cwd=checkout, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        headers = {"Authorization": f"Bearer {token}"}
        planned: set[int] = set()
        seconds: float | None = None
        while time.monotonic() - started < TIMEOUT_S and launch.poll() is None:
            for rank in set(range(flow.ranks)) - planned:
                reply = httpx.get(
                    f"{url}/v1/jobs/{job}/plan", params={"rank": rank}, headers=headers, timeout=10
                )
                if reply.status_code == 200:
                    planned.add(rank)
            if len(planned) == flow.ranks:
                seconds = time.monotonic() - started
                break
            time.sleep(1.0)
    finally:
        if launch is not None:
            _stop(launch)
        _stop(server)
        server_log.close()
    text = ranks_log.read_text(errors="replace") if ranks_log.exists() else ""
    found = re.search(r"rank 0 profiled (\d+) clocks", text)
    return Result(
        seconds, found.group(1) if found else "-", f"{load_before:.1f}/{os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="an older checkout, run first")
    args = parser.parse_args()
    checkouts = [("before", args.before)] if args.before else []
    checkouts.append(("this", REPO))
    results: dict[tuple[str, str], Result] = {}
    for flow in FLOWS:
        for name, checkout in checkouts:
            with tempfile.TemporaryDirectory(prefix="perseus-first-plan-") as tmp:
                results[flow.label, name] = run_flow(checkout.resolve(), flow, Path(tmp))
    header = ["flow"]
    for name, _ in checkouts:
        header += [f"{name} s", f"{name} clocks", f"{name} load"]
    if args.before:
        header.append("this/before")
    rows = []
    for flow in FLOWS:
        cells = [flow.label]
        for name, _ in checkouts:
            r = results[flow.label, name]
            seconds = f">{TIMEOUT_S:.0f}" if r.seconds is None else f"{r.seconds:.0f}"
            cells += [seconds, r.clocks, r.load]
        if args.before:
            old, new = results[flow.label, "before"], results[flow.label, "this"]
            ratio = f"{new.seconds / old.seconds:.2f}" if old.seconds and new.seconds else "-"
            cells.append(ratio)
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


if __name__ == "__main__":
    main()
