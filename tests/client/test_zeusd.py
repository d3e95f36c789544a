"""Clocks through zeusd: perseus against a zeusd 0.5 over fake GPUs (``zeusd_server``), on a
Unix socket and on TCP; the rank reads the GPU without the right to change it."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from perseus.cli import main
from perseus.client.api.client import PlannerClient
from perseus.client.gpu.control import open_gpu, work_observer
from perseus.client.gpu.fake import FakeGpu, FakeGpuModel, FakeRun, default_work
from perseus.client.gpu.zeusd import ZeusdEndpoint, ZeusdGpu
from perseus.client.rank import Rank
from perseus.client.settings import ClientSettings, default_gpu_mode, load_settings
from perseus.core.errors import (
    GpuControlError,
    NvmlPermissionError,
    ZeusdRefused,
    ZeusdUnavailable,
)
from perseus.server.app import create_app
from perseus.server.settings import Settings

from .zeusd_server import NVML_NO_PERMISSION, FakeZeusd, issue_token

KEY = b"a signing key of thirty-two bytes"
ORDER_1F1B = [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)]


class Unprivileged:
    """A fake GPU as an unprivileged rank sees it through NVML: it reads, it may not set."""

    def __init__(self, gpu: FakeGpu) -> None:
        self._gpu = gpu
        self.index, self.name, self.can_set_clocks = gpu.index, gpu.name, False
        self.work_observer = gpu.work_observer
        self.supported_clocks_mhz = gpu.supported_clocks_mhz
        self.default_clock_mhz = gpu.default_clock_mhz
        self.current_clock_mhz = gpu.current_clock_mhz
        self.applied_clock_mhz = gpu.applied_clock_mhz
        self.energy_j = gpu.energy_j
        self.power_w = gpu.power_w

    def lock_clock(self, frequency_mhz: int) -> None:
        raise NvmlPermissionError("nvmlDeviceSetGpuLockedClocks: no permission")

    def reset_clock(self) -> None:
        raise NvmlPermissionError("nvmlDeviceResetGpuLockedClocks: no permission")


def instant(delay_s: float = 0.0) -> FakeGpu:
    return FakeGpu(FakeGpuModel(clock_change_delay_s=delay_s), default_work(0, 1))


def serving(tmp_path: Path, transport: str, *gpus: FakeGpu, **options: Any) -> FakeZeusd:
    socket = tmp_path / "zeusd.sock" if transport == "uds" else None
    return FakeZeusd(gpus or [instant()], socket_path=socket, **options)


TRANSPORTS = pytest.mark.parametrize("transport", ["uds", "tcp"])


@TRANSPORTS
def test_clocks_change_through_zeusd_with_its_requests(tmp_path: Path, transport: str) -> None:
    fake = instant()
    with serving(tmp_path, transport, fake) as zeusd:
        gpu = open_gpu("zeusd", 0, environ=zeusd.environ(), reader=Unprivileged(fake))
        assert isinstance(gpu, ZeusdGpu) and gpu.can_set_clocks
        with gpu:
            gpu.lock_clock(1410)
            assert fake.locked_clock_mhz == 1410 and gpu.applied_clock_mhz() == 1410
            gpu.reset_clock()
            assert fake.locked_clock_mhz is None and gpu.applied_clock_mhz() == 1980
            with pytest.raises(GpuControlError, match="1411 MHz is not a supported SM clock"):
                gpu.lock_clock(1411)  # refused before anything is sent
            assert gpu.supported_clocks_mhz() == fake.supported_clocks_mhz()
            # the fake's counter moves every 100 ms, as NVML's: a fast run reads it before then
            deadline = time.monotonic() + 5.0
            while fake.energy_j() == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert 0 < gpu.energy_j() <= fake.energy_j() and gpu.name == fake.name
            assert work_observer(gpu) is fake
    reset = ("POST", "/gpu/reset_gpu_locked_clocks", {"gpu_ids": "0", "block": "true"}, 200)
    lock = {"gpu_ids": "0", "min_clock_mhz": "1410", "max_clock_mhz": "1410", "block": "true"}
    assert zeusd.requests == [reset, ("POST", "/gpu/set_gpu_locked_clocks", lock, 200), reset]


def test_the_test_zeusd_answers_as_zeusd_0_5(tmp_path: Path) -> None:
    """The test double's own answers, where perseus never sends such a request."""
    with serving(tmp_path, "tcp", instant(), instant()) as zeusd:
        http = httpx.Client(base_url=f"http://127.0.0.1:{zeusd.port}")
        set_ = "/gpu/set_gpu_locked_clocks"
        full = {"gpu_ids": "1", "min_clock_mhz": "900", "max_clock_mhz": "900", "block": "true"}
        cases: list[tuple[str, str, dict[str, str], int, str]] = [
            ("POST", set_, full | {"power": "1"}, 400, "Query deserialize error: unknown field "
             "`power`, expected one of `gpu_ids`, `min_clock_mhz`, `max_clock_mhz`, `block`"),
            ("POST", set_, {k: v for k, v in full.items() if k != "block"}, 400,
             "Query deserialize error: missing field `block`"),
            ("POST", set_, full | {"block": "1"}, 400,
             "Query deserialize error: provided string was not `true` or `false`"),
            ("POST", set_, full | {"min_clock_mhz": "9e2"}, 400,
             "Query deserialize error: invalid digit found in string"),
            ("POST", set_, full | {"gpu_ids": "x"}, 400,
             '{"error": "gpu_ids must contain at least one GPU index"}'),
            ("POST", set_, full | {"gpu_ids": "0,2"}, 400, "GPU index 2 does not exist."),
            ("POST", set_, full | {"max_clock_mhz": "1980"}, 500,
             '{"errors": {"1": "NVML error: A supplied argument is invalid"}}'),
            ("GET", set_, full, 404, ""),
            ("POST", "/gpu/set_fan_speed", {}, 404, ""),
            ("GET", "/gpu/get_cumulative_energy", {"gpu_ids": "0", "x": "1"}, 400,
             "Query deserialize error: unknown field `x`, expected `gpu_ids`"),
        ]  # fmt: skip
        for method, path, params, status, body in cases:
            reply = http.request(method, path, params=params)
            assert (reply.status_code, reply.text) == (status, body), (path, params)
        reply = http.post(set_, params=full)
        assert reply.status_code == 200 and reply.text == ""
        assert zeusd.gpus[1].locked_clock_mhz == 900  # type: ignore[attr-defined]
        energy = http.get("/gpu/get_cumulative_energy").json()
        assert set(energy) == {"0", "1"} and set(energy["0"]) == {"energy_mj"}
        discover = http.get("/discover").json()
        assert discover["gpu_ids"] == [0, 1] and discover["auth_required"] is False


def test_a_non_blocking_request_answers_before_the_gpu_changes(tmp_path: Path) -> None:
    with serving(tmp_path, "uds", instant()) as zeusd:
        http = httpx.Client(transport=httpx.HTTPTransport(uds=str(zeusd.socket_path)))
        params = {"gpu_ids": "0", "min_clock_mhz": "705", "max_clock_mhz": "705", "block": "false"}
        assert http.post("http://localhost/gpu/set_gpu_locked_clocks", params=params).text == ""
        deadline = time.monotonic() + 5
        while zeusd.gpus[0].locked_clock_mhz != 705:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.005)


@TRANSPORTS
def test_an_unreachable_zeusd_is_named(tmp_path: Path, transport: str) -> None:
    env = (
        {"ZEUSD_SOCK_PATH": str(tmp_path / "none.sock")}
        if transport == "uds"
        else {"ZEUSD_HOST_PORT": "127.0.0.1:9"}  # discard: nothing listens there
    )
    with pytest.raises(ZeusdUnavailable) as raised:
        open_gpu("zeusd", 0, environ=env, reader=Unprivileged(instant()))
    where = f"unix:{tmp_path / 'none.sock'}" if transport == "uds" else "127.0.0.1:9"
    assert f"zeusd at {where} cannot be reached" in str(raised.value)
    assert "is zeusd running" in str(raised.value)


@pytest.mark.parametrize(
    ("options", "token", "index", "status", "words"),
    [
        ({"enable": ("gpu-read",)}, None, 0, 404, "--enable gpu-control"),
        ({"signing_key": KEY}, None, 0, 401, "set ZEUSD_TOKEN"),
        ({"signing_key": KEY}, "not.a.token", 0, 401, "ZEUSD_TOKEN is not accepted"),
        ({"signing_key": KEY}, issue_token(KEY, "ann", ["gpu-read"], None), 0, 403,
         "lacks required scope 'gpu-control'"),
        ({"signing_key": KEY}, issue_token(KEY, "ann", ["gpu-control"], 1), 0, 401,
         "Token has expired."),
        ({"signing_key": KEY}, issue_token(b"another key", "ann", ["gpu-control"], None), 0,
         401, "InvalidSignature"),
        ({}, None, 3, 400, "GPU index 3 does not exist.; zeusd numbers GPUs"),
        ({"nvml_refuses": True}, None, 0, 500, "zeusd itself may not change clocks"),
        ({"nvml_refuses": True, "aggregate_status": True}, None, 0, 403,
         f"GPU 0: {NVML_NO_PERMISSION}; zeusd itself may not change clocks"),
    ],
)  # fmt: skip
def test_a_refusal_says_what_zeusd_said_and_what_fixes_it(
    tmp_path: Path,
    options: dict[str, Any],
    token: str | None,
    index: int,
    status: int,
    words: str,
) -> None:
    reader = Unprivileged(instant())
    with serving(tmp_path, "uds", **options) as zeusd, pytest.raises(ZeusdRefused) as raised:
        open_gpu("zeusd", index, environ=zeusd.environ(token), reader=reader)
    assert raised.value.status_code == status
    assert words in str(raised.value)
    assert str(raised.value).startswith(f"zeusd at unix:{zeusd.socket_path} refused POST ")


def test_a_token_with_the_scope_is_sent_and_accepted(tmp_path: Path) -> None:
    fake = instant()
    token = issue_token(KEY, "ann", ["gpu-control", "gpu-read"], int(time.time()) + 3600)
    with serving(tmp_path, "tcp", fake, signing_key=KEY) as zeusd:
        gpu = open_gpu("zeusd", 0, environ=zeusd.environ(token), reader=Unprivileged(fake))
        assert isinstance(gpu, ZeusdGpu)
        gpu.lock_clock(1005)
        assert fake.locked_clock_mhz == 1005
        gpu.close()
    assert [status for *_, status in zeusd.requests] == [200, 200]


def test_a_refused_change_mid_run_stops_clock_changes(tmp_path: Path) -> None:
    fake = instant()
    with serving(tmp_path, "uds", fake) as zeusd:
        gpu = open_gpu("zeusd", 0, environ=zeusd.environ(), reader=Unprivileged(fake))
        assert isinstance(gpu, ZeusdGpu)
        zeusd.enable = ("gpu-read",)  # the operator restarted zeusd without gpu-control
        with pytest.raises(ZeusdRefused, match="not enabled"):
            gpu.lock_clock(1200)
        assert not gpu.can_set_clocks
        gpu.close()


def test_zeusd_is_chosen_by_zeus_s_variables_unless_perseus_gpu_says_otherwise() -> None:
    assert default_gpu_mode({}) == "nvml"
    assert default_gpu_mode({"ZEUSD_SOCK_PATH": "/run/zeusd/zeusd.sock"}) == "zeusd"
    assert default_gpu_mode({"ZEUSD_HOST_PORT": "node1:4938"}) == "zeusd"
    assert default_gpu_mode({"ZEUSD_HOST_PORT": "n", "PERSEUS_GPU": "fake"}) == "fake"
    assert load_settings({"ZEUSD_SOCK_PATH": "/s"}).gpu == "zeusd"
    assert load_settings({"ZEUSD_SOCK_PATH": "/s", "PERSEUS_GPU": "nvml"}).gpu == "nvml"
    assert load_settings({"PERSEUS_GPU": "zeusd"}).gpu == "zeusd"


@pytest.mark.parametrize(
    ("environ", "endpoint"),
    [
        ({}, ZeusdEndpoint()),
        ({"ZEUSD_SOCK_PATH": "/s", "ZEUSD_HOST_PORT": "n:1"}, ZeusdEndpoint(socket_path="/s")),
        ({"ZEUSD_HOST_PORT": "node1"}, ZeusdEndpoint(socket_path=None, host="node1")),
        ({"ZEUSD_HOST_PORT": "10.0.0.2:5000", "ZEUSD_TOKEN": "t"},
         ZeusdEndpoint(socket_path=None, host="10.0.0.2", port=5000, token="t")),
        ({"ZEUSD_HOST_PORT": "[::1]:4938"}, ZeusdEndpoint(socket_path=None, host="::1")),
    ],
)  # fmt: skip
def test_the_endpoint_from_zeus_s_variables(
    environ: dict[str, str], endpoint: ZeusdEndpoint
) -> None:
    assert ZeusdEndpoint.from_env(environ) == endpoint


@pytest.mark.parametrize("text", ["node1:", "node1:x", "node1:70000", ":4938", "a b:1"])
def test_a_malformed_host_port_is_refused(text: str) -> None:
    with pytest.raises(GpuControlError, match=f"ZEUSD_HOST_PORT: expected host:port.*{text!r}"):
        ZeusdEndpoint.from_env({"ZEUSD_HOST_PORT": text})


@pytest.mark.parametrize("argv", [(), ("--gpu", "1")])
def test_reset_clocks_goes_through_zeusd(
    tmp_path: Path,
    argv: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fakes = [instant(), instant()]
    with serving(tmp_path, "uds", *fakes) as zeusd:
        for fake in fakes:
            fake.lock_clock(900)
        monkeypatch.delenv("PERSEUS_GPU", raising=False)
        monkeypatch.setenv("ZEUSD_SOCK_PATH", str(zeusd.socket_path))
        assert main(["reset-clocks", *argv]) == 0
    indices = [1] if argv else [0, 1]
    where = f"unix:{zeusd.socket_path}"
    lines = [f"GPU {i}: SM clock lock removed (zeusd at {where})" for i in indices]
    assert capsys.readouterr().out.splitlines() == lines
    assert [f.locked_clock_mhz for f in fakes] == [None if i in indices else 900 for i in (0, 1)]


def test_reset_clocks_reports_an_unreachable_zeusd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PERSEUS_GPU", raising=False)
    monkeypatch.setenv("ZEUSD_SOCK_PATH", str(tmp_path / "none.sock"))
    assert main(["reset-clocks"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "zeusd at unix:" in err[0] and "cannot be reached" in err[0]


# A rank ------------------------------------------------------------------------------------------


@pytest.fixture
def planner(tmp_path: Path) -> Iterator[TestClient]:
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


def create_job(app: TestClient) -> tuple[str, str]:
    body = {"stages": 1, "microbatches": 2, "data_parallel": 1, "tensor_parallel": 1}
    body |= {"schedule": "1f1b", "policy": {"kind": "min-energy"}}
    reply = app.post("/v1/jobs", json=body | {"p_block_w": FakeGpuModel().idle_power_w})
    assert reply.status_code == 201, reply.text
    return reply.json()["job_id"], reply.json()["token"]


def rank_settings(app: TestClient, tmp_path: Path, environ: dict[str, str]) -> ClientSettings:
    job, token = create_job(app)
    # The fake GPU's own model as a saved profile: the rank skips the sweep.
    model, work = FakeGpuModel(), default_work(0, 1)
    profile = tmp_path / "profile.csv"
    rows = ["stage,instruction,frequency,time,energy"]
    for kind in ("forward", "backward"):
        for mhz in (1980, 1500, 1200, 900, 600):
            time_s = model.time_s(work[kind], mhz)
            rows.append(f"0,{kind},{mhz},{time_s},{time_s * model.power_w(work[kind], mhz)}")
    profile.write_text("\n".join(rows) + "\n")
    settings = load_settings(
        environ
        | {
            "PERSEUS_SERVER": "http://testserver",
            "PERSEUS_JOB": job,
            "PERSEUS_TOKEN": token,
            "PERSEUS_STAGE": "0",
            "PERSEUS_PROFILE": str(profile),
            "PERSEUS_CLOCK_LOG": str(tmp_path / "clocks"),
            "PERSEUS_BASELINE_ITERATIONS": "2",
        }
    )
    return dataclasses.replace(settings, poll_wait_s=0.5)


def train(rank: Rank, iterations: int) -> None:
    for _ in range(iterations):
        with rank.iteration():
            for kind, microbatch in ORDER_1F1B:
                with rank.instruction(kind, microbatch):
                    pass


@TRANSPORTS
def test_a_rank_follows_its_plan_through_zeusd(
    planner: TestClient, tmp_path: Path, transport: str
) -> None:
    runs: list[FakeRun] = []
    fake = FakeGpu(work=default_work(0, 1), trace=runs.append)
    with serving(tmp_path, transport, fake) as zeusd:
        settings = rank_settings(planner, tmp_path, zeusd.environ())
        assert settings.gpu == "zeusd"  # chosen by ZEUSD_SOCK_PATH / ZEUSD_HOST_PORT alone
        gpu = open_gpu(
            settings.gpu, settings.gpu_index, environ=zeusd.environ(), reader=Unprivileged(fake)
        )
        planner_client = PlannerClient(planner, settings.job or "", settings.token or "")
        rank = Rank(settings, gpu=gpu, planner=planner_client)
        try:
            deadline = time.monotonic() + 60
            while rank.plan_version != 1:
                assert time.monotonic() < deadline, f"no plan; failure: {rank.failure}"
                train(rank, 1)
            runs.clear()
            train(rank, 4)
            assert rank.failure is None
        finally:
            rank.close()
    plan = planner.get(
        f"/v1/jobs/{settings.job}/plan",
        params={"rank": 0},
        headers={"Authorization": f"Bearer {settings.token}"},
    ).json()
    planned = [i["frequency_mhz"] for i in plan["instructions"]]
    assert len(set(planned)) > 1 or planned[0] != 1980  # a plan that changes clocks
    # What the fake GPU ran, instruction by instruction: the plan's clocks. The clock in
    # effect at each instruction's middle is the planned one (changes land ahead of it).
    ran = [_clock_at_middle(run) for run in runs]
    assert ran == planned * 4
    # Every change went through zeusd's route, and the GPU ended unlocked.
    sets = [q for m, p, q, s in zeusd.requests if p == "/gpu/set_gpu_locked_clocks"]
    assert sets and all(q["min_clock_mhz"] == q["max_clock_mhz"] for q in sets)
    assert {int(q["min_clock_mhz"]) for q in sets} >= set(planned) - {1980}
    assert all(s == 200 for *_, s in zeusd.requests)
    assert zeusd.requests[-1][1] == "/gpu/reset_gpu_locked_clocks"
    time.sleep(2 * fake.model.clock_change_delay_s)
    assert fake.locked_clock_mhz is None
    lines = (tmp_path / "clocks" / "rank0.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    assert [e["frequency_mhz"] for e in logged if e["plan_version"] == 1][: len(planned)] == planned


def _clock_at_middle(run: FakeRun) -> int:
    middle = 0.5 * (run.start_s + run.done_s)
    clock = run.clocks[0][1]
    for at, mhz in run.clocks:
        if at <= middle:
            clock = mhz
    return clock


def test_a_rank_without_zeusd_trains_at_default_clocks(
    planner: TestClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing = {"ZEUSD_SOCK_PATH": str(tmp_path / "none.sock")}
    settings = rank_settings(planner, tmp_path, missing)
    monkeypatch.setenv("ZEUSD_SOCK_PATH", missing["ZEUSD_SOCK_PATH"])
    planner_client = PlannerClient(planner, settings.job or "", settings.token or "")
    with caplog.at_level(logging.WARNING, logger="perseus.client"):
        rank = Rank(settings, planner=planner_client)
    assert not rank.active
    train(rank, 2)
    rank.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "zeusd at unix:" in errors[0] and "training goes on at default clocks" in errors[0]
    strict = dataclasses.replace(settings, strict=True)
    with pytest.raises(ZeusdUnavailable):
        Rank(strict, planner=planner_client)
