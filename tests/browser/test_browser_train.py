"""The Train page, end to end: settings, Start, live charts, eval F1, Stop, and a bad value."""

import re

from chromium import PROJECTOR
from playwright.sync_api import expect

import st_ui
import train_page


def test_run_draws_loss_memory_and_f1(page, artifacts):
    st_ui.open_app(page)
    expect(page.get_by_role("heading", name="Gradient accumulation, live")).to_be_visible()
    # 256 samples at a higher learning rate: seconds on a CPU, and an F1 in the README's picture that is not 0.
    train_page.configure(page, micro_batch=8, grad_accum_steps=2, epochs=1, train_samples=256, eval_samples=64)
    st_ui.set_number(page, "Learning rate", 0.003, shown="3.0e-3")
    expect(st_ui.metric_value(page, "Optimizer steps")).to_have_text("16")  # ceil(ceil(256/8)/2)

    warm_up = train_page.wait_for_libraries(page)
    times = train_page.start_and_time_first_loss(page)

    expect(st_ui.metric_value(page, "Eval F1")).to_have_text(re.compile(r"^[01]\.\d{3}$"),
                                                            timeout=train_page.RUN_TIMEOUT_MS)
    train_page.wait_until_ended(page, "Completed")
    train_page.record_latency(artifacts, "first run", {"waited_for_libraries_s": round(warm_up, 3), **times,
                                                       "run_wall_s": train_page.run_seconds(page)})
    # Every chart has drawn data: loss and memory as lines, eval as markers.
    for title in ("Training loss", "Memory", "Evaluation after each epoch"):
        chart = st_ui.plot(page, title)
        expect(chart).to_have_count(1)
        expect(st_ui.traces(chart)).not_to_have_count(0)
    expect(st_ui.plot(page, "Training loss").locator(".scatterlayer path.js-line")).not_to_have_count(0)
    expect(page.get_by_text("optimizer step 16 of 16")).to_be_visible()
    st_ui.expect_no_exception(page)

    # Also the README's picture, copied to docs/ by hand with scripts/update_screenshot.py: tests write only
    # under test-artifacts/.
    st_ui.screenshot(page, artifacts / "train-completed.png")


def test_after_start_the_run_panel_is_in_view_at_1280x720(page, artifacts):
    """On a projector the form fills the screen and Start sits at its foot: the run's panel, below it, must come into
    view without the speaker scrolling."""
    page.set_viewport_size(PROJECTOR)
    st_ui.open_app(page)
    train_page.configure(page, micro_batch=8, grad_accum_steps=2, epochs=1, train_samples=64, eval_samples=32)
    # A person scrolls down until Start shows at the foot of the screen, and clicks it: the panel is below the fold.
    st_ui.button(page, "Start").evaluate("button => button.scrollIntoView({block: 'end'})")
    expect(st_ui.main(page).locator("[data-testid=stAlert]").filter(has_text="Press Start to train")
           ).not_to_be_in_viewport()
    train_page.start(page)
    expect(train_page.status_panel(page)).to_be_in_viewport(ratio=1)  # whole: its status line and its progress
    expect(st_ui.button(page, "Start")).to_be_in_viewport()  # and Stop beside it, while the run goes
    page.screenshot(path=str(artifacts / "train-after-start-1280x720.png"))
    train_page.wait_until_ended(page, "Completed")
    assert st_ui.cut_text(page) == []  # the ended run's scores and metrics too


def test_stop_ends_a_run(page, artifacts):
    st_ui.open_app(page)
    # 2000 samples at m=8, k=2 for 10 epochs: 1250 steps, tens of seconds even on a fast machine, so the run
    # is still going when Stop is pressed.
    train_page.configure(page, micro_batch=8, grad_accum_steps=2, epochs=10, train_samples=2000, eval_samples=32)
    train_page.start(page)
    running = st_ui.alert(train_page.status_panel(page), re.compile(r"^Running on"))
    expect(running).to_be_visible(timeout=train_page.FIRST_LOSS_TIMEOUT_MS)

    # Points arrive on every poll and the loss chart is drawn again in place: the same element, a longer line.
    # (st.plotly_chart created each chart anew whenever its figure changed: a browser's core for five pages.)
    loss = st_ui.plot(page, "Training loss")
    line = loss.locator(".scatterlayer path.js-line").first
    expect(line).to_have_attribute("d", re.compile(r"L"), timeout=train_page.FIRST_LOSS_TIMEOUT_MS)  # 2+ points
    loss.evaluate("chart => { chart.dataset.testKept = 'yes'; }")
    drawn = line.get_attribute("d")
    expect(line).not_to_have_attribute("d", drawn, timeout=30_000)
    expect(loss).to_have_attribute("data-test-kept", "yes")

    st_ui.click(page, "Stop")
    train_page.wait_until_ended(page, "Stopped", timeout_ms=30_000)
    expect(st_ui.alert(page, "stopped by its owner")).to_be_visible()
    expect(st_ui.button(page, "Stop")).to_have_count(0)
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "train-stopped.png")


def test_bad_value_gives_one_line_reason(page, artifacts):
    st_ui.open_app(page)
    st_ui.set_number(page, "Micro-batch size (m)", 0)

    reason = page.locator("[data-testid=stAlert]").filter(has_text="Micro-batch size (m) must be a whole number")
    expect(reason).to_have_count(1)
    expect(reason).to_contain_text("got 0.")
    text = reason.inner_text().strip()
    assert "\n" not in text and len(text) < 200, f"not a one-line reason: {text!r}"
    expect(st_ui.button(page, "Start")).to_be_disabled()
    expect(st_ui.metric_value(page, "Effective batch")).to_have_text("—")
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "train-bad-value.png")

    # A fraction is refused as typed, not rounded to a whole number behind the visitor's back.
    st_ui.set_number(page, "Micro-batch size (m)", 2.5)
    expect(reason).to_contain_text("got 2.5.")
    expect(st_ui.button(page, "Start")).to_be_disabled()

    # Fixing the value clears the reason and enables Start again.
    st_ui.set_number(page, "Micro-batch size (m)", 4)
    expect(reason).to_have_count(0)
    expect(st_ui.button(page, "Start")).to_be_enabled()

    # An emptied field is said to be empty, in the field's own words, not "got 0".
    st_ui.set_number(page, "Micro-batch size (m)", "", shown="")
    expect(st_ui.alert(page, "Micro-batch size (m) is empty: type a whole number.")).to_have_count(1)
    expect(st_ui.alert(page, "got 0")).to_have_count(0)
    expect(st_ui.button(page, "Start")).to_be_disabled()


def plotly_requests(page) -> list[str]:
    """The plotly.js files this page fetches from now on (gradacc.app.live_chart serves a gzipped and a plain one)."""
    fetched = []
    page.on("request", lambda request: fetched.append(request.url.rsplit("/", 1)[-1])
            if "plotly.min.js" in request.url else None)
    return fetched


def test_charts_load_plotly_gzipped_as_stored(page):
    fetched = plotly_requests(page)
    st_ui.open_app(page)
    expect(st_ui.plot(page, "Training loss")).to_have_count(1)  # drawn empty before Start: plotly has loaded
    assert fetched == ["plotly.min.js.gz"]  # 1.5 MB the server sends as it lies, instead of 4.8 MB it gzips
    st_ui.expect_no_exception(page)


def test_a_browser_that_cannot_unzip_loads_the_plain_plotly(page):
    page.add_init_script("delete window.DecompressionStream")  # as in Safari before 16.4
    fetched = plotly_requests(page)
    st_ui.open_app(page)
    expect(st_ui.plot(page, "Training loss")).to_have_count(1)
    assert fetched == ["plotly.min.js"]
    st_ui.expect_no_exception(page)
