"""The Equivalence page: the check runs off the page's thread and its numbers and meaning are shown."""

from app_support import chart, error_after, open_app, run_until, set_numbers

CHECK_TIMEOUT_S = 90


def test_the_check_runs_in_the_background_and_shows_naive_vs_exact(app_home):
    at = open_app("equivalence")
    set_numbers(at, "equivalence", {"micro_batch_size": 2, "grad_accum_steps": 2})
    at.button(key="run_check").click().run()
    # The page came back at once, with a spinner; the check goes on in its own thread.
    assert at.status[0].state == "running" and "running" in at.status[0].label
    run_until(at, lambda at: not at.status, CHECK_TIMEOUT_S, "the equivalence check", every=0.5)

    sentences = " ".join(m.value for m in at.markdown)
    assert "Exact normalisation: every relative error is at most" in sentences
    assert "50% off with a short last window" in sentences  # windows of 2 + 1 examples weighted ½, ½
    figure = chart(at, "Accumulated vs. full-batch gradients: relative error")
    assert [trace["name"] for trace in figure["data"]] == ["naive", "exact"]
    assert figure["layout"]["yaxis"]["type"] == "log"
    table = at.dataframe[0].value
    assert list(table["case"]) == ["equal windows", "short last window", "token-level loss",
                                   "language model (tiny-gpt)"]
    assert table["naive"][3] > 1e-2  # a causal LM's micro-batches predict uneven numbers of tokens
    assert (table["exact"] < 1e-5).all()
    assert table["naive"][1] > 0.3

    # The same settings again: answered from the finished check, no second run.
    at = open_app("equivalence")
    set_numbers(at, "equivalence", {"micro_batch_size": 2, "grad_accum_steps": 2})
    assert "Exact normalisation" in " ".join(m.value for m in at.markdown)


def test_bad_sizes_are_refused_next_to_the_field(app_home):
    at = open_app("equivalence")
    set_numbers(at, "equivalence", {"micro_batch_size": 0})
    assert "Micro-batch size (m) must be a whole number from 1" in error_after(at, "form.equivalence.micro_batch_size")
    assert at.button(key="run_check").disabled
    set_numbers(at, "equivalence", {"micro_batch_size": 32, "grad_accum_steps": 16})
    assert "Accumulation steps (k) must keep m × k at most 256" in error_after(at, "form.equivalence.grad_accum_steps")
    assert at.button(key="run_check").disabled
    assert not at.exception
