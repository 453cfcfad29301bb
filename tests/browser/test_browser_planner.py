"""Memory planner: measure every lever setting, read the ranking, carry one setting to the Train page."""

import re

from playwright.sync_api import expect

import st_ui

# Four model loads of tiny-bert (12 settings): seconds; the first click also waits for the training libraries.
MEASURE_TIMEOUT_MS = 90_000
CHOSEN = "checkpointing on · bf16 · adafactor"  # tiny-bert's recipe has a rate for it (none for SGD)


def test_measure_rank_the_levers_and_use_one_on_the_train_page(page, artifacts):
    st_ui.open_app(page)
    st_ui.go_to(page, "Memory planner")
    st_ui.click(page, "Measure")
    expect(st_ui.metric_value(page, "Activations per example")).to_have_text(re.compile(r"\d"),
                                                                             timeout=MEASURE_TIMEOUT_MS)
    # Each value's rerun shown before the next is typed (a field typed into during a rerun can lose its value).
    st_ui.set_number(page, "Target effective batch", 64)
    expect(st_ui.metric_value(page, "Effective batch")).to_have_text("64")
    st_ui.set_number(page, "Memory budget (MB)", 20)
    expect(page.get_by_text("Every setting, for a budget of 20 MB and an effective batch of 64")).to_be_visible()

    # The pick keeps the Train form's optimizer (AdamW) until the visitor lets it change.
    expect(st_ui.alert(page, re.compile(r"^Pick: .* · adamw: m = \d+, k = \d+,"))).to_be_visible()
    page.get_by_text("Let the planner change the optimizer").click()
    st_ui.wait_for_app(page)
    fastest = st_ui.alert(page, re.compile(r"^Pick: .*: m = \d+, k = \d+,"))
    expect(fastest).to_be_visible()
    m, k = map(int, re.search(r"m = (\d+), k = (\d+)", fastest.inner_text()).groups())
    assert m * k == 64 and m & (m - 1) == 0, (m, k)  # a power of two, the target exactly
    expect(st_ui.alert(page, re.compile(r"^Least memory that fits: "))).to_be_visible()
    expect(st_ui.traces(st_ui.plot(page, "Memory plan"))).to_have_count(3)  # predicted, measured, held out
    expect(page.get_by_text("Checked on a micro-batch it was not fitted on")).to_be_visible()

    st_ui.choose(page, "Setting to use", CHOSEN)
    expect(page.get_by_role("heading", name=CHOSEN)).to_be_visible()
    m = int(st_ui.metric_value(page, "Micro-batch size (m)").inner_text())
    k = int(st_ui.metric_value(page, "Accumulation steps (k)").inner_text())
    assert m * k == 64, (m, k)
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "planner-result.png")

    st_ui.click(page, "Use these settings on the Train page")
    st_ui.wait_for_app(page)
    expect(page.get_by_role("heading", name="Gradient accumulation, live")).to_be_visible()
    expect(st_ui.number_input(page, "Micro-batch size (m)")).to_have_value(str(m))
    expect(st_ui.number_input(page, "Accumulation steps (k)")).to_have_value(str(k))
    st_ui.open_expander(page, "Memory: a budget, and the levers")
    expect(page.get_by_label("Gradient checkpointing", exact=True)).to_be_checked()
    expect(page.get_by_label("bf16", exact=True)).to_be_checked()
    expect(page.get_by_role("combobox", name="Optimizer")).to_have_value("adafactor")
