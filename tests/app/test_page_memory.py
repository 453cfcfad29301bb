"""The Train page's memory fields (budget, checkpointing, precision, optimizer) and Fit with accumulation."""

from app_support import alerts, error_after, metric, open_app, run_until, set_numbers

from gradacc.serving.store import RunStore

RUN_TIMEOUT_S = 120


def stored_run(at):
    return RunStore().get_run(at.session_state["run_id"])


def test_the_memory_fields_reach_the_run_and_a_bad_budget_is_refused_next_to_its_field(app_home):
    at = open_app()
    set_numbers(at, "train", {"memory_budget_mb": -5.0})
    assert error_after(at, "form.train.memory_budget_mb").startswith("Memory budget (MB) must be a number greater than 0")
    assert at.button(key="start").disabled
    assert "enforced from these measured bytes" in at.number_input(key="form.train.memory_budget_mb").help
    assert "adamw-8bit" not in at.selectbox(key="form.train.optimizer").options  # no bitsandbytes here
    set_numbers(at, "train", {"memory_budget_mb": 500.0, "train_samples": 32, "eval_samples": 16, "epochs": 1})
    at.toggle(key="form.train.gradient_checkpointing").set_value(True)
    at.radio(key="form.train.precision").set_value("bf16")
    at.selectbox(key="form.train.optimizer").set_value("adafactor")
    at.run()
    at.button(key="start").click().run()
    run_until(at, lambda at: any(a.startswith("Completed") for a in alerts(at)), RUN_TIMEOUT_S, "the run to complete")
    config = stored_run(at)["config"]
    assert (config["memory_budget_mb"], config["gradient_checkpointing"], config["precision"], config["optimizer"]) \
        == (500.0, True, "bf16", "adafactor")


def test_fit_with_accumulation_restarts_a_run_that_ran_out_of_memory_with_the_same_effective_batch(app_home):
    at = open_app()
    # tiny-bert: ~3.1 MB static and ~0.16 MB of activations per example of the built-in data, so 8 MB
    # breaks m=64 (~13 MB) and fits m=16 (the reason states the measured figures; the test reads them back).
    set_numbers(at, "train", {"micro_batch_size": 64, "grad_accum_steps": 1, "train_samples": 256,
                              "eval_samples": 16, "epochs": 1, "memory_budget_mb": 8.0})
    at.button(key="start").click().run()
    run_until(at, lambda at: any(a.startswith("Failed: out of memory") for a in alerts(at)), RUN_TIMEOUT_S,
              "the run to fail for memory")
    failed = stored_run(at)
    assert "on the CPU the budget is enforced from measured bytes" in failed["reason"]
    fit = at.button(key="fit_with_accumulation")
    assert "m=16, k=4" in fit.help
    fit.click().run()
    run_until(at, lambda at: any(a.startswith("Completed") for a in alerts(at)), RUN_TIMEOUT_S,
              "the fitted run to complete")
    fitted = stored_run(at)
    assert fitted["run_id"] != failed["run_id"]
    assert (fitted["config"]["micro_batch_size"], fitted["config"]["grad_accum_steps"]) == (16, 4)
    assert fitted["config"]["memory_budget_mb"] == 8.0  # the same budget, now met
    # The form shows what runs now, and the effective batch is the one that did not fit.
    assert at.number_input(key="form.train.micro_batch_size").value == 16
    assert at.number_input(key="form.train.grad_accum_steps").value == 4
    assert metric(at, "Effective batch") == "64"
    assert "fit_with_accumulation" not in [button.key for button in at.button]  # a completed run needs no fit
