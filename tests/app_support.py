"""Shared pieces of the AppTest suites (tests/test_app_*.py): a clean server per test, polling helpers.

AppTest runs the app's scripts in this process, so what Streamlit caches per server (the RunManager,
the equivalence queue) outlives a test unless cleared; every test gets its own GRADACC_HOME too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
# A script run is quick, but the first one in a process imports plotly, pandas and friends.
SCRIPT_TIMEOUT_S = 60
LIMIT_VARIABLES = ("GRADACC_MAX_EPOCHS", "GRADACC_MAX_TRAIN_SAMPLES", "GRADACC_MAX_RUN_SECONDS",
                   "GRADACC_MAX_UPLOAD_MB", "GRADACC_ALLOW_HUB", "GRADACC_MAX_CONCURRENT_RUNS",
                   "GRADACC_TORCH_THREADS")
# Small enough to finish in seconds on 2 CPU cores.
SMALL_RUN = {"train_samples": 64, "eval_samples": 32, "epochs": 1, "micro_batch_size": 8, "grad_accum_steps": 2}
# Long enough to still be running when a test stops it.
LONG_RUN = {"train_samples": 2000, "eval_samples": 32, "epochs": 5, "micro_batch_size": 8, "grad_accum_steps": 1}


def _release_server_resources() -> None:
    from gradacc.app import widgets as ui
    from gradacc.errors import GradaccError

    try:
        ui._create_manager().shutdown(timeout=30)  # stops runs a test left going, joins their threads
    except GradaccError:
        pass  # a test with a broken setting never had a manager
    ui.check_runner().shutdown()
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def app_home(tmp_path, monkeypatch):
    """A fresh server: its own GRADACC_HOME, no deployment limits, no hub, a new RunManager."""
    monkeypatch.setenv("GRADACC_HOME", str(tmp_path))
    monkeypatch.setenv("GRADACC_DEVICE", "cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in LIMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    st.cache_resource.clear()
    st.cache_data.clear()
    yield tmp_path
    _release_server_resources()


def open_app(page: str | None = None) -> AppTest:
    """A new browser session on the app; ``page`` is a file name in pages/ without .py."""
    at = AppTest.from_file(APP, default_timeout=SCRIPT_TIMEOUT_S).run()
    if page:
        at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def set_numbers(at: AppTest, prefix: str, values: dict) -> AppTest:
    for name, value in values.items():
        at.number_input(key=f"form.{prefix}.{name}").set_value(value)
    return at.run()


def run_until(at: AppTest, condition, timeout: float, what: str, every: float = 0.2) -> AppTest:
    """Rerun the app (a run_every fragment does not poll by itself in AppTest) until ``condition(at)``."""
    deadline = time.monotonic() + timeout
    while True:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if condition(at):
            return at
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; page says: {page_text(at)}")
        time.sleep(every)


def alerts(at: AppTest) -> list[str]:
    return [e.value for kind in ("info", "success", "warning", "error") for e in getattr(at, kind)]


def page_text(at: AppTest) -> str:
    parts = alerts(at) + [e.value for e in at.markdown] + [e.value for e in at.caption]
    return " | ".join(parts)


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def charts(at: AppTest) -> list[dict]:
    """Every plotly figure on the page, as its JSON spec."""
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def chart(at: AppTest, title: str) -> dict:
    for figure in charts(at):
        text = figure["layout"].get("title", {})
        if (text.get("text") if isinstance(text, dict) else text) == title:
            return figure
    raise AssertionError(f"no chart titled {title!r}")


def points(figure: dict) -> int:
    return sum(len(trace.get("y") or []) for trace in figure["data"])


def error_after(at: AppTest, widget_key: str) -> str | None:
    """The error drawn right below the widget with ``widget_key`` (in the same block, the next element)."""
    def walk(node):
        children = list(getattr(node, "children", {}).values())
        for index, child in enumerate(children):
            if getattr(child, "key", None) == widget_key or getattr(child, "id", "").endswith(widget_key):
                for after in children[index + 1:index + 2]:
                    found = [e.value for e in _descendants(after) if getattr(e, "type", None) == "error"]
                    return found[0] if found else None
            result = walk(child)
            if result is not None:
                return result
        return None

    return walk(at._tree)


def _descendants(node):
    yield node
    for child in getattr(node, "children", {}).values():
        yield from _descendants(child)
