"""Memory planner: measure every lever setting, read the ranking, carry one setting to the Train page."""

import re
from collections import Counter

from chromium import PROJECTOR
from playwright.sync_api import expect
from sklearn.metrics import f1_score

import st_ui
import train_page
from gradacc.training.sources import builtin_data

# Four model loads of tiny-bert (12 settings): seconds; the first click also waits for the training libraries.
MEASURE_TIMEOUT_MS = 90_000
# tiny-bert at its recipe on 2,000 examples for the epochs the pick proposes: well within this on a loaded machine.
RUN_TIMEOUT_MS = 360_000
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
    expect(page.get_by_role("heading", name=CHOSEN, exact=True)).to_be_visible()
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


def test_the_default_pick_learns_on_the_train_page_at_1280x720(page, artifacts):
    """The issue's path on a projector: planner defaults → pick → Use on Train → Start. The pick states the
    optimizer steps and the epochs that give enough of them; the run ends above always predicting the most frequent
    label."""
    page.set_viewport_size(PROJECTOR)
    st_ui.open_app(page)
    st_ui.go_to(page, "Memory planner")
    st_ui.click(page, "Measure")
    expect(st_ui.metric_value(page, "Activations per example")).to_have_text(re.compile(r"\d"),
                                                                             timeout=MEASURE_TIMEOUT_MS)
    pick = st_ui.alert(page, re.compile(r"^Pick: "))
    expect(pick).to_contain_text(re.compile(r"2,000 training examples at 256 a step: \d+ optimizer steps an epoch, "
                                            r"\d+ in the 2 epochs of tiny-bert's recipe, too few: .* Train \d+ epochs"))
    epochs, steps = map(int, re.search(r"Train (\d+) epochs \((\d+) steps\)", pick.inner_text()).groups())
    expect(st_ui.metric_value(page, "Epochs")).to_have_text(str(epochs))
    assert st_ui.cut_text(page) == []  # every label and the ranking's headers whole on the projector
    st_ui.screenshot(page, artifacts / "planner-pick-steps-1280x720.png")

    st_ui.click(page, "Use these settings on the Train page")
    st_ui.wait_for_app(page)
    expect(page.get_by_role("heading", name="Gradient accumulation, live")).to_be_visible()
    # The form says at its top, on screen, that the planner just filled it, and with what.
    filled = st_ui.alert(page, re.compile(r"Filled from the Memory planner: Model tiny-bert, .*Micro-batch size \(m\) "
                                          r"\d+, Accumulation steps \(k\) \d+, .*Gradient checkpointing (on|off), "
                                          rf"Precision \w+, .*Epochs {epochs}\.$"))
    expect(filled).to_be_in_viewport(ratio=1)
    page.screenshot(path=str(artifacts / "train-filled-from-planner-1280x720.png"))
    expect(st_ui.number_input(page, "Epochs")).to_have_value(str(epochs))
    expect(st_ui.metric_value(page, "Optimizer steps")).to_have_text(str(steps))
    train_page.wait_for_libraries(page)
    train_page.start(page)
    train_page.wait_until_ended(page, "Completed", timeout_ms=RUN_TIMEOUT_MS)
    f1 = float(st_ui.metric_value(page, "Eval F1").inner_text())
    accuracy = float(st_ui.metric_value(page, "Eval accuracy").inner_text())
    # The floor, from the eval set itself (the built-in data's last 400 of 2,400 texts at seed 42).
    _, labels = builtin_data.make_sentiment(2400, 42)
    held_out = labels[2000:]
    majority = Counter(held_out).most_common(1)[0][0]
    majority_accuracy = held_out.count(majority) / len(held_out)
    majority_f1 = f1_score(held_out, [majority] * len(held_out), zero_division=0)
    assert f1 > majority_f1 + 0.01 and accuracy > majority_accuracy + 0.01, (f1, accuracy, majority_accuracy)
    expect(st_ui.alert(train_page.status_panel(page), re.compile(r"^Completed: \d+ optimizer steps in [\d.]+ s\.$"))) \
        .to_be_visible()  # green: no warning that it learnt nothing
    expect(page.get_by_text(f"optimizer step {steps} of {steps}")).to_be_visible()
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "planner-pick-trained-1280x720.png")


def test_a_config_plan_and_its_refusal_come_into_view_at_1280x720(page, tmp_path):
    """An uploaded config.json planned from the expander: the one-line refusal of a sequence longer than the model's
    positions, in the field's words, and then the plan's table, each in view after its click (they are drawn below
    the fields, under the fold of a projector)."""
    from transformers import LlamaConfig

    LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=512, max_position_embeddings=256).save_pretrained(tmp_path)
    page.set_viewport_size(PROJECTOR)
    st_ui.open_app(page, "/planner")
    expander = page.get_by_test_id("stExpander").filter(has_text="Plan a model you cannot run here")
    expander.get_by_text("Plan a model you cannot run here (from its config)").click()
    expander.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(tmp_path / "config.json")
    st_ui.wait_for_app(page)
    length = expander.get_by_label("Max sequence length (tokens)", exact=True)
    for value, shown in ((4096, "Max sequence length (tokens) 4096 is longer than the model's "
                                "max_position_embeddings (256)."), (128, None)):
        length.fill(str(value))
        length.press("Tab")
        st_ui.wait_for_app(page)
        expander.get_by_role("button", name="Plan from the config", exact=True).click()
        result = page.locator(".st-key-config-plan-result")
        if shown:
            expect(result.get_by_test_id("stAlert")).to_have_text(shown, timeout=MEASURE_TIMEOUT_MS)
            expect(result.get_by_test_id("stAlert")).to_be_in_viewport(ratio=1.0)
        else:
            expect(result.get_by_test_id("stDataFrame")).to_be_visible(timeout=MEASURE_TIMEOUT_MS)
            expect(result).to_be_in_viewport()
    st_ui.expect_no_exception(page)
