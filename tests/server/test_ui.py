"""The web page at ``/ui`` in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium, against a real planner on loopback whose job is fed
by recorded iteration reports. Skips where Chromium, its driver or Selenium is missing.

Set ``PERSEUS_UI_SCREENSHOTS=DIR`` to keep the page's screenshots (``docs/ui.png`` is one).
"""

from __future__ import annotations

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
    """A planned job; with ``reports``, recorded iterations: 6 at default clocks, then 10
    under plan version 1, every rank."""
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
                "p_block_w": 100.0,
            },
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        .raise_for_status()
        .json()
    )
    job, token = created["job_id"], created["token"]
    auth = {"Authorization": f"Bearer {token}"}
    rows = _rows()
    clocks = sorted({r["frequency_mhz"] for stage in rows.values() for r in stage})
    for rank in range(STAGES):
        body = {"rank": rank, "stage": rank, "data_parallel_rank": 0, "tensor_parallel_rank": 0,
                "gpu_name": "NVIDIA H200", "supported_clocks_mhz": clocks}  # fmt: skip
        http.post(f"/v1/jobs/{job}/ranks", json=body, headers=auth).raise_for_status()
    for rank in range(STAGES):
        body = {"rank": rank, "stage": rank, "rows": rows[rank]}
        http.post(f"/v1/jobs/{job}/profiles", json=body, headers=auth).raise_for_status()
    # Planning runs at the lowest CPU priority: on a busy host it may take more than one poll.
    plan, deadline = f"/v1/jobs/{job}/plan", time.monotonic() + 180
    while http.get(plan, params={"rank": 0, "wait_s": 30}, headers=auth).status_code != 200:
        assert time.monotonic() < deadline, f"job {job} was never planned"
        time.sleep(0.1)
    if reports:
        for it in range(16):
            for rank in range(STAGES):
                base = it < 6
                body = {"rank": rank, "iteration": it, "phase": "baseline" if base else "plan",
                        "plan_version": None if base else 1,
                        "time_s": 1.10 + 0.002 * (it % 3) if base else 1.11 + 0.002 * (it % 2),
                        "energy_j": 360.0 + rank if base else 330.0 + rank}  # fmt: skip
                url = f"/v1/jobs/{job}/iterations"
                http.post(url, json=body, headers=auth).raise_for_status()
    return job, token


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
    assert browser.find_elements(By.CSS_SELECTOR, "#frontier [data-baseline=default]")
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
    browser.set_window_size(1500, 1450)
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
