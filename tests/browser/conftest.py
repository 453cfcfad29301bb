"""Browser tests: one real `streamlit run app.py` and one headless Chromium for the whole session (for each of
pytest-xdist's workers).

The server runs with its own GRADACC_HOME (a tmp dir), on the CPU and offline. Its log goes to
test-artifacts/streamlit.log; a failing test leaves a screenshot in test-artifacts/failures/ (under two workers, in
test-artifacts/gw0/ and gw1/).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
from support import ARTIFACTS, WORKER, StreamlitServer

from chromium import CHROMIUM, VIEWPORT, launch  # scripts/browsing/, on the path through support


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


# Without Playwright the test modules cannot even be imported: leave them out locally (said at the end
# of the run); in CI let the import fail loudly.
HAVE_PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
if not HAVE_PLAYWRIGHT and not in_ci():
    collect_ignore_glob = ["test_*.py"]


if HAVE_PLAYWRIGHT:
    from playwright.sync_api import expect

    # Playwright's `expect` waits 5 s by default: a page still loading plotly.js (4.8 MB unzipped) on a machine
    # busy with other test suites took longer. A wait ends as soon as its condition holds, so a longer one only
    # delays a failure; an expectation about pace states its own timeout.
    expect.set_options(timeout=20_000)


def pytest_terminal_summary(terminalreporter):
    if not HAVE_PLAYWRIGHT and not in_ci():
        terminalreporter.write_line("browser tests not run: the playwright package is not installed; "
                                    "run scripts/install-test-deps.sh", yellow=True)


def missing(reason: str):
    """In CI a missing browser is a broken setup, not a reason to pass quietly."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: browser tests must run; see scripts/install-test-deps.sh)",
                    pytrace=False)
    pytest.skip(f"{reason}; run scripts/install-test-deps.sh to run the browser tests")


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """test-artifacts/, or test-artifacts/gw0/ for the first of pytest-xdist's workers: each worker drives a server of
    its own, whose log, timings, screenshots and failures stay together."""
    folder = ARTIFACTS / WORKER
    folder.mkdir(parents=True, exist_ok=True)
    # This session's timings and failures only.
    (folder / "latency.json").unlink(missing_ok=True)
    shutil.rmtree(folder / "failures", ignore_errors=True)
    return folder


@pytest.fixture(scope="session")
def app_url(artifacts, tmp_path_factory) -> str:
    """Start the app (support.StreamlitServer) for the whole session; yield its URL; stop it at the end."""
    log_path = artifacts / "streamlit.log"
    log_path.unlink(missing_ok=True)  # this session's log only
    # A run left going by a failed test must not hold the only slot for long.
    server = StreamlitServer(tmp_path_factory.mktemp("browser-gradacc-home"), log_path,
                             # Demos at a tenth of their stage size (at least the steps each story needs,
                             # Scenario.min_steps): the same story in seconds.
                             {"GRADACC_MAX_RUN_SECONDS": "240", "GRADACC_DEMO_SCALE": "0.1"})
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser():
    if not (os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM)):
        missing(f"Chromium not found at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, app_url, request, artifacts):
    """A fresh browser context per test (a new Streamlit session), opened on the app."""
    context = browser.new_context(viewport=VIEWPORT, base_url=app_url)
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        failures = artifacts / "failures"
        failures.mkdir(exist_ok=True)
        try:
            import st_ui  # scripts/browsing/; imported here so a missing playwright only skips

            st_ui.screenshot(page, failures / f"{request.node.name}.png")
        except Exception as error:  # a crashed page must not hide the test's own failure
            print(f"could not save a failure screenshot: {error}")
    # A run this test left going would hold the server's only run slot: stop it as a person would.
    try:
        stop_button = page.get_by_test_id("stMain").get_by_role("button", name="Stop", exact=True)
        if stop_button.count():
            stop_button.click(timeout=5_000)
    except Exception as error:
        print(f"could not stop a leftover run: {error}")
    context.close()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item so the page fixture knows whether the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
