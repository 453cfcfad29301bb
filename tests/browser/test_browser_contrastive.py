"""The contrastive task from the Train page: all-MiniLM-L6-v2 on builtin-pairs with GradCache, see MRR@10 plotted."""

import re

from playwright.sync_api import expect

import st_ui
import train_page


def test_train_minilm_contrastive_and_see_retrieval(page, artifacts):
    st_ui.open_app(page)
    # First: while the libraries warm up the page reruns every second, which can swallow a click on a select box.
    train_page.wait_for_libraries(page)
    st_ui.choose(page, "Model", "all-MiniLM-L6-v2")
    st_ui.choose(page, "Dataset", "builtin-pairs")
    st_ui.choose(page, "Task", "contrastive")
    st_ui.set_number(page, "GradCache mini-batch", 4)
    # 32 pairs, m=16, k=2: 1 optimizer step and one retrieval eval over 32 held-out pairs.
    train_page.configure(page, micro_batch=16, grad_accum_steps=2, epochs=1, train_samples=32, eval_samples=32)
    train_page.start(page)
    expect(st_ui.metric_value(page, "Eval MRR@10")).to_have_text(re.compile(r"^[01]\.\d{3}$"),
                                                                timeout=train_page.RUN_TIMEOUT_MS)
    train_page.wait_until_ended(page, "Completed")
    expect(st_ui.metric_value(page, "Eval recall@1")).to_have_text(re.compile(r"^[01]\.\d{3}$"))
    evaluation = st_ui.plot(page, "Evaluation after each epoch")
    expect(st_ui.traces(evaluation)).to_have_count(1)  # one run of one epoch: a bar each for MRR@10 and recall@1
    expect(evaluation.locator(".barlayer .point")).to_have_count(2)
    expect(evaluation).to_contain_text("MRR@10")
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "train-contrastive.png")
