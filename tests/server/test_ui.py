"""The web page at ``/ui`` in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium, against a real planner on loopback whose job is fed
by recorded iteration reports. Skips where Chromium, its driver or Selenium is missing.

Set ``PERSEUS_UI_SCREENSHOTS=DIR`` to keep the page's screenshots (``docs/ui.png`` is one).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from pydantic import SecretStr

from perseus.cli import main
from perseus.server.app import create_app
from perseus.server.settings import Settings
from perseus.solver import load_profile, profile_to_json

ADMIN = "the-admin-token"
STAGES = 4
P_BLOCK_W = 100.0
# Markup a job name must never become: shown as text, it stays these characters.
MARKUP_NAME = '<img src=x onerror="window.pwned=1"><b>bert</b> & co'
# Why a rank gave up, as a rank would say it; markup in it stays text too.
GAVE_UP = "cannot set clocks: <b>NVML_ERROR_NO_PERMISSION</b> (run as root or unlock clocks)"

T = TypeVar("T")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver")
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1500,1250", "--disable-gpu"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def planner(tmp_path: Path) -> Iterator[str]:
    settings = Settings(
        database=f"sqlite:///{tmp_path / 'ui.db'}",
        admin_token=SecretStr(ADMIN),
        warm_planner=False,
        polish_s=0.0,
        telemetry_flush_s=0.05,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the planner did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(30)


def _rows() -> dict[int, list[dict[str, Any]]]:
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        rows: dict[int, list[dict[str, Any]]] = {}
        for row in profile_to_json(load_profile(path))["rows"]:
            rows.setdefault(row.pop("stage"), []).append(row)
        return rows


def _job(http: httpx.Client, name: str, *, reports: bool) -> tuple[str, str]:
    """A planned job; with ``reports``, recorded iterations as a fake-GPU run reports them
    (:func:`_report_run`)."""
    job, token = _registered(http, name)
    auth = {"Authorization": f"Bearer {token}"}
    rows = _rows()
    for rank in range(STAGES):
        body = {"rank": rank, "stage": rank, "rows": rows[rank]}
        http.post(f"/v1/jobs/{job}/profiles", json=body, headers=auth).raise_for_status()
    # Planning runs at the lowest CPU priority: on a busy host it may take more than one poll.
    plan, deadline = f"/v1/jobs/{job}/plan", time.monotonic() + 180
    while http.get(plan, params={"rank": 0, "wait_s": 30}, headers=auth).status_code != 200:
        assert time.monotonic() < deadline, f"job {job} was never planned"
        time.sleep(0.1)
    if reports:
        _report_run(http, job, auth)
    return job, token


def _registered(http: httpx.Client, name: str) -> tuple[str, str]:
    """A job whose ranks registered (none profiled yet)."""
    created = (
        http.post(
            "/v1/jobs",
            json={
                "name": name,
                "schedule": "1f1b",
                "stages": STAGES,
                "microbatches": 4,
                "data_parallel": 1,
                "tensor_parallel": 1,
                "p_block_w": P_BLOCK_W,
            },
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        .raise_for_status()
        .json()
    )
    job, token = created["job_id"], created["token"]
    auth = {"Authorization": f"Bearer {token}"}
    clocks = sorted({r["frequency_mhz"] for stage in _rows().values() for r in stage})
    for rank in range(STAGES):
        body = {"rank": rank, "stage": rank, "data_parallel_rank": 0, "tensor_parallel_rank": 0,
                "gpu_name": "NVIDIA H200", "supported_clocks_mhz": clocks}  # fmt: skip
        http.post(f"/v1/jobs/{job}/ranks", json=body, headers=auth).raise_for_status()
    return job, token


PROFILING_ITERATIONS, BASELINE_ITERATIONS, ITERATIONS = 40, 10, 200
OUTLIER_S = 6.49  # one iteration while the ranks calibrate: the sweep's loops stall it


def _report_run(http: httpx.Client, job: str, auth: dict[str, str]) -> None:
    """Iterations as a fake-GPU run reports them, from the plan's replayed timeline with a
    few per cent of noise: each rank's span (its first instruction to its last) and its share
    of the span energy (the point's energy less the blocking outside the spans). Profiling
    first (one iteration stalled to :data:`OUTLIER_S`), then baseline iterations at default
    clocks (the default plan's energy), then plan version 1."""
    timeline = http.get(f"/v1/jobs/{job}/timeline", headers=auth).raise_for_status().json()
    frontier = http.get(f"/v1/jobs/{job}/frontier", headers=auth).raise_for_status().json()
    spans = [row[-1]["finish_s"] - row[0]["start_s"] for row in timeline["gpus"]]
    span_energy_j = timeline["energy_j"] - P_BLOCK_W * sum(timeline["time_s"] - s for s in spans)
    default_share = frontier["baselines"]["default"]["energy_j"] / timeline["energy_j"]
    for it in range(ITERATIONS):
        noise = 1 + 0.01 * ((it * 7) % 5 - 2)
        for rank in range(STAGES):
            energy_j = span_energy_j * spans[rank] / sum(spans)
            if it < PROFILING_ITERATIONS:
                phase, version = "profiling", None
                time_s, energy_j = spans[rank] * 1.02, energy_j * default_share
                if it == 3:
                    time_s, energy_j = OUTLIER_S, energy_j * OUTLIER_S / time_s
            elif it < PROFILING_ITERATIONS + BASELINE_ITERATIONS:
                phase, version = "baseline", None
                time_s, energy_j = spans[rank] * 0.99, energy_j * default_share
            else:
                phase, version, time_s = "plan", 1, spans[rank]
            body = {"rank": rank, "iteration": it, "phase": phase, "plan_version": version,
                    "time_s": time_s * noise, "energy_j": energy_j * noise}  # fmt: skip
            http.post(f"/v1/jobs/{job}/iterations", json=body, headers=auth).raise_for_status()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _until(what: Callable[[], Any], timeout_s: float = 15) -> Any:
    """``what()`` once it is truthy (or at the timeout); an element the page re-rendered
    between finding it and reading it (it polls the API), or one not there yet (a page still
    reloading), is looked up again."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = what()
        except (StaleElementReferenceException, NoSuchElementException):
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def _fresh(what: Callable[[], T]) -> T:
    """``what()``, done again while it meets an element the page has just replaced: every
    2 s it polls the API and re-renders the jobs' rows, the ranks and the frontier, so an
    element found one call earlier may be gone by the next (stale)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(20):
        try:
            return what()
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError("the page kept replacing what was looked up")


def _login(driver: Any, url: str, token: str, job: str = "") -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/ui")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{url}/ui")
    driver.find_element(By.ID, "token").send_keys(token)
    if job:
        driver.find_element(By.ID, "job").send_keys(job)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    assert _until(lambda: driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")), (
        driver.find_element(By.ID, "status").text
    )


def _cell(driver: Any, job: str, field: str) -> str:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(20):  # the page re-renders its rows as it polls: look the cell up again
        found = driver.find_elements(
            By.CSS_SELECTOR, f'tr[data-job="{job}"] [data-field="{field}"]'
        )
        try:
            return str(found[0].text) if found else ""
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError(f"job {job}'s {field} cell kept changing")


def _boxes(driver: Any) -> list[tuple[int, str, int]]:
    """The timeline's boxes: (GPU, label, clock) in drawing order."""
    from selenium.webdriver.common.by import By

    return [
        (int(b.get_attribute("data-gpu")), b.get_attribute("data-instruction"),
         int(b.get_attribute("data-clock")))
        for b in driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .box")
    ]  # fmt: skip


def _api_boxes(timeline: dict[str, Any]) -> list[tuple[int, str, int]]:
    letter = {"forward": "F", "backward": "B"}
    return [
        (gpu, f"{letter[i['instruction']]}{i['microbatch']}", i["frequency_mhz"])
        for gpu, row in enumerate(timeline["gpus"])
        for i in row
    ]


def _rank_state(driver: Any, rank: int) -> str:
    from selenium.webdriver.common.by import By

    def read() -> str:
        found = driver.find_elements(
            By.CSS_SELECTOR, f'#ranks tr[data-rank="{rank}"] [data-field="rank-state"]'
        )
        return str(found[0].text) if found else ""

    return _fresh(read)


def _job_rows(driver: Any) -> list[str]:
    """The jobs table's rows, by job id, in order."""
    from selenium.webdriver.common.by import By

    return _fresh(
        lambda: [
            str(r.get_attribute("data-job"))
            for r in driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
        ]
    )


def _hover(driver: Any, by: str, selector: str) -> None:
    """Move the mouse onto the element ``selector`` names (looked up again if replaced)."""
    from selenium.webdriver.common.action_chains import ActionChains

    _fresh(
        lambda: ActionChains(driver).move_to_element(driver.find_element(by, selector)).perform()
    )


def _markup_in(driver: Any, selector: str) -> list[Any]:
    """The elements inside the one ``selector`` names (none: it holds text only)."""
    from selenium.webdriver.common.by import By

    return _fresh(
        lambda: driver.find_element(By.CSS_SELECTOR, selector).find_elements(By.CSS_SELECTOR, "*")
    )


def _screenshot(driver: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    driver.save_screenshot(str(path))
    keep = os.environ.get("PERSEUS_UI_SCREENSHOTS")
    if keep:
        shutil.copy(path, Path(keep) / name)
    return path


def test_the_page_shows_the_apis_numbers_and_follows_a_policy_change(
    browser: Any,
    planner: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from selenium.webdriver.common.by import By

    with httpx.Client(base_url=planner, timeout=60) as http:
        job, token = _job(http, MARKUP_NAME, reports=True)
        other, other_token = _job(http, "second job", reports=False)
        auth = {"Authorization": f"Bearer {token}"}
        view = http.get(f"/v1/jobs/{job}", headers=auth).json()
        timeline = http.get(f"/v1/jobs/{job}/timeline", headers=auth).json()
    savings = view["savings"]
    assert savings is not None and savings["realized_saving"] is not None

    _login(browser, planner, ADMIN)
    assert token not in browser.current_url and ADMIN not in browser.current_url
    assert _job_rows(browser) == [other, job]  # newest first
    _fresh(lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{job}"]').click())
    assert _until(lambda: job in browser.find_element(By.ID, "detail-title").text)

    # The numbers are the API's.
    assert _cell(browser, job, "state") == "ready"
    assert _cell(browser, job, "policy") == "no-slowdown"
    assert _cell(browser, job, "realized_saving") == _pct(savings["realized_saving"])
    assert _cell(browser, job, "predicted_saving") == _pct(savings["predicted_saving"])
    assert _cell(browser, job, "energy_saved_j") == f"{round(savings['energy_saved_j']):,} J"
    assert _cell(browser, job, "ranks") == f"{STAGES} / {STAGES}"
    assert _cell(browser, job, "chosen") == f"v1, point {view['chosen']['index']}"

    # The name is text, never markup.
    assert _cell(browser, job, "name") == MARKUP_NAME
    assert _markup_in(browser, f'tr[data-job="{job}"] [data-field="name"]') == []
    assert browser.execute_script("return window.pwned") is None
    assert MARKUP_NAME in browser.find_element(By.ID, "detail-title").text

    # The detail: frontier with baselines and the chosen point, iterations, ranks.
    assert _until(lambda: browser.find_elements(By.ID, "chosen-point"))
    assert browser.find_elements(By.CSS_SELECTOR, "#frontier [data-baseline~=default]")
    _hover(browser, By.ID, "chosen-point")
    hover = _until(lambda: browser.find_element(By.ID, "hover").text)
    chosen = view["chosen"]
    assert f"{chosen['time_s']:.4f} s, {chosen['energy_j']:.1f} J, saving" in hover
    assert browser.find_elements(By.CSS_SELECTOR, "#iterations circle")
    ranks = _fresh(
        lambda: [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#ranks tbody tr")]
    )
    assert len(ranks) == STAGES
    assert all("following plan v1" in text for text in ranks)
    assert all(_rank_state(browser, rank) == "following plan v1" for rank in range(STAGES))

    # The running plan's timeline: a row per GPU, the API's instructions and clocks.
    assert _until(lambda: _boxes(browser)) == _api_boxes(timeline)
    assert len({gpu for gpu, _, _ in _fresh(lambda: _boxes(browser))}) == STAGES
    caption = browser.find_element(By.ID, "timeline-caption").text
    assert caption.startswith(
        f"plan v1, point {view['chosen']['index']}: {timeline['time_s']:.4f} s"
    )
    _hover(browser, By.CSS_SELECTOR, "#timeline-svg .box")
    first = timeline["gpus"][0][0]
    assert _until(lambda: browser.find_element(By.ID, "timeline-hover").text).startswith(
        f"GPU 0: F0 (forward, microbatch 0) at {first['frequency_mhz']} MHz"
    )
    _the_charts_read_at_a_glance(browser, activity=_activity(planner, job, token),
                                 timeline=timeline)  # fmt: skip
    browser.set_window_size(1500, 1550)  # the whole page, the charts taller than before
    _screenshot(browser, tmp_path, "ui.png")
    browser.set_window_size(1500, 1250)

    # A policy change made through the CLI shows without a reload.
    browser.execute_script("window.sameDocument = true")
    for name_, value in (("PERSEUS_SERVER", planner), ("PERSEUS_JOB", job),
                         ("PERSEUS_TOKEN", token)):  # fmt: skip
        monkeypatch.setenv(name_, value)
    assert main(["job", "policy", "max-slowdown:1.1"]) == 0
    assert _until(lambda: _cell(browser, job, "policy") == "max-slowdown:1.1")
    assert _until(lambda: _cell(browser, job, "chosen").startswith("v2, point"))
    # ... and so does the new plan's timeline.
    with httpx.Client(base_url=planner, timeout=60) as http:
        moved = http.get(f"/v1/jobs/{job}/timeline", headers=auth).json()
    assert moved["version"] == 2
    assert _until(lambda: _boxes(browser) == _api_boxes(moved))
    caption = browser.find_element(By.ID, "timeline-caption").text
    assert caption.startswith(f"plan v2, point {moved['point']}:")
    assert browser.execute_script("return window.sameDocument") is True

    # A rank that gave up: its state says why (as text) and when; the others follow.
    with httpx.Client(base_url=planner, timeout=60) as http:
        r = http.post(f"/v1/jobs/{other}/ranks:gave-up", json={"rank": 2, "reason": GAVE_UP},
                      headers={"Authorization": f"Bearer {other_token}"})  # fmt: skip
        assert r.status_code == 200, r.text
    _fresh(lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{other}"]').click())
    state = _until(lambda: "gave up" in _rank_state(browser, 2) and _rank_state(browser, 2))
    assert state.startswith("gave up at ") and state.endswith(f": {GAVE_UP}")
    assert _markup_in(browser, '#ranks tr[data-rank="2"] [data-field="rank-state"]') == []
    assert "1 of 4 ranks gave up" in browser.find_element(By.ID, "detail-summary").text
    assert _until(
        lambda: browser.find_element(By.ID, "timeline-caption").text.startswith("plan v1")
    )
    assert browser.find_element(By.ID, "timeline-hover").text == ""  # the other job's box
    browser.set_window_size(1500, 1450)
    _screenshot(browser, tmp_path, "ui-gave-up.png")
    browser.set_window_size(1500, 1250)


def _activity(planner: str, job: str, token: str) -> dict[str, Any]:
    with httpx.Client(base_url=planner, timeout=60) as http:
        url = f"/v1/jobs/{job}/activity"
        reply = http.get(url, headers={"Authorization": f"Bearer {token}"})
        return dict(reply.raise_for_status().json())


# The boxes of the frontier's labels and markers, and whether any two of them overlap.
_FRONTIER_BOXES = """
const box = (n) => {
  const r = n.getBoundingClientRect();
  return [r.left, r.top, r.right, r.bottom];
};
const labels = [...document.querySelectorAll("#frontier text.label")].map(box);
const markers = [...document.querySelectorAll("#frontier circle, #frontier .baseline rect")]
  .map(box);
return {labels, markers};
"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _the_charts_read_at_a_glance(
    driver: Any, *, activity: dict[str, Any], timeline: dict[str, Any]
) -> None:
    """The iteration chart: a range robust to the stalled iteration (said to be off the
    chart), whole iterations from 0 at round ticks, a legend, time and energy, each with the
    prediction of what the ranks measure (a rank's span). The frontier: labels named as the
    command line names them, overlapping no other label and no marker."""
    from selenium.webdriver.common.by import By

    def texts(selector: str) -> list[str]:
        return _fresh(lambda: [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)])

    assert _until(lambda: texts("#iterations-svg .off-note"))
    stalled = max(i["time_s"] for i in activity["iterations"])
    notes = texts("#iterations-svg .off-note")
    assert notes[0] == f"1 iteration above the chart ({stalled:.4f} s)"
    assert notes[1].startswith("1 iteration above the chart (") and notes[1].endswith(" J)")
    ticks = texts("#iterations-svg text.tick.x")
    assert ticks[0] == "0" and all(t.isdigit() for t in ticks)
    steps = {int(b) - int(a) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1 and steps.pop() in (1, 2, 5, 10, 20, 25, 50, 100)
    legend = " ".join(texts("#iterations-svg .legend text"))
    assert legend == "profiling baseline plan predicted, plan v1"
    spans = sorted(row[-1]["finish_s"] - row[0]["start_s"] for row in timeline["gpus"])
    median = (spans[1] + spans[2]) / 2
    span_energy = timeline["energy_j"] - timeline["p_block_w"] * sum(
        timeline["time_s"] - s for s in spans
    )
    lines = _fresh(
        lambda: [
            float(e.get_attribute("data-value"))
            for e in driver.find_elements(By.CSS_SELECTOR, "#iterations-svg line.predicted")
        ]
    )
    assert lines == pytest.approx([median, span_energy])
    caption = driver.find_element(By.ID, "iterations-caption").text
    assert f"Predicted for plan v1: {median:.4f} s, {span_energy:.1f} J." in caption
    assert f"the whole pipeline's {timeline['time_s']:.4f} s also counts the fill" in caption
    # The frontier's labels.
    labels = texts("#frontier text.label")
    assert labels[0] == "chosen: no-slowdown (point 0)"
    named = " = ".join(labels[1:]).split(" = ")
    assert sorted(named) == sorted(
        ["default (max clock)", "all-fastest", "global clock", "per-stage clock"]
    )
    boxes = driver.execute_script(_FRONTIER_BOXES)
    for i, label in enumerate(boxes["labels"]):
        assert not any(_overlap(label, other) for other in boxes["labels"][i + 1 :]), labels
        assert not any(_overlap(label, marker) for marker in boxes["markers"]), labels[i]
    # The helpers themselves, as the page runs them.
    charts = "return window.perseusCharts."
    assert driver.execute_script(charts + "niceTicks(-5.75, 33.6, 6, true)")["ticks"] == [
        -10, -5, 0, 5, 10, 15, 20, 25, 30, 35
    ]  # fmt: skip
    assert driver.execute_script(charts + "niceTicks(0.4396, 4.856, 4)")["ticks"] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    outlier = driver.execute_script(
        charts + "robustRange(arguments[0])", [0.76 + 0.001 * (i % 7) for i in range(200)] + [6.49]
    )
    assert outlier == pytest.approx([0.76, 0.766])


def test_the_page_shows_how_far_each_rank_profiled(browser: Any, planner: str) -> None:
    from selenium.webdriver.common.by import By

    with httpx.Client(base_url=planner, timeout=60) as http:
        job, token = _registered(http, "profiling")
        auth = {"Authorization": f"Bearer {token}"}
        for rank in range(STAGES):
            progress = {"clocks_done": 10 + rank, "clocks_planned": 110,
                        "elapsed_s": 3.4 * (10 + rank), "budget_s": 600.0}  # fmt: skip
            if rank == 3:
                progress = {"clocks_done": 0, "clocks_planned": 110, "elapsed_s": 0.0}
            body = {"rank": rank, "iteration": 12, "phase": "profiling", "time_s": 0.8,
                    "energy_j": 300.0, "profiling": progress}  # fmt: skip
            http.post(f"/v1/jobs/{job}/iterations", json=body, headers=auth).raise_for_status()
        view = http.get(f"/v1/jobs/{job}", headers=auth).json()
    assert [p["clocks_done"] for p in view["profiling"]] == [10, 11, 12, 0]
    _login(browser, planner, token, job)
    assert _until(lambda: _rank_state(browser, 0).startswith("profiling"))
    assert _rank_state(browser, 0) == "profiling: 10 of 110 clocks, about 5 min 40 s left"
    assert _rank_state(browser, 2) == "profiling: 12 of 110 clocks, about 5 min 33 s left"
    assert _rank_state(browser, 3) == (
        "profiling: 0 of 110 clocks (the time left is known once the first clock is measured)"
    )
    summary = browser.find_element(By.ID, "detail-summary").text
    assert "4 ranks profiling, about 5 min 40 s left (the slowest)" in summary


def _status(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, "status").text)


def test_the_page_pages_through_every_job_newest_first(browser: Any, planner: str) -> None:
    """1,050 jobs: the first page shows the newest, the status line the true total, and
    the pager reaches the oldest (the page once showed the 100 oldest and said "100 jobs")."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    admin = {"Authorization": f"Bearer {ADMIN}"}
    spec = {"schedule": "1f1b", "stages": 2, "microbatches": 2, "data_parallel": 1,
            "tensor_parallel": 1}  # fmt: skip
    with httpx.Client(base_url=planner, timeout=60, headers=admin) as http:
        ids = [
            http.post("/v1/jobs", json={**spec, "name": f"j{i}"})
            .raise_for_status()
            .json()["job_id"]
            for i in range(1050)
        ]
    _login(browser, planner, ADMIN)
    newest = ids[::-1]
    assert _until(lambda: _job_rows(browser) == newest[:50])
    assert _until(lambda: _status(browser).startswith("1,050 jobs, updated"))
    page = browser.find_element(By.ID, "page")
    assert page.text == "jobs 1-50 of 1,050"
    assert browser.find_element(By.ID, "newer").get_property("disabled") is True

    browser.find_element(By.ID, "older").click()
    assert _until(lambda: _job_rows(browser) == newest[50:100])
    assert _until(lambda: page.text == "jobs 51-100 of 1,050")
    for _ in range(19):
        browser.find_element(By.ID, "older").click()
    assert _until(lambda: _job_rows(browser) == newest[1000:], timeout_s=60)
    assert _until(lambda: page.text == "jobs 1,001-1,050 of 1,050")
    assert browser.find_element(By.ID, "older").get_property("disabled") is True

    # Oldest first at a switch; the job chosen on one page stays shown on another.
    _fresh(lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{ids[3]}"]').click())
    assert _until(lambda: ids[3] in browser.find_element(By.ID, "detail-title").text)
    Select(browser.find_element(By.ID, "order")).select_by_value("oldest")
    assert _until(lambda: _job_rows(browser) == ids[:50])
    browser.find_element(By.ID, "older").click()  # in the oldest-first order: back is older
    assert browser.find_element(By.ID, "older").get_property("disabled") is True
    browser.find_element(By.ID, "newer").click()
    assert _until(lambda: _job_rows(browser) == ids[50:100])
    _fresh(lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{ids[60]}"]').click())
    assert _until(lambda: ids[60] in browser.find_element(By.ID, "detail-title").text)
    browser.find_element(By.ID, "older").click()
    assert _until(lambda: _job_rows(browser) == ids[:50])
    assert _until(lambda: ids[60] in browser.find_element(By.ID, "detail-title").text)


def test_a_job_token_sees_its_job_only(browser: Any, planner: str) -> None:
    from selenium.webdriver.common.by import By

    with httpx.Client(base_url=planner, timeout=60) as http:
        job, token = _job(http, "mine", reports=False)
        _job(http, "not mine", reports=False)
    _login(browser, planner, token, job)
    assert _job_rows(browser) == [job]

    # A job's token cannot list the others: the page asks again.
    browser.execute_script("sessionStorage.removeItem('perseus.job'); location.reload()")
    assert _until(lambda: browser.find_element(By.ID, "login").is_displayed())
    assert "admin token" in browser.find_element(By.ID, "status").text


def test_the_page_and_its_files_come_from_the_planner(planner: str) -> None:
    """No CDN: every script and style the page names is served by the planner."""
    with httpx.Client(base_url=planner, timeout=10) as http:
        page = http.get("/ui")
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]
        html = page.text
        assert "http://" not in html and "https://" not in html
        for asset in ("ui/static/ui.js", "ui/static/ui.css"):
            assert f'"{asset}"' in html
            served = http.get(f"/{asset}")
            assert served.status_code == 200 and served.content
            assert b"https://" not in served.content
        assert json.loads(http.get("/openapi.json").text)["paths"].get("/ui") is None


def _watts(value: float) -> str:
    """Watts as the page and ``perseus cluster status`` say them."""
    for scale, unit in ((1e6, "MW"), (1e3, "kW")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} W"


def test_the_page_shows_the_cluster_budget_and_what_it_does_to_a_job(
    browser: Any, planner: str, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    def text(element: str) -> str:
        return str(_fresh(lambda: browser.find_element(By.ID, element).text))

    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=planner, timeout=60) as http:
        job, token = _job(http, "under a budget", reports=False)
        _login(browser, planner, ADMIN)
        assert _until(lambda: text("cluster-budget") == "no budget")
        assert text("cluster-met") == ""

        free = http.get("/v1/cluster/budget", headers=admin).json()
        budget_w = free["least_w"] + 0.5 * (free["policy_w"] - free["least_w"])
        r = http.put("/v1/cluster/budget", json={"power_w": budget_w}, headers=admin)
        assert r.status_code == 200, r.text
        r = http.put(f"/v1/jobs/{job}/priority", json={"priority": 2}, headers=admin)
        assert r.status_code == 200, r.text
        status = http.get("/v1/cluster/budget", headers=admin).json()
        view = http.get(f"/v1/jobs/{job}", headers={"Authorization": f"Bearer {token}"}).json()
    assert status["met"] is True and view["budget"] is not None

    assert _until(lambda: text("cluster-budget") == f"budget: {_watts(budget_w)}")
    share = f"{100 * status['predicted_w'] / budget_w:.1f} % of the budget"
    assert text("cluster-power").startswith(f"predicted: {_watts(status['predicted_w'])} ({share})")
    assert f"at the jobs' policies: {_watts(status['policy_w'])}" in text("cluster-power")
    assert text("cluster-met").startswith("met: every job within the budget")
    assert not browser.find_element(By.ID, "cluster-window").is_displayed()

    _fresh(lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{job}"]').click())
    line = f"priority 2; {view['budget']['reason']}"
    assert _until(lambda: text("detail-budget") == line), text("detail-budget")
    assert "% slower than your policy" in line

    # A scheduled window, and a budget below the least the job can draw: said, not hidden.
    start_s = time.time() + 3600
    with httpx.Client(base_url=planner, timeout=60) as http:
        r = http.put("/v1/cluster/budget", headers=admin, json={
            "power_w": budget_w / 2, "from_s": start_s, "to_s": start_s + 600})  # fmt: skip
        assert r.status_code == 200, r.text
        r = http.put("/v1/cluster/budget", json={"power_w": 0.5 * free["least_w"]}, headers=admin)
        assert r.status_code == 200, r.text
        unmet = r.json()
    assert unmet["meetable"] is False
    said = f"not met: {unmet['message']}"
    assert _until(lambda: text("cluster-met") == said), text("cluster-met")
    assert "scheduled" in text("cluster-window")
    assert text("cluster-window").startswith(f"window: {_watts(budget_w / 2)} from ")
    browser.set_window_size(1500, 1550)
    _screenshot(browser, tmp_path, "ui-budget.png")
    browser.set_window_size(1500, 1250)

    # A job's token: no cluster panel (the route needs the admin token), the job still shows.
    _login(browser, planner, token, job)
    assert not browser.find_element(By.ID, "cluster").is_displayed()
