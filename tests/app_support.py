"""Driving the app's pages with Streamlit's AppTest (tests/app/ and the attack battery).

The ``app_home`` fixture (conftest.py) gives each test a clean server; these helpers open pages, set
widgets, poll a live run and read what the page shows.
"""

from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

from support import ROOT, plotted, wait_for

APP = str(ROOT / "app.py")
# A script run is quick, but the first one in a process imports plotly, pandas and friends.
SCRIPT_TIMEOUT_S = 60
# Small enough to finish in seconds on 2 CPU cores.
SMALL_RUN = {"train_samples": 64, "eval_samples": 32, "epochs": 1, "micro_batch_size": 8, "grad_accum_steps": 2}
# Long enough to still be running when a test stops it.
LONG_RUN = {"train_samples": 2000, "eval_samples": 32, "epochs": 5, "micro_batch_size": 8, "grad_accum_steps": 1}


def open_app(page: str | None = "train") -> AppTest:
    """A new browser session on the app; ``page`` is a file name in pages/ without .py (None: the landing page)."""
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
    def rerun_and_check():
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return condition(at)

    wait_for(rerun_and_check, timeout, lambda: f"{what}; page says: {page_text(at)}", every=every)
    return at


def completed(at: AppTest) -> bool:
    """The run's status says Completed: in green, or in yellow when the run warns that it went badly (a few
    steps on a few examples teach the model little, and the status says so)."""
    return any(alert.startswith("Completed") for alert in alerts(at))


def alerts(at: AppTest) -> list[str]:
    return [e.value for kind in ("info", "success", "warning", "error") for e in getattr(at, kind)]


def page_text(at: AppTest) -> str:
    parts = alerts(at) + [e.value for e in at.markdown] + [e.value for e in at.caption]
    return " | ".join(parts)


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def charts(at: AppTest) -> list[dict]:
    """Every plotly figure on the page, as the browser gets it: st.plotly_chart's spec, or a live chart's figure
    (gradacc.app.live_chart, which AppTest knows only as an unknown element)."""
    return ([json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
            + [json.loads(live["figure"]) for live in live_charts(at).values()])


def live_charts(at: AppTest) -> dict[str, dict]:
    """{element id: data} of every live chart on the page; the id ends with the chart's key."""
    return {element.proto.id: json.loads(element.proto.json) for element in at.get("bidi_component")
            if element.proto.component_name == "gradacc.live_chart"}


def chart(at: AppTest, title: str) -> dict:
    from gradacc.app.charts import unwrap

    for figure in charts(at):
        text = figure["layout"].get("title", {})
        if unwrap((text.get("text") if isinstance(text, dict) else text) or "") == title:  # wrapped for a room
            return figure
    raise AssertionError(f"no chart titled {title!r}")


def points(figure: dict) -> int:
    return sum(len(plotted(trace.get("y"))) for trace in figure["data"])


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
