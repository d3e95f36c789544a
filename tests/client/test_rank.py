"""The rank through its public API, in one process, against the real planner app.

The planner is the FastAPI app behind a TestClient (an httpx.Client), the GPU the fake one;
the training loop is the generic ``iteration()``/``instruction()`` API with a workload that
does nothing on the host (the fake GPU models the device time).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import perseus.client
from perseus.cli.job_views import format_job
from perseus.client.api.client import PlannerClient
from perseus.client.gpu.fake import FakeGpu, default_work
from perseus.client.profiling.online import ProfilingState
from perseus.client.rank import Rank
from perseus.client.settings import ClientSettings, ProfileBudget, SettingsError
from perseus.core.defaults import BASELINE_ITERATIONS
from perseus.schemas import JobView
from perseus.server.app import create_app
from perseus.server.settings import Settings
from perseus.solver.schedules import make_schedule

ORDER_1F1B = [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)]
ORDER_GPIPE = [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)]
EXAMPLE_PROFILE = Path(__file__).parents[2] / "perseus" / "data" / "example_profile.csv"
BUDGET = ProfileBudget(window_s=0.3, settle_s=0.05, clocks="1980,1500,1200,900", blocking_s=0.4)


class Nothing:
    """A workload with no host work: the fake GPU models the device time."""

    def forward(self) -> object:
        return None

    def backward(self, handle: object) -> None:
        pass

    def synchronize(self) -> None:
        pass


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database=f"sqlite:///{tmp_path / 'perseus.db'}",
        admin_token=None,
        warm_planner=False,
        planning_lease_s=3.0,
        cache_ttl_s=1.0,
        polish_s=0.0,
    )
    with TestClient(create_app(settings)) as client:
        yield client


def create(app: TestClient, **spec: Any) -> tuple[str, str]:
    body = {"stages": 1, "microbatches": 2, "data_parallel": 1, "tensor_parallel": 1} | spec
    reply = app.post("/v1/jobs", json=body)
    assert reply.status_code == 201, reply.text
    return reply.json()["job_id"], reply.json()["token"]


def make_rank(
    app: TestClient, job: str, token: str, tmp_path: Path, **settings: Any
) -> tuple[Rank, FakeGpu]:
    gpu = FakeGpu(work=default_work(0, 1))
    base = ClientSettings(
        server="http://testserver",
        job=job,
        token=token,
        stage=0,
        gpu="fake",
        budget=BUDGET,
        clock_log_dir=str(tmp_path / "clocks"),
        poll_wait_s=0.5,
    )
    base = dataclasses.replace(base, **settings)
    rank = Rank(base, gpu=gpu, planner=PlannerClient(app, job, token), workload=Nothing())
    return rank, gpu


def train(rank: Rank, iterations: int, order: list[tuple[str, int]]) -> None:
    for _ in range(iterations):
        with rank.iteration():
            for kind, microbatch in order:
                with rank.instruction(kind, microbatch):
                    pass


def train_until(rank: Rank, order: list[tuple[str, int]], done: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out; failure: {rank.failure}"
        train(rank, 1, order)


def log_lines(tmp_path: Path) -> list[dict[str, Any]]:
    """The clock log's complete lines (the reporter thread may be writing the next one)."""
    text = (tmp_path / "clocks" / "rank0.jsonl").read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def test_without_a_server_perseus_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    rank = perseus.client.connect(server=None, install_signal_handlers=False)
    assert not rank.active and rank.gpu is None
    train(rank, 2, ORDER_1F1B)
    rank.close()


def test_profile_plan_and_clock_log(app: TestClient, tmp_path: Path) -> None:
    job, token = create(app, schedule="1f1b")
    rank, gpu = make_rank(app, job, token, tmp_path)
    try:
        train_until(rank, ORDER_1F1B, lambda: rank.plan_version == 1, 90)
        train(rank, 3, ORDER_1F1B)
        assert rank.failure is None
        assert rank.profile is not None and len(rank.profile.measurements) == 4
        assert rank.p_block_w == pytest.approx(gpu.model.idle_power_w, rel=0.05)
    finally:
        rank.close()
    time.sleep(2 * gpu.model.clock_change_delay_s)  # a reset takes effect after the delay
    assert gpu.locked_clock_mhz is None  # reset at close
    plan = app.get(
        f"/v1/jobs/{job}/plan", params={"rank": 0}, headers={"Authorization": f"Bearer {token}"}
    ).json()
    expected = [
        (i["instruction"], i["microbatch"], 0, i["frequency_mhz"]) for i in plan["instructions"]
    ]
    lines = log_lines(tmp_path)
    planned = [e for e in lines if e["plan_version"] == 1]
    assert len(planned) >= 3 * len(expected)
    for start in range(0, len(planned), len(expected)):
        ran = [
            (e["instruction"], e["microbatch"], e["chunk"], e["frequency_mhz"])
            for e in planned[start : start + len(expected)]
        ]
        assert ran == expected
    assert all(e["phase"] == "plan" for e in planned)
    unplanned = [e for e in lines if e["plan_version"] is None]
    assert all(e["frequency_mhz"] is None and e["ran_mhz"] is not None for e in unplanned)
    # profiling first, then at least the default number of baseline iterations
    phases = [e["phase"] for e in unplanned if e["instruction"] == "forward"]
    phases = [p for i, p in enumerate(phases) if i % 2 == 0]  # one per iteration
    assert phases[0] == "profiling" and set(phases) == {"profiling", "baseline"}
    assert phases.count("baseline") >= BASELINE_ITERATIONS
    assert phases == sorted(phases, key=lambda p: p == "baseline")
    view = app.get(f"/v1/jobs/{job}", headers={"Authorization": f"Bearer {token}"}).json()
    assert view["counts"]["iterations_reported"] > 0


def test_the_job_view_shows_how_far_a_profiling_rank_got(app: TestClient, tmp_path: Path) -> None:
    # The job's own blocking power: planning then does not hang on the rank's idle-power
    # measurement, which a busy host can spoil (the counter not moving in its window).
    job, token = create(app, schedule="1f1b", p_block_w=150.0)
    rank, _ = make_rank(app, job, token, tmp_path)
    auth = {"Authorization": f"Bearer {token}"}

    def progress() -> dict[str, Any] | None:
        view = app.get(f"/v1/jobs/{job}", headers=auth).json()
        shown = [p for p in view.get("profiling", []) if p["clocks_done"] >= 1]
        return shown[0] if shown and view["state"] == "profiling" else None

    try:
        train_until(rank, ORDER_1F1B, progress, 90)
        seen = progress()
        assert seen is not None and rank.profiling_state is ProfilingState.SWEEPING
        done = seen["clocks_done"]
        assert seen["rank"] == 0 and 1 <= done < seen["clocks_planned"] == 4
        assert seen["seconds_per_clock"] > 0
        assert seen["time_left_s"] == pytest.approx(seen["seconds_per_clock"] * (4 - done))
        view = JobView.model_validate(app.get(f"/v1/jobs/{job}", headers=auth).json())
        line = r"^rank 0 +profiling: \d of 4 clocks, [\d.]+ s per clock, about \d+ s left$"
        assert re.search(line, format_job(view), re.MULTILINE), format_job(view)
        (activity,) = app.get(f"/v1/jobs/{job}/activity", headers=auth).json()["ranks"]
        assert activity["profiling"]["clocks_planned"] == 4
        # Once the rank has profiled, it is no longer shown as profiling.
        train_until(rank, ORDER_1F1B, lambda: rank.plan_version == 1, 90)
        train(rank, 2, ORDER_1F1B)
        rank.close()  # its reports are sent before it closes
        assert app.get(f"/v1/jobs/{job}", headers=auth).json().get("profiling", []) == []
    finally:
        rank.close()


def test_a_plan_for_another_order_is_refused_not_misapplied(
    app: TestClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The job says GPipe; the training loop runs 1F1B: the first planned iteration notices.
    job, token = create(app, schedule="gpipe")
    rank, gpu = make_rank(app, job, token, tmp_path)
    try:
        train_until(rank, ORDER_1F1B, lambda: rank.failure is not None, 90)
        train(rank, 2, ORDER_1F1B)
    finally:
        rank.close()
    assert "does not match the schedule" in (rank.failure or "")
    lines = log_lines(tmp_path)
    planned_iterations = {e["iteration"] for e in lines if e["frequency_mhz"] is not None}
    # At most the first instruction of the first planned iteration ran at a planned clock.
    assert len([e for e in lines if e["frequency_mhz"] is not None]) <= 1
    assert len(planned_iterations) <= 1
    assert gpu.locked_clock_mhz is None


def test_the_job_must_match_what_the_framework_runs(app: TestClient, tmp_path: Path) -> None:
    job, token = create(app, schedule="gpipe")
    rank, _ = make_rank(app, job, token, tmp_path)
    rank.bind(schedule="1f1b", microbatches=4)
    try:
        train_until(rank, ORDER_1F1B, lambda: rank.failure is not None, 30)
    finally:
        rank.close()
    assert "schedule '1f1b' runs, the job has 'gpipe'" in (rank.failure or "")
    assert "4 microbatches run, the job has 2" in (rank.failure or "")


def test_giving_up_after_a_plan_puts_the_default_clock_back(
    app: TestClient, tmp_path: Path
) -> None:
    # "training goes on at default clocks" must hold after a plan was followed, too: here the
    # job is deleted on the server, and the plan's lowered clocks must not stay.
    job, token = create(app, schedule="1f1b", policy={"kind": "min-energy"})
    rank, gpu = make_rank(app, job, token, tmp_path)
    try:
        train_until(rank, ORDER_1F1B, lambda: rank.plan_version == 1, 90)
        # The reporter thread writes the clock log behind training (CI once read it too soon).
        train_until(
            rank,
            ORDER_1F1B,
            lambda: any(e["frequency_mhz"] not in (None, 1980) for e in log_lines(tmp_path)),
            30,
        )
        reply = app.delete(f"/v1/jobs/{job}", headers={"Authorization": f"Bearer {token}"})
        assert reply.status_code == 204
        train_until(rank, ORDER_1F1B, lambda: rank.failure is not None, 30)
        gave_up_at = rank.iteration_index
        train(rank, 2, ORDER_1F1B)
        # The controller thread puts the default back (as the rank goes on at default
        # clocks); on a loaded host it may do so later than the two iterations take.
        deadline = time.monotonic() + 10
        while gpu.locked_clock_mhz is not None:
            assert time.monotonic() < deadline, f"still locked at {gpu.locked_clock_mhz} MHz"
            time.sleep(0.01)
    finally:
        rank.close()
    assert "no job" in (rank.failure or "")
    after = [e for e in log_lines(tmp_path) if e["iteration"] >= gave_up_at]
    assert after and all(e["frequency_mhz"] is None for e in after)


@pytest.mark.parametrize(
    ("schedule", "virtual_stages", "kinds"),
    [
        ("zbv", 2, {"forward", "backward_input", "backward_weight"}),
        ("1f1b", 1, {"forward", "backward"}),
    ],
)
def test_a_saved_profile_with_split_backward_rows_plans_without_profiling(
    app: TestClient, tmp_path: Path, schedule: str, virtual_stages: int, kinds: set[str]
) -> None:
    # The example profile has forward, backward and the backward's halves: each row keeps
    # its kind on upload, so a zero-bubble job and a 1F1B job both plan on it. (It has no
    # blocking power: the job gives it.)
    job, token = create(app, schedule=schedule, virtual_stages=virtual_stages, p_block_w=80.0)
    rank, _ = make_rank(app, job, token, tmp_path, profile_path=str(EXAMPLE_PROFILE))
    order = [
        (i.kind.value, i.microbatch, i.chunk)
        for i in make_schedule(schedule, 1, 2, virtual_stages).order[0]
    ]

    def run(iterations: int) -> None:
        for _ in range(iterations):
            with rank.iteration():
                for kind, microbatch, chunk in order:
                    with rank.instruction(kind, microbatch, chunk):
                        pass

    try:
        deadline = time.monotonic() + 60
        while rank.plan_version != 1:
            assert time.monotonic() < deadline, f"no plan; failure: {rank.failure}"
            run(1)
        run(2)
    finally:
        rank.close()
    assert rank.failure is None and rank.profile is None  # nothing was measured
    plan = app.get(
        f"/v1/jobs/{job}/plan", params={"rank": 0}, headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert {i["instruction"] for i in plan["instructions"]} == kinds
    expected = [
        (i["instruction"], i["microbatch"], i.get("chunk") or 0, i["frequency_mhz"])
        for i in plan["instructions"]
    ]
    planned = [
        (e["instruction"], e["microbatch"], e["chunk"], e["frequency_mhz"])
        for e in log_lines(tmp_path)
        if e["plan_version"] == 1
    ]
    assert len(planned) >= 2 * len(expected)
    assert planned[: len(expected)] == expected


def test_a_bad_saved_profile_is_refused_at_start_up(tmp_path: Path) -> None:
    http = httpx.Client(
        base_url="http://planner", transport=httpx.MockTransport(lambda r: httpx.Response(503))
    )
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1980,x,1\n")
    for path, stage, message in (
        (tmp_path / "missing.csv", 0, "cannot read"),
        (bad, 0, "bad.csv"),
        (EXAMPLE_PROFILE, 99, "this rank is stage 99"),
    ):
        settings = ClientSettings(
            server="http://planner", job="j", token="t", stage=stage, gpu="fake",
            profile_path=str(path),
        )  # fmt: skip
        with pytest.raises(SettingsError, match="PERSEUS_PROFILE") as raised:
            Rank(settings, gpu=FakeGpu(), planner=PlannerClient(http, "j", "t"))
        assert message in str(raised.value)


def test_an_unwritable_clock_log_stops_logging_not_telemetry_or_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (a disk that is always full)")
    (tmp_path / "clocks").mkdir()
    (tmp_path / "clocks" / "rank0.jsonl").symlink_to("/dev/full")
    http = httpx.Client(
        base_url="http://planner", transport=httpx.MockTransport(lambda r: httpx.Response(503))
    )
    settings = ClientSettings(
        server="http://planner", job="j", token="t", stage=0, gpu="fake",
        profile_path=str(EXAMPLE_PROFILE), clock_log_dir=str(tmp_path / "clocks"),
    )  # fmt: skip
    rank = Rank(
        settings, gpu=FakeGpu(work=default_work(0, 1)), planner=PlannerClient(http, "j", "t")
    )
    with caplog.at_level(logging.ERROR, logger="perseus.client"):
        try:
            train(rank, 3, ORDER_1F1B)
            deadline = time.monotonic() + 5.0
            while "clock log" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            train(rank, 2, ORDER_1F1B)
            assert rank.threads and all(t.is_alive() for t in rank.threads)  # telemetry goes on
        finally:
            rank.close()  # never raises
    assert "cannot write the clock log" in caplog.text and "rank0.jsonl" in caplog.text


def run_script(tmp_path: Path, text: str, *args: str, timeout: float) -> Any:
    """Run ``text`` as a training script (no PERSEUS_* variables; this checkout importable)
    with the example profile and ``args`` as its arguments."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env["PYTHONPATH"] = str(Path(__file__).parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, str(script), str(EXAMPLE_PROFILE), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def record_calls(monkeypatch: pytest.MonkeyPatch, gpu: Any, name: str) -> list[tuple[Any, ...]]:
    """Arguments of every later call of ``gpu.name`` (which still runs)."""
    calls: list[tuple[Any, ...]] = []
    original = getattr(gpu, name)

    def recorded(*args: Any) -> Any:
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(gpu, name, recorded)
    return calls


SIGTERM_SCRIPT = """
import os, signal, sys, threading, time
import httpx
import perseus.client
from perseus.cli.job_views import format_job
from perseus.client.api.client import PlannerClient

class SlowGpu:
    # Sets clocks inline (no CUDA events); a lock is an NVML call that takes a while.
    index, name, can_set_clocks = 0, "slow", True
    def supported_clocks_mhz(self): return (1980, 1200)
    def default_clock_mhz(self): return 1980
    def current_clock_mhz(self): return 1980
    def lock_clock(self, frequency_mhz): time.sleep(1.0)
    def reset_clock(self): print("reset", flush=True)
    def energy_j(self): return 0.0
    def power_w(self): return 0.0

http = httpx.Client(base_url="http://planner",
                    transport=httpx.MockTransport(lambda r: httpx.Response(503)))
rank = perseus.client.connect(server="http://planner", job="j", token="t", stage=0,
                              gpu=SlowGpu(), planner=PlannerClient(http, "j", "t"),
                              profile_path=sys.argv[1])
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
rank.controller.apply(1200)  # the training thread inside a clock change when SIGTERM comes
print("SIGTERM did not end the process", flush=True)
"""


def test_sigterm_during_an_inline_clock_change_resets_and_terminates(tmp_path: Path) -> None:
    # The handler closes the rank on the thread that holds the controller's lock: it must not
    # wait for that lock forever (the process would hang, deaf to SIGTERM).
    try:
        done = run_script(tmp_path, SIGTERM_SCRIPT, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung after SIGTERM")
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    assert "reset" in done.stdout


FORK_SCRIPT = """
import multiprocessing, sys
import httpx
import perseus.client
from perseus.cli.job_views import format_job
from perseus.client.api.client import PlannerClient

class Gpu:
    index, can_set_clocks = 0, True
    def __init__(self, name): self.name = name
    def supported_clocks_mhz(self): return (1980, 1200)
    def default_clock_mhz(self): return 1980
    def current_clock_mhz(self): return 1980
    def applied_clock_mhz(self): return 1980
    def lock_clock(self, frequency_mhz): pass
    def reset_clock(self): print("reset", self.name, flush=True)
    def energy_j(self): return 0.0
    def power_w(self): return 0.0

def connect(name):
    http = httpx.Client(base_url="http://planner",
                        transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    rank = perseus.client.connect(server="http://planner", job="j", token="t", stage=0,
                                  gpu=Gpu(name), planner=PlannerClient(http, "j", "t"),
                                  profile_path=sys.argv[1])
    rank.controller.apply(1200)  # a plan's clock
    rank.controller.fence()
    return rank

def child():
    connect("child")  # and the training function returns without closing the rank

if __name__ == "__main__":
    if sys.argv[2] == "parent-first":
        parent = connect("parent")
    worker = multiprocessing.get_context("fork").Process(target=child)
    worker.start()
    worker.join()
    print("child exited", worker.exitcode, flush=True)
"""


@pytest.mark.parametrize("order", ["child-only", "parent-first"])
def test_a_forked_worker_that_never_closes_its_rank_resets_its_gpu(
    tmp_path: Path, order: str
) -> None:
    # multiprocessing's forked children leave through os._exit, past atexit: the clock a plan
    # set must still be reset, by the child for its own rank only (the parent's rank is the
    # parent's to close, at its own exit).
    done = run_script(tmp_path, FORK_SCRIPT, order, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "child exited 0" in lines
    before_exit = lines[: lines.index("child exited 0")]
    assert before_exit.count("reset child") >= 1, done.stdout
    assert "reset parent" not in before_exit, done.stdout
    if order == "parent-first":
        assert "reset parent" in lines[lines.index("child exited 0") :], done.stdout


THREAD_FIRST_SCRIPT = (
    FORK_SCRIPT.split("if __name__")[0]
    + """
import signal, threading
if __name__ == "__main__":
    worker = threading.Thread(target=lambda: connect("thread").close())
    worker.start()
    worker.join()
    print("after thread:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    connect("main")
    print("after main:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
"""
)


def test_signal_handlers_come_with_the_first_connect_on_the_main_thread(tmp_path: Path) -> None:
    # Only the main thread may install them: a first connect() from another thread must not
    # stop a later one on the main thread from doing it.
    done = run_script(tmp_path, THREAD_FIRST_SCRIPT, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "after thread: True" in done.stdout and "after main: False" in done.stdout
    # the script ends without closing its rank: the exit resets the clock its plan set
    assert done.stdout.splitlines()[-1] == "reset main", done.stdout


def test_giving_up_during_the_sweep_stops_it_at_the_default_clock(
    app: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sweep measures on the training thread, between iterations, at lowered clocks: once
    # perseus has given up ("training goes on at default clocks") it must not go on.
    job, token = create(app, schedule="1f1b")
    rank, gpu = make_rank(app, job, token, tmp_path)
    locks = record_calls(monkeypatch, gpu, "lock_clock")
    try:
        train_until(rank, ORDER_1F1B, lambda: len(locks) >= 2, 30)
        assert rank.profiling_state is ProfilingState.SWEEPING
        rank.give_up("the planner refused this rank")
        locks.clear()
        train(rank, 3, ORDER_1F1B)
        assert locks == [] and rank.profiling_state is ProfilingState.FAILED
        assert gpu.locked_clock_mhz is None
    finally:
        rank.close()


def test_the_signal_handlers_reset_lets_no_error_reach_training(
    app: TestClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The reset runs inside a signal handler, on top of whatever training code was running:
    # an error from the GPU there (not only GpuControlError) would surface in that code.
    job, token = create(app, schedule="1f1b")
    rank, gpu = make_rank(app, job, token, tmp_path)
    reset_clock = gpu.reset_clock

    def broken() -> None:
        raise OSError("NVML went away")

    try:
        gpu.reset_clock = broken  # type: ignore[method-assign]
        rank.emergency_reset("SIGTERM")  # never raises
        assert "could not reset GPU 0 clocks: NVML went away" in caplog.text
    finally:
        gpu.reset_clock = reset_clock  # type: ignore[method-assign]
        rank.close()


def test_a_signal_while_close_waits_for_the_clock_thread_still_resets(
    app: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # close() marks the rank closed first and resets only after joining the clock thread; a
    # SIGTERM in between ends the process (default handler) before that reset.
    job, token = create(app, schedule="1f1b")
    rank, gpu = make_rank(app, job, token, tmp_path)
    resets = record_calls(monkeypatch, gpu, "reset_clock")
    rank.close()  # marks the rank closed (and resets, as the signal may come before it does)
    resets.clear()
    rank.emergency_reset("SIGTERM")
    assert resets == [()]


def test_wrong_token_and_unknown_job_stop_perseus_not_training(
    app: TestClient, tmp_path: Path
) -> None:
    job, _ = create(app, schedule="1f1b")
    for job_id, token, message in ((job, "wrong", "token"), ("0" * 32, "x", "no job")):
        rank, gpu = make_rank(app, job_id, token, tmp_path)
        try:
            train_until(rank, ORDER_1F1B, lambda r=rank: r.failure is not None, 30)  # type: ignore[misc]
            train(rank, 2, ORDER_1F1B)
        finally:
            rank.close()
        assert message in (rank.failure or "").lower()
        assert gpu.locked_clock_mhz is None


def test_a_rank_outside_the_job_is_refused(app: TestClient, tmp_path: Path) -> None:
    job, token = create(app, schedule="1f1b")
    rank, _ = make_rank(app, job, token, tmp_path, rank=7, stage=None)
    try:
        train_until(rank, ORDER_1F1B, lambda: rank.failure is not None, 30)
    finally:
        rank.close()
    assert rank.failure


def test_a_server_answering_garbage_never_blocks_training(tmp_path: Path) -> None:
    requests = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal requests
        requests += 1
        return httpx.Response(200, content=b"<html>proxy error</html>")

    http = httpx.Client(base_url="http://planner", transport=httpx.MockTransport(handler))
    gpu = FakeGpu(work=default_work(0, 1))
    settings = ClientSettings(
        server="http://planner", job="j", token="t", stage=0, gpu="fake", budget=BUDGET
    )
    rank = Rank(settings, gpu=gpu, planner=PlannerClient(http, "j", "t"), workload=Nothing())
    try:
        started = time.monotonic()
        train(rank, 3, ORDER_1F1B)
        elapsed = time.monotonic() - started
    finally:
        rank.close()
    assert requests >= 1
    assert rank.plan_version is None
    # Three iterations of modelled work plus one profiling step; no waiting on the planner.
    assert elapsed < 20


def test_a_planner_whose_answers_this_rank_cannot_read_is_given_up_and_told(
    tmp_path: Path,
) -> None:
    # A planner of an incompatible version (here: a job view without the job's spec) answers
    # the same every time: after a few tries the rank gives up, says why in the job view,
    # and training goes on at default clocks.
    reasons: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/ranks:gave-up"):
            reasons.append(json.loads(request.content)["reason"])
            return httpx.Response(200, json={"rank": 0, "at_s": 1.0})
        return httpx.Response(200, json={"job_id": "j", "state": "registering", "version": 0})

    http = httpx.Client(base_url="http://planner", transport=httpx.MockTransport(handler))
    settings = ClientSettings(
        server="http://planner", job="j", token="t", stage=0, gpu="fake", budget=BUDGET
    )
    rank = Rank(
        settings,
        gpu=FakeGpu(work=default_work(0, 1)),
        planner=PlannerClient(http, "j", "t"),
        workload=Nothing(),
    )
    try:
        train_until(rank, ORDER_1F1B, lambda: bool(reasons), 60)
    finally:
        rank.close()
    assert "not what this rank understands" in (rank.failure or "")
    assert "not a JobView: " in reasons[0] and "Field required" in reasons[0]
    assert rank.plan_version is None


def test_an_exception_in_training_resets_the_clocks(app: TestClient, tmp_path: Path) -> None:
    job, token = create(app, schedule="1f1b")
    rank, gpu = make_rank(app, job, token, tmp_path)
    try:
        train_until(rank, ORDER_1F1B, lambda: rank.plan_version == 1, 90)
        with pytest.raises(ValueError), rank.iteration():
            with rank.instruction("forward", 0):
                pass
            raise ValueError("loss is NaN")
        time.sleep(2 * gpu.model.clock_change_delay_s)  # a reset takes effect after the delay
        assert gpu.locked_clock_mhz is None
    finally:
        rank.close()


OFF_SCRIPT = """
import logging
import perseus.client
from perseus.cli.job_views import format_job

logging.basicConfig(level=logging.WARNING)
perseus.client.connect(server=None, install_signal_handlers=False)
perseus.client.connect(server=None, install_signal_handlers=False)
"""


def test_perseus_logs_once_that_it_is_off(tmp_path: Path) -> None:
    # A fresh process: whether an earlier test's connect() already said so does not matter.
    done = run_script(tmp_path, OFF_SCRIPT, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("PERSEUS_SERVER is not set") == 1, done.stderr
