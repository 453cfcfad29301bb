"""The Train page: live numbers, refusals next to the field, a run to the end, Stop, the queue, limits, uploads;
its memory fields (budget, checkpointing, precision, optimizer) and Fit with accumulation."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

from app_support import (APP, LONG_RUN, SMALL_RUN, alerts, chart, charts, completed, error_after, live_charts, metric,
                         open_app, points, run_until, set_numbers)
from streamlit.testing.v1 import AppTest

from gradacc.training.run import health
from support import ROOT

from gradacc.serving import warmup
from gradacc.serving.store import RunStore

RUN_TIMEOUT_S = 90  # the first run in the process also imports torch and transformers


def start(at):
    at.button(key="start").click()
    return at.run()


def status(at) -> str:
    return " | ".join(alerts(at))


def test_effective_batch_and_optimizer_steps_follow_the_settings(app_home):
    at = open_app()
    assert at.title[0].value == "Gradient accumulation, live"
    assert metric(at, "Effective batch") == "32"  # 8 × 4 × 1
    set_numbers(at, "train", {"micro_batch_size": 4, "grad_accum_steps": 2, "train_samples": 100, "epochs": 3})
    assert metric(at, "Effective batch") == "8"
    # ceil(ceil(100 / 4) / 2) = 13 steps per epoch (the short last window is a step), × 3 epochs.
    assert metric(at, "Optimizer steps") == "39"


def test_the_backend_choice_names_the_three_loops_each_with_its_one_line_description(app_home):
    backend = open_app().radio(key="form.train.backend")
    assert backend.options == ["PyTorch loop", "🤗 Accelerate", "🤗 Trainer"]
    assert "accelerator.accumulate(model)" in " ".join(backend.proto.captions)


def test_the_page_says_when_the_training_libraries_are_ready(app_home):
    at = open_app()  # its run manager starts the warm-up
    assert warmup.wait_until_warm(timeout=120), warmup.failure()  # a hang guard: torch imports in seconds
    at.run()
    assert "✅ Training libraries ready." in [c.value for c in at.caption]


def test_the_page_states_the_deployments_upload_limit(app_home, monkeypatch):
    assert "uploads up to 5 MB" in " ".join(c.value for c in open_app().caption)  # the default
    monkeypatch.setenv("GRADACC_MAX_UPLOAD_MB", "2")
    assert "uploads up to 2 MB" in " ".join(c.value for c in open_app().caption)


def test_charts_are_drawn_empty_before_a_run(app_home):
    # Drawn before Start so the browser has loaded plotly by the time the first loss arrives.
    at = open_app()
    for title in ("Training loss", "Evaluation after each epoch", "Memory"):
        figure = chart(at, title)
        assert points(figure) == 0
        assert figure["layout"]["annotations"], f"{title}: an empty chart says why it is empty"


def test_bad_values_are_refused_next_to_their_field_and_start_is_disabled(app_home):
    at = open_app()
    set_numbers(at, "train", {"micro_batch_size": 0, "grad_accum_steps": -1, "learning_rate": 0.0})
    assert not at.exception
    assert "Micro-batch size (m) must be a whole number from 1" in error_after(at, "form.train.micro_batch_size")
    assert "Accumulation steps (k) must be a whole number from 1" in error_after(at, "form.train.grad_accum_steps")
    assert "Learning rate must be greater than 0" in error_after(at, "form.train.learning_rate")
    assert at.button(key="start").disabled
    assert metric(at, "Effective batch") == "—"

    set_numbers(at, "train", {"micro_batch_size": 8, "grad_accum_steps": 4, "learning_rate": 1e-3,
                              "train_samples": 4})
    assert "Micro-batch size (m) must be at most the 4 training examples; got 8." == error_after(at, "form.train.micro_batch_size")
    set_numbers(at, "train", {"train_samples": 64})
    assert not at.error and not at.button(key="start").disabled


def test_an_emptied_number_field_says_it_is_empty_by_its_label_and_start_is_disabled(app_home):
    # The browser sends None for a field the visitor clears; before, the field put 0 there and the check answered
    # "got 0", and Epochs or Dropout emptied quietly took the recipe's value.
    at = open_app()
    set_numbers(at, "train", {"micro_batch_size": None, "epochs": None, "dropout": None})
    assert not at.exception
    assert error_after(at, "form.train.micro_batch_size") == "Micro-batch size (m) is empty: type a whole number."
    assert error_after(at, "form.train.epochs") == "Epochs is empty: type a whole number."
    assert error_after(at, "form.train.dropout") == "Dropout is empty: type a number."
    assert not any("got" in error.value for error in at.error), [error.value for error in at.error]
    assert at.button(key="start").disabled and metric(at, "Effective batch") == "—"

    set_numbers(at, "train", {"micro_batch_size": 8, "epochs": 1, "dropout": 0.0})
    assert not at.error and not at.button(key="start").disabled


def test_a_run_goes_from_start_to_completed_with_curves_and_f1(app_home):
    at = open_app()
    set_numbers(at, "train", SMALL_RUN)
    start(at)
    assert at.button(key="start").disabled  # one live run per visitor
    run_id = at.session_state["run_id"]
    assert at.query_params["run"] in (run_id, [run_id])  # the URL names the run: a reload comes back to it
    # A query parameter set just before st.rerun() can miss the address bar (streamlit#7961): the next script run
    # puts it back.
    del at.query_params["run"]
    at.run()
    assert at.query_params["run"] in (run_id, [run_id])
    # Completed, in green or (64 examples teach the model little) in yellow with its warnings.
    run_until(at, completed, RUN_TIMEOUT_S, "the run to complete")
    assert "Completed: 4 optimizer steps" in status(at)  # ceil(ceil(64/8)/2) = 4
    assert metric(at, "Eval F1") != "—" and metric(at, "Eval accuracy") != "—"
    assert points(chart(at, "Training loss")) == 4
    assert points(chart(at, "Memory")) >= 4
    assert points(chart(at, "Evaluation after each epoch")) == 2  # F1 and accuracy after epoch 1
    assert at.progress[0].value == 100
    assert not at.button(key="start").disabled  # polling is off and a new run may start


def test_a_second_session_queues_behind_the_first_and_only_the_owner_can_stop(app_home):
    first, second = open_app(), open_app()
    set_numbers(first, "train", LONG_RUN)
    start(first)
    set_numbers(second, "train", SMALL_RUN)
    start(second)
    assert re.search(r"Queued: position 1 in the queue; (about|at most) \d+ (s|min \d\d s) to wait", status(second)), \
        status(second)
    assert not second.get("progress"), "a queued run has no progress bar: its status says where it stands"
    assert "Queued" not in status(first)
    # A third visitor with the first run's link sees it, but gets no Stop button: it is not theirs.
    onlooker = AppTest.from_file(APP, default_timeout=60)
    onlooker.query_params["run"] = first.session_state["run_id"]
    onlooker.run()
    assert "Running" in status(onlooker) or "loading" in status(onlooker)
    assert not [b for b in onlooker.button if b.key == "stop"]
    second.button(key="stop").click().run()
    run_until(second, lambda at: bool(at.warning), 10, "the queued run to be dropped")
    assert "stopped before it started" in second.warning[0].value
    first.button(key="stop").click().run()
    run_until(first, lambda at: bool(at.warning), 30, "the first run to stop")


def test_deployment_limits_are_shown_and_enforced(app_home, monkeypatch):
    monkeypatch.setenv("GRADACC_MAX_EPOCHS", "1")
    monkeypatch.setenv("GRADACC_MAX_TRAIN_SAMPLES", "100")
    monkeypatch.setenv("GRADACC_ALLOW_HUB", "0")
    at = open_app()
    captions = " ".join(c.value for c in at.caption)
    assert "at most 1 epoch(s)" in captions and "at most 100 training samples" in captions
    assert "hub ids disabled" in captions
    # The form starts inside the limits...
    assert at.number_input(key="form.train.epochs").value == 1
    assert at.number_input(key="form.train.train_samples").value == 100
    assert not at.error
    # ...and refuses to leave them.
    set_numbers(at, "train", {"epochs": 2, "train_samples": 5000})
    assert "Epochs must be at most 1 on this deployment" in error_after(at, "form.train.epochs")
    assert "Training samples must be at most 100 on this deployment" in error_after(at, "form.train.train_samples")
    at.selectbox(key="form.train.model_choice").set_value("other: hub id or local folder").run()
    at.text_input(key="form.train.model_custom").set_value("prajjwal1/bert-tiny").run()
    assert "hub ids are disabled" in " ".join(e.value for e in at.error)
    assert at.button(key="start").disabled


def test_an_uploaded_csv_gets_column_pickers_and_a_size_cap(app_home, monkeypatch):
    rows = "\n".join(f"review number {i} was {'great' if i % 2 else 'awful'},{'pos' if i % 2 else 'neg'}"
                     for i in range(50))
    content = f"review,stars\n{rows}\n".encode()
    at = open_app()
    at.selectbox(key="form.train.dataset_choice").set_value("upload a CSV / JSONL file").run()
    assert "Upload a CSV or JSONL file" in " ".join(e.value for e in at.error)
    assert at.button(key="start").disabled
    at.file_uploader[0].set_value(("reviews.csv", content, "text/csv")).run()
    assert not at.exception
    text_picker, label_picker = at.selectbox[2], at.selectbox[3]
    assert (text_picker.label, text_picker.value) == ("Text column", "review")
    assert (label_picker.label, label_picker.value) == ("Label column", "stars")
    assert metric(at, "Training examples") == "40"  # 20% held out for evaluation
    assert not at.error and not at.button(key="start").disabled
    saved = list((app_home / "uploads").iterdir())
    assert len(saved) == 1 and saved[0].name.startswith("reviews-") and saved[0].read_bytes() == content
    # It trains, and the run's notes (from run_started) are shown.
    set_numbers(at, "train", {**SMALL_RUN, "grad_accum_steps": 1})
    start(at)
    run_until(at, completed, RUN_TIMEOUT_S, "the run on the uploaded file to complete")
    assert "10 of 50 rows held out for evaluation" in " ".join(c.value for c in at.caption)

    monkeypatch.setenv("GRADACC_MAX_UPLOAD_MB", "0.0001")  # 100 bytes
    at = open_app()
    at.selectbox(key="form.train.dataset_choice").set_value("upload a CSV / JSONL file").run()
    at.file_uploader[0].set_value(("reviews.csv", content, "text/csv")).run()
    assert "accepts uploads up to 0.0001 MB" in error_after(at, "train.upload")
    assert at.button(key="start").disabled


def test_pages_paint_without_importing_torch_or_transformers():
    """Cold imports take 5–15 s: app.py and every page must paint first (warm-up is off here)."""
    script = textwrap.dedent(f"""
        import os, sys, tempfile
        os.environ["GRADACC_HOME"] = tempfile.mkdtemp()
        import gradacc.serving.warmup
        gradacc.serving.warmup.start = lambda: None  # the background import would load torch on purpose
        from streamlit.testing.v1 import AppTest
        at = AppTest.from_file({str(ROOT / 'app.py')!r}, default_timeout=60).run()
        for page in ("home", "compare", "equivalence", "planner", "code", "train"):
            at.switch_page(f"pages/{{page}}.py").run()
            assert not at.exception, (page, [e.value for e in at.exception])
        heavy = [name for name in ("torch", "transformers", "accelerate") if name in sys.modules]
        assert not heavy, heavy
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_a_run_that_fails_says_why_in_one_line(app_home):
    at = open_app()  # HF_HUB_OFFLINE=1: a hub id passes the form but cannot load
    at.selectbox(key="form.train.model_choice").set_value("other: hub id or local folder").run()
    at.text_input(key="form.train.model_custom").set_value("someone/some-model").run()
    set_numbers(at, "train", SMALL_RUN)
    start(at)
    run_until(at, lambda at: bool(at.error), RUN_TIMEOUT_S, "the run to fail")
    assert at.error[0].value.startswith("Failed: Model 'someone/some-model' is a hub id, and the Hugging Face Hub cannot be reached")
    assert "\n" not in at.error[0].value
    # Nothing under the red box says otherwise: no progress bar waiting for a first step, no empty "yet" charts.
    assert not at.get("progress") and not charts(at)
    shown = " ".join(e.value for kind in ("markdown", "caption", "info", "warning", "success") for e in at.get(kind)
                     if isinstance(getattr(e, "value", None), str))
    assert "waiting" not in shown and "yet" not in shown and "Press Start" not in shown, shown


def test_the_deployment_time_limit_stops_a_run(app_home, monkeypatch):
    monkeypatch.setenv("GRADACC_MAX_RUN_SECONDS", "1")
    at = open_app()
    assert "runs stop after 1 s" in " ".join(c.value for c in at.caption)
    set_numbers(at, "train", LONG_RUN)
    start(at)
    run_until(at, lambda at: bool(at.warning), RUN_TIMEOUT_S, "the time limit")
    assert "reached the deployment's limit of 1 s" in at.warning[0].value


@pytest.mark.parametrize("name", ["GRADACC_MAX_EPOCHS", "GRADACC_TORCH_THREADS"])
def test_a_misconfigured_server_says_so_instead_of_a_traceback(app_home, monkeypatch, name):
    monkeypatch.setenv(name, "lots")
    at = open_app()
    assert f"This server is misconfigured: {name} must be a whole number" in at.error[0].value


def test_choosing_another_model_moves_untouched_fields_to_its_recipe(app_home):
    from gradacc.recipes import RECIPES

    at = open_app()
    assert at.number_input(key="form.train.learning_rate").value == RECIPES["tiny-bert"].learning_rate
    at.number_input(key="form.train.dropout").set_value(0.0).run()  # the visitor's own choice
    at.selectbox(key="form.train.model_choice").set_value("all-MiniLM-L6-v2").run()
    minilm = RECIPES["all-MiniLM-L6-v2"]
    assert at.number_input(key="form.train.learning_rate").value == minilm.learning_rate
    assert at.number_input(key="form.train.epochs").value == minilm.epochs
    assert at.number_input(key="form.train.dropout").value == 0.0  # touched: kept
    note = next(e.value for e in at.info if "recipe" in e.value)
    assert note.startswith("Set to all-MiniLM-L6-v2's recipe: Learning rate 0.0002")
    assert "Fields you changed keep your values." in note


def test_the_built_in_data_follows_the_model_and_a_far_too_high_learning_rate_is_said_before_start(app_home):
    at = open_app()
    assert at.selectbox(key="form.train.dataset_choice").value == "builtin-sentiment"
    at.selectbox(key="form.train.model_choice").set_value("tiny-gpt").run()
    assert at.selectbox(key="form.train.dataset_choice").value == "builtin-text"
    assert any("Dataset set to builtin-text, the built-in data for tiny-gpt." in i.value for i in at.info)
    assert not at.error and not at.button(key="start").disabled
    at.selectbox(key="form.train.model_choice").set_value("tiny-bert").run()
    assert at.selectbox(key="form.train.dataset_choice").value == "builtin-sentiment"
    assert not at.warning
    at.number_input(key="form.train.learning_rate").set_value(5.0).run()
    assert [w.value for w in at.warning] == [health.learning_rate_warning(
        at.session_state["train_config"].check())]
    assert at.warning[0].value.startswith("The learning rate 5 is high for tiny-bert; its recipe uses 0.005")
    assert not at.button(key="start").disabled  # a warning, not a refusal: the visitor may want to see it fail
    at.number_input(key="form.train.learning_rate").set_value(5e-3).run()
    assert not at.warning


def test_switching_the_optimizer_moves_a_recipe_learning_rate_to_the_new_optimizers_own(app_home):
    from gradacc.recipes import recipe_for

    recipe = recipe_for("tiny-bert")
    own = recipe.learning_rate_for("adafactor")
    at = open_app()
    assert at.number_input(key="form.train.learning_rate").value == recipe.learning_rate
    at.selectbox(key="form.train.optimizer").set_value("adafactor").run()
    assert at.number_input(key="form.train.learning_rate").value == own
    assert any(i.value.startswith(f"Set to tiny-bert's recipe for adafactor: Learning rate {own:g}") for i in at.info)
    assert not at.warning and not at.button(key="start").disabled
    at.selectbox(key="form.train.optimizer").set_value("adamw").run()
    assert at.number_input(key="form.train.learning_rate").value == recipe.learning_rate
    # A rate the visitor typed is theirs: it stays, and AdamW's rate typed for Adafactor is warned about.
    at.selectbox(key="form.train.optimizer").set_value("adamw-fused").run()
    at.number_input(key="form.train.learning_rate").set_value(recipe.learning_rate * 2).run()
    at.selectbox(key="form.train.optimizer").set_value("adafactor").run()
    assert at.number_input(key="form.train.learning_rate").value == recipe.learning_rate * 2
    at.number_input(key="form.train.learning_rate").set_value(recipe.learning_rate).run()
    assert [w.value for w in at.warning] == [health.learning_rate_warning(
        at.session_state["train_config"].check())]
    assert "tiny-bert's recipe for AdamW, not adafactor's" in at.warning[0].value


def test_two_sessions_watching_one_run_build_its_figures_once_per_event_batch(app_home):
    from gradacc.app import server

    first = open_app()
    set_numbers(first, "train", SMALL_RUN)
    start(first)
    # Completed, well or "but it went badly" (a warning): either way its events are final.
    run_until(first, lambda at: "Completed" in status(at), RUN_TIMEOUT_S, "the run to complete")
    run_id = first.session_state["run_id"]
    cache = server.figure_cache()
    builds = cache.builds
    # A second visitor opens the run's link, and both pages redraw: the figures of this event count exist.
    second = AppTest.from_file(APP, default_timeout=60)
    second.query_params["run"] = run_id
    second.run()
    first.run()
    assert not second.exception and points(chart(second, "Training loss")) == points(chart(first, "Training loss")) > 0
    assert cache.builds == builds, "a session that draws figures another session built must not build them again"
    # Another view is another key: built once, by whichever session asks first.
    second.radio(key="loss_x").set_value("samples_seen").run()
    first.radio(key="loss_x").set_value("samples_seen").run()
    assert cache.builds == builds + 1


def test_the_task_follows_the_model_and_an_lm_run_shows_perplexity(app_home):
    at = open_app()
    assert at.selectbox(key="form.train.task").value == "from the model"
    assert "Task from the model: **classification**" in " ".join(c.value for c in at.caption)
    at.selectbox(key="form.train.dataset_choice").set_value("builtin-text").run()  # tiny-bert cannot learn it
    assert "causal-lm task" in error_after(at, "form.train.dataset_choice")
    assert at.button(key="start").disabled
    at.selectbox(key="form.train.model_choice").set_value("tiny-gpt").run()
    assert "Task from the model: **causal-lm**" in " ".join(c.value for c in at.caption)
    at.selectbox(key="form.train.task").set_value("classification").run()
    assert "does not fit tiny-gpt" in error_after(at, "form.train.task")
    at.selectbox(key="form.train.task").set_value("from the model").run()
    set_numbers(at, "train", {**SMALL_RUN, "max_seq_length": 32})
    assert not at.button(key="start").disabled
    start(at)
    # Twice the usual room: this session's first tiny-gpt run also trains its tokenizer.
    run_until(at, lambda at: at.success and at.success[0].value.startswith("Completed"), 2 * RUN_TIMEOUT_S,
              "the language-model run to complete")
    assert metric(at, "Eval perplexity") != "—" and metric(at, "Next-token accuracy") != "—"
    evaluation = chart(at, "Evaluation after each epoch")
    # One epoch: bars, next-token accuracy on the 0–1 axis and perplexity on the log axis at the right.
    assert [(t["type"], t["x"], t["yaxis"]) for t in evaluation["data"]] == [
        ("bar", ["next-token accuracy"], "y"), ("bar", ["perplexity"], "y2")]
    assert evaluation["layout"]["yaxis2"]["type"] == "log"
    assert points(chart(at, "Training loss")) == 4


def test_a_page_polling_every_second_slows_down_once_a_room_fills_up_around_it_but_the_owners_does_not(app_home):
    from gradacc.app import server

    at = open_app()
    set_numbers(at, "train", LONG_RUN)
    start(at)
    run_until(at, lambda at: "Running" in status(at), RUN_TIMEOUT_S, "the run to start")
    onlooker = AppTest.from_file(APP, default_timeout=60)  # a visitor who opened the run's link
    onlooker.query_params["run"] = at.session_state["run_id"]
    onlooker.run()
    assert not [c for c in onlooker.caption if "refreshes every" in c.value]  # two pages: the full pace, said nowhere
    run = server._create_manager().get(at.session_state["run_id"])
    for visitor in range(18):  # eighteen more pages poll it: a room of twenty
        run.snapshot(viewer=f"visitor-{visitor}")
    onlooker.run()  # its poll sees the room: the whole page reruns and polls at the room's pace
    assert "👥 Many pages are watching: this one refreshes every 8 s." in [c.value for c in onlooker.caption]
    at.run()  # the owner's page (the one on the projector) keeps its pace
    assert not at.exception and not [c for c in at.caption if "refreshes every" in c.value]
    at.button(key="stop").click().run()
    run_until(at, lambda at: bool(at.warning), 30, "the run to stop")


def test_the_live_charts_keep_their_identity_while_their_points_grow(app_home):
    """A chart whose element id stays the same stays mounted in the browser (gradacc.app.live_chart): each poll
    hands it a new figure to draw in place. With st.plotly_chart the id followed the figure, and every poll that
    brought points created all three charts anew in every watching browser."""
    at = open_app()
    set_numbers(at, "train", LONG_RUN)
    start(at)
    run_until(at, lambda at: points(chart(at, "Training loss")) >= 2, RUN_TIMEOUT_S, "two loss points")
    before = live_charts(at)
    loss_id = next(element_id for element_id in before if element_id.endswith("-loss_chart"))
    drawn = points(json.loads(before[loss_id]["figure"]))
    run_until(at, lambda at: points(chart(at, "Training loss")) > drawn, RUN_TIMEOUT_S, "more loss points")
    after = live_charts(at)
    assert sorted(after) == sorted(before) and len(after) == 3  # loss, eval and memory: the same three charts
    assert after[loss_id]["revision"] != before[loss_id]["revision"]  # ... drawing a new figure
    assert points(json.loads(after[loss_id]["figure"])) > drawn
    at.button(key="stop").click().run()
    run_until(at, lambda at: bool(at.warning), 30, "the run to stop")


# ---- the memory fields and Fit with accumulation ----------------------------------------------------

MEMORY_RUN_TIMEOUT_S = 120


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
    run_until(at, lambda at: any(a.startswith("Completed") for a in alerts(at)), MEMORY_RUN_TIMEOUT_S, "the run to complete")
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
    run_until(at, lambda at: any(a.startswith("Failed: out of memory") for a in alerts(at)), MEMORY_RUN_TIMEOUT_S,
              "the run to fail for memory")
    failed = stored_run(at)
    assert "on the CPU the budget is enforced from measured bytes" in failed["reason"]
    fit = at.button(key="fit_with_accumulation")
    assert "m=16, k=4" in fit.help
    fit.click().run()
    run_until(at, lambda at: any(a.startswith("Completed") for a in alerts(at)), MEMORY_RUN_TIMEOUT_S,
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


def test_shard_the_model_sits_beside_processes_and_what_it_cannot_do_is_said_next_to_the_field(app_home):
    at = open_app()
    assert at.radio(key="form.train.grad_sync").disabled  # a DDP run syncs once per window
    at.toggle(key="form.train.fsdp").set_value(True).run()
    assert error_after(at, "form.train.fsdp").startswith("Shard the model (FSDP) needs 2 or more processes")
    assert at.button(key="start").disabled
    at.selectbox(key="form.train.num_processes").set_value(2).run()
    assert error_after(at, "form.train.fsdp") is None
    at.radio(key="form.train.grad_sync").set_value("per-micro-batch").run()
    assert not at.error and not at.button(key="start").disabled
    config = at.session_state["train_config"]  # what Start submits
    assert (config.fsdp, config.grad_sync, config.num_processes) == (True, "per-micro-batch", 2)
    at.selectbox(key="form.train.optimizer").set_value("adafactor").run()
    assert "does not work on a sharded run (FSDP)" in error_after(at, "form.train.optimizer")
    at.selectbox(key="form.train.optimizer").set_value("adamw")
    at.toggle(key="form.train.fsdp").set_value(False).run()
    assert at.session_state["train_config"].grad_sync == "per-window" and not at.error
