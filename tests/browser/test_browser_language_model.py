"""A language model from the Train page: pick tiny-gpt (it brings builtin-text), train, see perplexity."""

import re

from playwright.sync_api import expect

import st_ui
import train_page


def test_train_tiny_gpt_and_see_perplexity(page, artifacts):
    st_ui.open_app(page)
    # First: while the libraries warm up the page reruns every second, which can swallow a click on a select box.
    train_page.wait_for_libraries(page)
    st_ui.choose(page, "Model", "tiny-gpt")
    expect(st_ui.chosen(page, "Dataset")).to_have_value("builtin-text")  # the model brings its data
    expect(page.get_by_text("Task from the model:")).to_contain_text("causal-lm")
    # 64 texts, m=8, k=2: 4 optimizer steps and one eval, seconds on a CPU.
    train_page.configure(page, micro_batch=8, grad_accum_steps=2, epochs=1, train_samples=64, eval_samples=32)
    train_page.start(page)
    expect(st_ui.metric_value(page, "Eval perplexity")).to_have_text(re.compile(r"^\d+(\.\d\d)$"),
                                                                    timeout=train_page.RUN_TIMEOUT_MS)
    train_page.wait_until_ended(page, "Completed")
    expect(st_ui.metric_value(page, "Next-token accuracy")).to_have_text(re.compile(r"^0\.\d{3}$"))
    evaluation = st_ui.plot(page, "Evaluation after each epoch")
    expect(st_ui.traces(evaluation)).to_have_count(2)  # bars: next-token accuracy, and perplexity on its own axis
    expect(evaluation).to_contain_text("Perplexity")
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "train-language-model.png")
