"""How a person drives a Streamlit page, in Playwright terms: find widgets by their visible label."""

from __future__ import annotations

import re

from playwright.sync_api import Locator, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

# Time for Streamlit to finish a script run after an interaction (the first one imports a lot).
RERUN_TIMEOUT_MS = 30_000


def open_app(page: Page, path: str = "/train") -> None:
    page.goto(path)
    wait_for_app(page)
    expect_no_exception(page)


def main(page: Page) -> Locator:
    """The page body, without the sidebar and header (the header has a Stop button of its own)."""
    return page.get_by_test_id("stMain")


def button(page: Page, name: str) -> Locator:
    return main(page).get_by_role("button", name=name, exact=True)


def wait_for_app(page: Page, timeout_ms: int = RERUN_TIMEOUT_MS) -> None:
    """Until the app is connected and no script run is going on."""
    app = page.locator("[data-testid=stApp]")
    expect(app).to_have_attribute("data-test-connection-state", "CONNECTED", timeout=timeout_ms)
    expect(app).to_have_attribute("data-test-script-state", re.compile("notRunning"), timeout=timeout_ms)


def number_input(page: Page, label: str) -> Locator:
    """The number input with this label that a person can see (another with the same label may sit in a closed
    expander: the planner's "from a config" mode names the same settings)."""
    return page.locator("[data-testid=stNumberInput] input[type=number]").and_(
        page.get_by_label(label, exact=True)).filter(visible=True)


def set_number(page: Page, label: str, value: int | float, shown: str | None = None) -> None:
    """Fill a number input and commit it with Tab, as a person would; wait for the rerun.

    ``shown``: how the input displays the value once committed (a format like "%.1e"), if not str(value).
    """
    field = number_input(page, label)
    field.fill(str(value))
    field.press("Tab")
    expect(field).to_have_value(shown or str(value))
    wait_for_app(page)


def chosen(page: Page, label: str) -> Locator:
    """The combobox of an st.selectbox, by its label: its value is the chosen option's text."""
    selectbox = page.locator("[data-testid=stSelectbox]").filter(has=page.get_by_text(label, exact=True))
    return selectbox.locator("input").first


def choose(page: Page, label: str, option: str) -> None:
    """Pick an option of an st.selectbox by its visible text, as a person would: a rerun that lands between opening
    the list and the click (a choice that sets another field reruns the page once more) closes the list, and the
    person opens it again. Then the box shows the option."""
    for attempt in range(3):
        chosen(page, label).click()
        try:
            page.get_by_role("option", name=option, exact=True).click(timeout=5_000)
            break
        except PlaywrightTimeoutError:
            if attempt == 2:
                raise
            wait_for_app(page)
    wait_for_app(page)
    expect(chosen(page, label)).to_have_value(option)


def click(page: Page, name: str) -> None:
    button(page, name).click()


def open_expander(page: Page, title: str) -> bool:
    """Open an st.expander by its title; False when the page has none of that name."""
    summary = page.locator("[data-testid=stExpander] summary").filter(has_text=title)
    if summary.count() == 0:
        return False
    details = summary.first.locator("xpath=..")
    if details.get_attribute("open") is None:
        summary.first.click()
    return True


def sidebar_links(page: Page) -> Locator:
    return page.locator("[data-testid=stSidebarNav] a[data-testid=stSidebarNavLink]")


def go_to(page: Page, name: str) -> None:
    """Open another page of the app from the sidebar, as a person would, and wait until it has drawn."""
    link = sidebar_links(page).filter(has_text=name)
    link.click()
    wait_for_app(page)
    expect(link).to_have_attribute("aria-current", "page")


def expect_no_exception(page: Page) -> None:
    """No Streamlit traceback box anywhere on the page; if there is one, fail with its text."""
    boxes = page.locator("[data-testid=stException]")
    if boxes.count():
        raise AssertionError(f"the page shows an exception:\n{boxes.first.inner_text()}")


def plot(page: Page, title: str) -> Locator:
    """The plotly chart whose title text is ``title``."""
    return page.locator(".js-plotly-plot").filter(has=page.locator(".gtitle", has_text=title))


def traces(chart: Locator) -> Locator:
    """Drawn data series: scatter lines/markers or bars."""
    return chart.locator(".scatterlayer .trace, .barlayer .trace")


def metric_value(page: Page, label: str) -> Locator:
    """A metric's value as the page draws it now: while a rerun draws the new one, Streamlit leaves the old copy on
    screen, marked stale (two "Effective batch" metrics at once failed a planner test in strict mode)."""
    return (page.locator('[data-testid=stMetric]:not([data-stale="true"] *)').filter(has_text=label)
            .locator("[data-testid=stMetricValue]"))


def alert(within: Page | Locator, text: str | re.Pattern) -> Locator:
    """An st.success/info/warning/error box containing ``text`` (on the page, or inside a locator)."""
    return within.locator("[data-testid=stAlert]").filter(has_text=text)


# Text the page draws cut: an element Streamlit ends with "…" (a widget's or a metric's label kept on one line)
# whose text is wider than its box, and a table (st.dataframe, drawn on a canvas) wider than its frame, whose last
# columns and their headers are then off the page until someone scrolls it.
_CUT_TEXT = """() => {
  const cut = [];
  for (const box of document.querySelectorAll('[data-testid=stMain] *')) {
    const drawn = box.getBoundingClientRect();
    if (drawn.width === 0 || drawn.height === 0) continue;
    if (getComputedStyle(box).textOverflow === 'ellipsis' && box.scrollWidth > box.clientWidth)
      cut.push(`${JSON.stringify(box.innerText)}: ${box.scrollWidth} px of text in ${box.clientWidth}`);
  }
  for (const scroller of document.querySelectorAll('[data-testid=stMain] [data-testid=stDataFrame] .dvn-scroller'))
    if (scroller.scrollWidth > scroller.clientWidth)
      cut.push(`a table ${scroller.scrollWidth} px wide in ${scroller.clientWidth}`);
  return cut;
}"""


def cut_text(page: Page) -> list[str]:
    """What the page shows cut off now (see _CUT_TEXT), one line each; [] when every label and table fits."""
    return page.evaluate(_CUT_TEXT)


def screenshot(page: Page, path, max_height: int = 3000) -> None:
    """The whole page: Streamlit scrolls inside its main area, so Playwright's full_page alone shows only
    the viewport. Grow the viewport to the content's height for the picture, then put it back."""
    viewport = page.viewport_size
    height = page.get_by_test_id("stMain").evaluate("main => main.scrollHeight")
    page.set_viewport_size({"width": viewport["width"], "height": min(max(height, viewport["height"]), max_height)})
    try:
        # Two animation frames: Streamlit and plotly lay out again at the new size first.
        page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        page.screenshot(path=str(path), animations="disabled")
    finally:
        page.set_viewport_size(viewport)


# streamlit#7074 (open): a page opened by its own link first probes <page>/_stcore/health and /host-config, gets 404,
# then finds the server's root. Streamlit's frontend, not gradacc; nothing else may fail.
UPSTREAM_PROBE = re.compile(r"/[^/]+/_stcore/(health|host-config)$")


def console_problems(page) -> list[str]:
    """Console errors, uncaught page errors and failed responses from now on (a list that fills as they come)."""
    problems = []
    page.on("console", lambda message: problems.append(f"console: {message.text}")
            if message.type == "error" and "Failed to load resource" not in message.text else None)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("response", lambda response: problems.append(f"HTTP {response.status} {response.url}")
            if response.status >= 400 and not UPSTREAM_PROBE.search(response.url) else None)
    return problems
