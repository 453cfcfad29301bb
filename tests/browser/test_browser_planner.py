"""Memory planner: measure the model, read the recommendation, carry it to the Train page."""

import re

from playwright.sync_api import expect

import st_ui

MEASURE_TIMEOUT_MS = 90_000


def test_measure_recommend_and_use_on_the_train_page(page, artifacts):
    st_ui.open_app(page)
    st_ui.go_to(page, "Memory planner")
    st_ui.click(page, "Measure")
    expect(st_ui.metric_value(page, "Activations per example")).to_have_text(re.compile(r"\d"),
                                                                             timeout=MEASURE_TIMEOUT_MS)
    st_ui.set_number(page, "Target effective batch", 64)

    # Waits (with retries) for the advice for the new target: the page reruns after the field is committed.
    advice = st_ui.alert(page, re.compile(r"^Largest micro-batch that fits .* effective batch of 64 "))
    expect(advice).to_be_visible()
    m, k = map(int, re.search(r"Use m = (\d+) with k = (\d+)", advice.inner_text()).groups())
    assert m * k >= 64 and m * (k - 1) < 64, (m, k)  # the fewest micro-batches that reach the target
    expect(st_ui.metric_value(page, "Micro-batch size (m)")).to_have_text(str(m))
    expect(st_ui.metric_value(page, "Accumulation steps (k)")).to_have_text(str(k))
    expect(st_ui.traces(st_ui.plot(page, "Memory plan"))).not_to_have_count(0)
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "planner-result.png")

    st_ui.click(page, "Use these settings on the Train page")
    st_ui.wait_for_app(page)
    expect(page.get_by_role("heading", name="Gradient accumulation, live")).to_be_visible()
    expect(st_ui.number_input(page, "Micro-batch size (m)")).to_have_value(str(m))
    expect(st_ui.number_input(page, "Accumulation steps (k)")).to_have_value(str(k))
