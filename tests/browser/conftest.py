"""Browser tests: one real `streamlit run app.py` and one headless Chromium for the whole session.

The server runs with its own GRADACC_HOME (a tmp dir), on the CPU and offline. Its log goes to
test-artifacts/streamlit.log; a failing test leaves a screenshot in test-artifacts/failures/.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("GRADACC_CHROMIUM", "/usr/bin/chromium")
# The flags that keep Chromium off the network (this machine has none) and quiet as root.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SERVER_START_TIMEOUT_S = 90
VIEWPORT = {"width": 1400, "height": 1000}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


# Without Playwright the test modules cannot even be imported: leave them out locally (said at the end
# of the run); in CI let the import fail loudly.
HAVE_PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
if not HAVE_PLAYWRIGHT and not in_ci():
    collect_ignore_glob = ["test_*.py"]


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    # This session's timings and failures only.
    (ARTIFACTS / "latency.json").unlink(missing_ok=True)
    shutil.rmtree(ARTIFACTS / "failures", ignore_errors=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def app_url(artifacts, tmp_path_factory) -> str:
    """Start the app on a free port; yield its URL; stop it (and anything it started) at the end."""
    home = tmp_path_factory.mktemp("browser-gradacc-home")
    port = free_port()
    env = {
        **os.environ,
        "GRADACC_HOME": str(home),
        "GRADACC_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "GRADACC_ALLOW_HUB": "0",
        # A run left going by a failed test must not hold the only slot for long.
        "GRADACC_MAX_RUN_SECONDS": "240",
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "streamlit", "run", "app.py",
               "--server.port", str(port), "--server.address", "127.0.0.1",
               "--server.headless", "true", "--browser.gatherUsageStats", "false",
               "--server.fileWatcherType", "none"]
    log_path = artifacts / "streamlit.log"
    with open(log_path, "wb") as log:
        # Own process group: teardown can end the server and any child it started, and nothing else.
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(server, url, log_path)
        yield url
    finally:
        stop(server)


def wait_until_healthy(server: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"streamlit exited with {server.returncode} before it was healthy:\n{log_tail(log_path)}",
                        pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass  # not listening yet
        time.sleep(0.25)
    pytest.fail(f"streamlit was not healthy within {SERVER_START_TIMEOUT_S} s:\n{log_tail(log_path)}", pytrace=False)


def stop(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=5)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def browser():
    if not (os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM)):
        missing(f"Chromium not found at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
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
            import st_ui  # beside this file; imported here so a missing playwright only skips

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
