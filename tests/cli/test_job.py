"""``perseus job ...`` through ``perseus.cli.main``, against a real planner (uvicorn on
loopback, in a thread of this process)."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest
import uvicorn
from pydantic import SecretStr

from perseus.cli import main
from perseus.client.api.client import PlannerClient
from perseus.schemas import ProfileReport, ProfileRow, RankRegistration
from perseus.server.app import create_app
from perseus.server.settings import Settings
from perseus.solver import load_profile, profile_to_json

STAGES = 4
ADMIN = "the-admin-token"


@dataclass
class Planner:
    url: str
    server: uvicorn.Server
    thread: threading.Thread


def _start(tmp_path: Path, name: str, admin_token: str | None) -> Planner:
    settings = Settings(
        database=f"sqlite:///{tmp_path / f'{name}.db'}",
        admin_token=None if admin_token is None else SecretStr(admin_token),
        warm_planner=False,
        planning_lease_s=3.0,
        cache_ttl_s=1.0,
        polish_s=0.0,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    # Off the main thread uvicorn installs no signal handlers; should_exit stops it.
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the planner did not start")
        time.sleep(0.02)
    return Planner(f"http://127.0.0.1:{port}", server, thread)


@pytest.fixture
def planners(tmp_path: Path) -> Iterator[Callable[..., Planner]]:
    """Start real planners on loopback: ``planners(admin_token=None)``; stopped at teardown."""
    started: list[Planner] = []

    def start(admin_token: str | None = None) -> Planner:
        planner = _start(tmp_path, f"planner{len(started)}", admin_token)
        started.append(planner)
        return planner

    yield start
    for planner in started:
        planner.server.should_exit = True
    for planner in started:
        planner.thread.join(30)


@pytest.fixture
def planner(planners: Callable[..., Planner]) -> Planner:
    return planners()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No PERSEUS_* variable of the caller's shell reaches the commands."""
    import os

    for name in list(os.environ):
        if name.startswith("PERSEUS_"):
            monkeypatch.delenv(name)
    return monkeypatch


@dataclass
class Result:
    status: int
    out: str
    err: str


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Result:
    status = main(list(argv))
    captured = capsys.readouterr()
    return Result(status, captured.out, captured.err)


def exports(text: str) -> dict[str, str]:
    """The ``export NAME=value`` lines of ``text``, as a shell would read them."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line)
        assert words[0] == "export" and len(words) == 2, line
        name, _, value = words[1].partition("=")
        found[name] = value
    return found


def create(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    *extra: str,
) -> dict[str, str]:
    r = run(capsys, "job", "create", "--server", url, "--stages", str(STAGES),
            "--microbatches", "4", "--p-block", "100", *extra)  # fmt: skip
    assert r.status == 0, r.err
    env = exports(r.out)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def example_rows() -> dict[int, list[ProfileRow]]:
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        rows: dict[int, list[ProfileRow]] = {}
        for row in profile_to_json(load_profile(path))["rows"]:
            rows.setdefault(row.pop("stage"), []).append(ProfileRow.model_validate(row))
        return rows


def make_ready(env: dict[str, str]) -> None:
    """Register every rank and report its profile; wait for the first plan."""
    rows = example_rows()
    clocks = sorted({r.frequency_mhz for stage in rows.values() for r in stage})
    with PlannerClient.open(env["PERSEUS_SERVER"], env["PERSEUS_JOB"], env["PERSEUS_TOKEN"]) as c:
        for rank in range(STAGES):
            c.register(
                RankRegistration(
                    rank=rank,
                    stage=rank,
                    data_parallel_rank=0,
                    tensor_parallel_rank=0,
                    gpu_name="NVIDIA H200",
                    supported_clocks_mhz=clocks,
                )
            )
        for rank in range(STAGES):
            c.report_profile(ProfileReport(rank=rank, stage=rank, rows=rows[rank]))
        # up to the server's longest poll: planning runs niced, slow on a busy host
        assert c.plan(0, wait_s=60) is not None


def error_line(r: Result) -> str:
    assert r.status == 2, r
    assert r.out == ""
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("perseus: error: ")
    return lines[0]


# ----------------------------------------------------------------------------- create


def test_create_prints_lines_a_shell_can_eval(
    planner: Planner, capsys: pytest.CaptureFixture[str]
) -> None:
    r = run(capsys, "job", "create", "--server", planner.url, "--stages", "2",
            "--microbatches", "8", "--schedule", "interleaved-1f1b", "--data-parallel", "2",
            "--policy", "max-slowdown:1.05", "--name", "it's mine", "--auto-straggler")  # fmt: skip
    assert r.status == 0, r.err
    assert len(r.out.splitlines()) == 3
    env = exports(r.out)
    assert set(env) == {"PERSEUS_SERVER", "PERSEUS_JOB", "PERSEUS_TOKEN"}
    assert env["PERSEUS_SERVER"] == planner.url
    script = 'eval "$(cat)"; printf "%s\\n" "$PERSEUS_SERVER" "$PERSEUS_JOB" "$PERSEUS_TOKEN"'
    shell = subprocess.run(
        ["bash", "-c", script], input=r.out, capture_output=True, text=True, check=True
    )
    assert shell.stdout.splitlines() == [planner.url, env["PERSEUS_JOB"], env["PERSEUS_TOKEN"]]

    with PlannerClient.open(planner.url, env["PERSEUS_JOB"], env["PERSEUS_TOKEN"]) as client:
        view = client.job()
    assert view.name == "it's mine"
    assert view.spec.schedule == "interleaved-1f1b"
    assert view.spec.virtual_stages == 2  # as `perseus plan` defaults it
    assert view.spec.data_parallel == 2
    assert view.spec.auto_straggler
    assert view.policy.model_dump() == {"kind": "max-slowdown", "factor": 1.05}


def test_create_needs_the_admin_token_when_the_server_has_one(
    planners: Callable[..., Planner],
    capsys: pytest.CaptureFixture[str],
    clean_env: pytest.MonkeyPatch,
) -> None:
    guarded = planners(admin_token=ADMIN)
    argv = ("job", "create", "--server", guarded.url, "--stages", "1", "--microbatches", "1")
    line = error_line(run(capsys, *argv))
    assert "admin token" in line
    clean_env.setenv("PERSEUS_ADMIN_TOKEN", "wrong")
    assert "not the admin token" in error_line(run(capsys, *argv))
    clean_env.setenv("PERSEUS_ADMIN_TOKEN", ADMIN)
    env = exports(run(capsys, *argv).out)
    # Deleting needs the admin token there too: it is preferred to the job's.
    clean_env.setenv("PERSEUS_TOKEN", env["PERSEUS_TOKEN"])
    r = run(capsys, "job", "delete", env["PERSEUS_JOB"], "--server", guarded.url)
    assert r.status == 0, r.err


def test_create_rejects_bad_arguments_before_asking(
    planner: Planner, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ("job", "create", "--server", planner.url, "--microbatches", "4")
    assert "--stages" in error_line(run(capsys, *base))
    line = error_line(run(capsys, *base, "--stages", "2", "--policy", "fastest"))
    assert "unknown policy 'fastest'" in line
    line = error_line(run(capsys, *base, "--stages", "2", "--virtual-stages", "2"))
    assert "virtual_stages > 1 needs one of dualpipev, interleaved-1f1b" in line
    assert "--server" in error_line(run(capsys, *base[:2], *base[4:], "--stages", "2"))


# ----------------------------------------------------------------------------- a job's life


def test_job_commands_follow_a_job(
    planner: Planner,
    capsys: pytest.CaptureFixture[str],
    clean_env: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    env = create(capsys, clean_env, planner.url)
    r = run(capsys, "job", "status")
    assert r.status == 0, r.err
    assert "state      registering" in r.out
    assert f"job        {env['PERSEUS_JOB']}" in r.out

    line = error_line(run(capsys, "job", "frontier"))
    assert "not ready yet" in line and "registering" in line
    assert "lack a profile" in error_line(run(capsys, "job", "profile"))

    make_ready(env)
    r = run(capsys, "job", "status")
    assert "state      ready" in r.out
    assert "chosen     point 0 (no-slowdown):" in r.out

    r = run(capsys, "job", "frontier")
    assert r.status == 0, r.err
    assert "plan version 1" in r.out
    assert "default (max clock)" in r.out and "saving and slowdown are against" in r.out
    assert "chosen: policy no-slowdown (point 0 of" in r.out
    raw = run(capsys, "job", "frontier", "--json")
    assert '"chosen_index": 0' in raw.out

    r = run(capsys, "job", "policy", "min-energy")
    assert r.status == 0, r.err
    assert r.out.startswith("policy min-energy: plan version 2, point ")
    r = run(capsys, "job", "policy", env["PERSEUS_JOB"], "max-slowdown:1.1")
    assert r.out.startswith("policy max-slowdown:1.1: plan version 3")
    line = error_line(run(capsys, "job", "policy", "deadline:0.000001"))
    assert line.startswith("perseus: error: job policy: no plan finishes within 0.000001 s")

    r = run(capsys, "job", "straggler", "--slowdown", "1.2")
    assert r.out.startswith("straggler 1.2x slower: plan version 4")
    r = run(capsys, "job", "frontier")
    assert "chosen: straggler" in r.out
    r = run(capsys, "job", "straggler", "--iteration-time", "100")
    assert r.out.startswith("straggler at 100 s per iteration: plan version 5")
    r = run(capsys, "job", "straggler", "--clear")
    assert r.out.startswith("straggler cleared: plan version 6")
    assert "one of the arguments" in error_line(run(capsys, "job", "straggler"))

    out = tmp_path / "profile.csv"
    r = run(capsys, "job", "profile", "-o", str(out))
    assert r.status == 0, r.err
    rows = len(out.read_text().splitlines()) - 1
    assert r.out.startswith(f"wrote {out} ({rows} rows)\n")
    assert load_profile(out).num_stages == STAGES
    assert run(capsys, "job", "profile").out == out.read_text()

    r = run(capsys, "job", "delete")
    assert r.out == f"deleted job {env['PERSEUS_JOB']}\n"
    line = error_line(run(capsys, "job", "status"))
    assert f"no job '{env['PERSEUS_JOB']}' on {planner.url}" in line


# ----------------------------------------------------------------------------- errors


def test_errors_say_what_to_check(
    planner: Planner,
    capsys: pytest.CaptureFixture[str],
    clean_env: pytest.MonkeyPatch,
) -> None:
    assert "no planner server" in error_line(run(capsys, "job", "status", "x" * 32))
    clean_env.setenv("PERSEUS_SERVER", planner.url)
    assert "no job: give JOB or set $PERSEUS_JOB" in error_line(run(capsys, "job", "status"))
    assert "no token" in error_line(run(capsys, "job", "status", "0" * 32))

    env = create(capsys, clean_env, planner.url)
    line = error_line(run(capsys, "job", "status", "--token", "not-the-token"))
    assert "the token does not belong to this job" in line
    assert "check $PERSEUS_TOKEN" in line
    assert "not-the-token" not in line
    line = error_line(run(capsys, "job", "status", "0" * 32))
    assert f"no job '{'0' * 32}' on {planner.url}; check the job id ($PERSEUS_JOB)" in line

    unreachable = "http://127.0.0.1:1"
    line = error_line(run(capsys, "job", "status", "--server", unreachable))
    assert f"planner {unreachable}" in line and "unreachable" in line
    assert env["PERSEUS_TOKEN"] not in line
    assert "--server: expected http://" in error_line(
        run(capsys, "job", "status", "--server", "planner:7787")
    )
    assert "COMMAND" in error_line(run(capsys, "job"))


def test_status_shows_the_saving_measured_beside_the_predicted(
    planner: Planner, capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch
) -> None:
    import httpx

    env = create(capsys, clean_env, planner.url)
    make_ready(env)
    auth = {"Authorization": f"Bearer {env['PERSEUS_TOKEN']}"}
    url = f"{env['PERSEUS_SERVER']}/v1/jobs/{env['PERSEUS_JOB']}/iterations"
    with httpx.Client(headers=auth, timeout=10) as http:
        for it in range(4):
            for rank in range(STAGES):
                phase, energy_j = ("baseline", 100.0) if it < 2 else ("plan", 50.0)
                body = {"rank": rank, "iteration": it, "time_s": 1.0, "energy_j": energy_j,
                        "phase": phase, "plan_version": 1}  # fmt: skip
                http.post(url, json=body).raise_for_status()
    r = run(capsys, "job", "status")
    assert r.status == 0, r.err
    lines = r.out.splitlines()
    assert any(
        line.split()[:5] == ["baseline", "(default", "clocks)", "1.0000", "1.0000-1.0000"]
        and "400.0" in line
        for line in lines
    ), r.out
    assert any(line.startswith("plan version 1") and "200.0" in line for line in lines), r.out
    realized = next(line for line in lines if line.startswith("realized"))
    assert realized.split()[1:] == ["+0.0", "%", "+50.0", "%"]
    assert any(line.startswith("predicted") for line in lines)
    assert "energy saved so far  400 J (0.0001111 kWh) of 1,200 J reported" in r.out
    assert "warning: realized saving +50.0% differs from the predicted" in r.out
    raw = run(capsys, "job", "status", "--json")
    savings = json.loads(raw.out)["savings"]
    assert savings["realized_saving"] == pytest.approx(0.5)
    assert savings["energy_saved_j"] == pytest.approx(400.0)
    assert savings["plan"]["iterations"] == 2 * STAGES


# ----------------------------------------------------------------------------- issue 25


def test_list_shows_every_job(
    planners: Callable[..., Planner],
    capsys: pytest.CaptureFixture[str],
    clean_env: pytest.MonkeyPatch,
) -> None:
    planner = planners()
    r = run(capsys, "job", "list", "--server", planner.url)
    assert r.status == 0, r.err
    assert r.out == "no jobs\n"
    first = create(capsys, clean_env, planner.url, "--name", "<b>first</b>")
    second = create(capsys, clean_env, planner.url)
    r = run(capsys, "job", "list")
    assert r.status == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["job", "state", "version", "created", "(UTC)", "name"]
    assert lines[1].split()[:3] == [first["PERSEUS_JOB"], "registering", "0"]
    assert lines[1].endswith("<b>first</b>")
    assert lines[2].split()[:3] == [second["PERSEUS_JOB"], "registering", "0"]
    listed = json.loads(run(capsys, "job", "list", "--json").out)["jobs"]
    assert [j["job_id"] for j in listed] == [first["PERSEUS_JOB"], second["PERSEUS_JOB"]]

    guarded = planners(admin_token=ADMIN)
    line = error_line(run(capsys, "job", "list", "--server", guarded.url))
    assert "admin token" in line
    clean_env.setenv("PERSEUS_ADMIN_TOKEN", ADMIN)
    assert run(capsys, "job", "list", "--server", guarded.url).out == "no jobs\n"


def test_the_saved_profile_plans_as_it_is(
    planner: Planner,
    capsys: pytest.CaptureFixture[str],
    clean_env: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """perseus job profile -o x.json, then perseus plan x.json: no extra flag."""
    make_ready(create(capsys, clean_env, planner.url))
    r = run(capsys, "job", "status", "--json")
    assert json.loads(r.out)["p_block_w"] == pytest.approx(100.0)
    assert "p_block    100 W per stage" in run(capsys, "job", "status").out

    saved = tmp_path / "profile.json"
    r = run(capsys, "job", "profile", "-o", str(saved))
    assert r.status == 0, r.err
    document = json.loads(saved.read_text())
    assert document["format"] == "perseus.profile/1"
    assert document["p_block_w"] == pytest.approx(100.0)
    assert load_profile(saved).p_block_w == pytest.approx(100.0)
    r = run(capsys, "plan", str(saved), "--microbatches", "4")
    assert r.status == 0, r.err

    # the CSV carries it too (a p_block_w column): it plans as it is, to the same plan
    csv = tmp_path / "profile.csv"
    r = run(capsys, "job", "profile", "-o", str(csv))
    assert r.status == 0, r.err
    assert r.out == f"wrote {csv} ({len(csv.read_text().splitlines()) - 1} rows)\n"
    assert csv.read_text().splitlines()[0] == "stage,instruction,frequency,time,energy,p_block_w"
    assert load_profile(csv).stages == load_profile(saved).stages
    assert load_profile(csv).p_block_w == load_profile(saved).p_block_w
    from_json = run(capsys, "plan", str(saved), "--microbatches", "4").out
    r = run(capsys, "plan", str(csv), "--microbatches", "4")
    assert r.status == 0, r.err
    assert "P_block 100 W" in r.out

    def same(text: str, path: Path) -> str:
        return re.sub(r"solved in [\d.]+ s", "solved", text.replace(str(path), "PROFILE"))

    assert same(r.out, csv) == same(from_json, saved)


def test_the_servers_frontier_replays_offline(
    planner: Planner,
    capsys: pytest.CaptureFixture[str],
    clean_env: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """perseus job frontier -o writes the file perseus simulate replays; --plot a PNG."""
    env = create(capsys, clean_env, planner.url)
    make_ready(env)
    assert run(capsys, "job", "policy", "max-slowdown:1.1").status == 0
    view = json.loads(run(capsys, "job", "frontier", "--json").out)
    assert view["policy"] == {"kind": "max-slowdown", "factor": 1.1}
    chosen = view["points"][view["chosen_index"]]

    profile, frontier, plot = tmp_path / "p.json", tmp_path / "f.json", tmp_path / "f.png"
    assert run(capsys, "job", "profile", "-o", str(profile)).status == 0
    r = run(capsys, "job", "frontier", "-o", str(frontier), "--plot", str(plot))
    assert r.status == 0, r.err
    assert f"wrote {frontier}" in r.out and f"wrote {plot}" in r.out
    assert "chosen: policy max-slowdown:1.1 (point" in r.out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads(frontier.read_text())
    assert document["format"] == "perseus.frontier/1"
    assert len(document["points"]) == len(view["points"])
    assert all(p["frequencies_mhz"] for p in document["points"])

    r = run(capsys, "simulate", str(profile), str(frontier), "--point",
            str(view["chosen_index"]))  # fmt: skip
    assert r.status == 0, r.err
    assert "planned on another profile" not in r.err
    assert f"iteration time  {chosen['time_s']:.6f} s" in r.out
    assert f"(the plan states {chosen['time_s']:.6f} s and {chosen['energy_j']:.3f} J)" in r.out


def test_frontier_timeline_draws_the_plan_that_runs(
    planner: Planner,
    capsys: pytest.CaptureFixture[str],
    clean_env: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """perseus job frontier --timeline: the running point's clocks replayed on the job's
    profile and drawn, like perseus plan --timeline; refused once the ranks re-profiled."""
    env = create(capsys, clean_env, planner.url)
    make_ready(env)
    assert run(capsys, "job", "straggler", "--slowdown", "1.2").status == 0
    timeline = tmp_path / "timeline.png"
    r = run(capsys, "job", "frontier", "--timeline", str(timeline))
    assert r.status == 0, r.err
    assert f"wrote {timeline}\n" in r.out and "chosen: straggler" in r.out
    png = timeline.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > height > 100  # a row per GPU, wider than tall

    rows = example_rows()
    slower = [row.model_copy(update={"time_s": row.time_s * 1.5}) for row in rows[0]]
    with PlannerClient.open(env["PERSEUS_SERVER"], env["PERSEUS_JOB"], env["PERSEUS_TOKEN"]) as c:
        c.report_profile(ProfileReport(rank=0, stage=0, rows=slower))
    line = error_line(run(capsys, "job", "frontier", "--timeline", str(tmp_path / "new.png")))
    assert "re-profiled since plan version 2" in line
    assert not (tmp_path / "new.png").exists()


def test_status_counts_iterations_not_reports(
    planner: Planner, capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch
) -> None:
    import httpx

    env = create(capsys, clean_env, planner.url)
    make_ready(env)
    auth = {"Authorization": f"Bearer {env['PERSEUS_TOKEN']}"}
    url = f"{env['PERSEUS_SERVER']}/v1/jobs/{env['PERSEUS_JOB']}/iterations"
    with httpx.Client(headers=auth, timeout=10) as http:
        for it in range(3):
            for rank in range(STAGES):
                body = {"rank": rank, "iteration": it, "time_s": 1.0, "energy_j": 10.0,
                        "phase": "plan", "plan_version": 1}  # fmt: skip
                http.post(url, json=body).raise_for_status()
    r = run(capsys, "job", "status")
    assert f"progress   3 iterations ({3 * STAGES} reports from the ranks)" in r.out
    counts = json.loads(run(capsys, "job", "status", "--json").out)["counts"]
    assert counts["iterations"] == 3
    assert counts["iterations_reported"] == 3 * STAGES


# ----------------------------------------------------------------------------- stragglers


def test_job_views_say_when_a_straggler_does_not_slow_the_plan(
    planner: Planner, capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch
) -> None:
    make_ready(create(capsys, clean_env, planner.url))
    r = run(capsys, "job", "straggler", "--iteration-time", "0.001")
    assert r.status == 0, r.err
    status = run(capsys, "job", "status").out
    assert "chosen     point 0 (no-slowdown; the straggler does not slow it):" in status
    frontier = run(capsys, "job", "frontier").out
    assert "chosen: policy no-slowdown (point 0 of" in frontier
    assert "straggler: it does not slow this pipeline" in frontier
    r = run(capsys, "job", "straggler", "--slowdown", "1.2")
    status = run(capsys, "job", "status").out
    assert "(straggler plan, policy no-slowdown):" in status
    frontier = run(capsys, "job", "frontier").out
    assert re.search(r"^chosen: straggler \(point \d+ of \d+\)", frontier, re.M), frontier


# ----------------------------------------------------------------------------- re-runs


def test_a_rerun_replans_on_its_profiles_and_replan_does_it_at_once(
    planner: Planner, capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch
) -> None:
    env = create(capsys, clean_env, planner.url)
    make_ready(env)
    r = run(capsys, "job", "status")
    assert "from the profiles in at" in r.out and "re-run" not in r.out
    rows = example_rows()
    with PlannerClient.open(env["PERSEUS_SERVER"], env["PERSEUS_JOB"], env["PERSEUS_TOKEN"]) as c:
        # a re-run: its ranks re-profile; the plan stays until every rank's new profile is in
        c.report_profile(ProfileReport(rank=0, stage=0, rows=rows[0]))
        r = run(capsys, "job", "status")
        assert f"1 of {STAGES} profiles re-reported since this plan" in r.out
        assert c.job().version == 1
        for rank in range(1, STAGES):
            c.report_profile(ProfileReport(rank=rank, stage=rank, rows=rows[rank]))
        assert c.plan(0, version=1, wait_s=60) is not None  # replanned: version 2
        assert "re-run" not in run(capsys, "job", "status").out
    r = run(capsys, "job", "replan")
    assert r.status == 0, r.err
    assert r.out.startswith(f"job {env['PERSEUS_JOB']}: planning on the profiles in")
    with PlannerClient.open(env["PERSEUS_SERVER"], env["PERSEUS_JOB"], env["PERSEUS_TOKEN"]) as c:
        plan = c.plan(0, version=2, wait_s=60)
        assert plan is not None and plan.version == 3
