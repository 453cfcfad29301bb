"""The Train page's "Break it on purpose": off by default, refused beside the field for other loops, and a run
with a pitfall says what it broke."""

from app_support import SMALL_RUN, alerts, completed, error_after, open_app, run_until, set_numbers

RUN_TIMEOUT_S = 90  # the first run in the process also imports torch and transformers


def test_break_it_on_purpose_is_off_by_default_refused_off_the_plain_loop_and_measured(app_home):
    at = open_app()
    expander = next(e for e in at.expander if e.label == "Break it on purpose")
    assert not expander.proto.expanded
    pitfalls = at.multiselect(key="form.train.pitfalls")
    assert pitfalls.value == [] and "log-undivided-loss (transformers #35204)" in pitfalls.options

    at.radio(key="form.train.backend").set_value("trainer")
    pitfalls.set_value(["log-undivided-loss"]).run()
    assert "Pitfalls: only the plain PyTorch loop has them" in error_after(at, "form.train.pitfalls")
    assert at.button(key="start").disabled

    at.radio(key="form.train.backend").set_value("pytorch").run()
    assert error_after(at, "form.train.pitfalls") is None and not at.button(key="start").disabled
    set_numbers(at, "train", SMALL_RUN)
    at.button(key="start").click().run()
    run_until(at, completed, RUN_TIMEOUT_S, "the run to complete")
    status = " | ".join(alerts(at))
    # k = 2: each full window logs 2× its loss.
    assert "but it went badly" in status and "Pitfall log-undivided-loss (transformers #35204): the logged loss " \
                                             "was 2.00× the right one" in status
