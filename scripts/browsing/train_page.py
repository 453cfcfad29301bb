"""Steps on gradacc's Train page, written the way a person would do them."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from playwright.sync_api import Locator, Page, expect

import st_ui

ADVANCED = "Advanced: data size and sequence length"
# Runs take seconds on a quiet machine; these leave room for a busy one (a shared 2-core CI box).
FIRST_LOSS_TIMEOUT_MS = 90_000
RUN_TIMEOUT_MS = 180_000


def configure(page: Page, micro_batch: int, grad_accum_steps: int, epochs: int = 1,
              train_samples: int | None = None, eval_samples: int | None = None) -> None:
    st_ui.set_number(page, "Micro-batch size (m)", micro_batch)
    st_ui.set_number(page, "Accumulation steps (k)", grad_accum_steps)
    st_ui.set_number(page, "Epochs", epochs)
    if train_samples is not None or eval_samples is not None:
        assert st_ui.open_expander(page, ADVANCED), f"no {ADVANCED!r} section on the Train page"
        if train_samples is not None:
            st_ui.set_number(page, "Training samples", train_samples)
        if eval_samples is not None:
            st_ui.set_number(page, "Eval samples", eval_samples)
    expect(st_ui.metric_value(page, "Effective batch")).to_have_text(str(micro_batch * grad_accum_steps))


def run_in_url(url: str) -> str | None:
    found = re.search(r"[?&]run=([\w-]+)", url)
    return found.group(1) if found else None


def current_run(page: Page) -> str | None:
    """The id of the run the page shows: Start puts it in the URL (?run=...)."""
    return run_in_url(page.url)


def status_panel(page: Page) -> Locator:
    """The status panel of the page's current run: after a second Start the last run's panel may still be on
    screen for a moment, so everything is looked up inside the panel keyed by the run's id."""
    return page.locator(f".st-key-run-{current_run(page)}-status")


def loss_traces(page: Page) -> Locator:
    """The loss chart's drawn series, of the current run only."""
    return st_ui.traces(page.locator(f".st-key-run-{current_run(page)}-charts").locator(".js-plotly-plot").filter(
        has=page.locator(".gtitle", has_text="Training loss")))


def wait_for_libraries(page: Page) -> float:
    """Until the page says torch and transformers are imported; returns the seconds waited."""
    waited = time.monotonic()
    expect(page.get_by_text("Training libraries ready")).to_be_visible(timeout=FIRST_LOSS_TIMEOUT_MS)
    return time.monotonic() - waited


def start(page: Page) -> str:
    """Click Start; returns the new run's id once the URL names it."""
    before = current_run(page)
    button = st_ui.button(page, "Start")
    expect(button).to_be_enabled()
    button.click()
    page.wait_for_url(lambda url: run_in_url(url) != before, timeout=st_ui.RERUN_TIMEOUT_MS)
    return current_run(page)


def start_and_time_first_loss(page: Page) -> dict:
    """Click Start; return the seconds until the loss chart holds the run's first point.

    Waits for the chart, not for the "Running on" status: a small run can load, train and finish
    between two polls of the live panel, and then that status is never on screen. A run that fails
    instead ends the wait at once with its reason.
    """
    clicked = time.monotonic()
    start(page)
    failed = st_ui.alert(status_panel(page), re.compile(r"^Failed"))
    # wait_for polls on every animation frame: a tighter clock than expect's back-off.
    loss_traces(page).first.or_(failed).wait_for(state="attached", timeout=FIRST_LOSS_TIMEOUT_MS)
    seconds = round(time.monotonic() - clicked, 3)
    assert not failed.count(), f"the run failed: {failed.first.inner_text()}"
    return {"click_to_first_loss_s": seconds}


def wait_until_ended(page: Page, status: str, timeout_ms: int = RUN_TIMEOUT_MS) -> None:
    """Until the current run's status line says it is ``status`` (Completed, Stopped, Failed)."""
    expect(st_ui.alert(status_panel(page), re.compile(rf"^{status}\b"))).to_be_visible(timeout=timeout_ms)
    expect(st_ui.button(page, "Start")).to_be_enabled()


def run_seconds(page: Page) -> float | None:
    """The run's own wall time, from the status line ("Completed: 16 optimizer steps in 4.2 s.")."""
    line = st_ui.alert(status_panel(page), re.compile(r"^(Completed|Stopped)")).first.inner_text()
    found = re.search(r" in ([\d.]+) s\b", line)
    return float(found.group(1)) if found else None


def record_latency(artifacts: Path, name: str, times: dict) -> None:
    """Add one run's timings to test-artifacts/latency.json (read by the latency benchmark)."""
    path = artifacts / "latency.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    runs = data.setdefault("runs", [])
    runs.append({"test": name, **times})
    data["unit"] = "seconds; click_to_first_loss_s: from clicking Start to the first point on the loss chart"
    data["first_run_click_to_first_loss_s"] = runs[0]["click_to_first_loss_s"]
    data["max_click_to_first_loss_s"] = max(r["click_to_first_loss_s"] for r in runs)
    path.write_text(json.dumps(data, indent=2) + "\n")
