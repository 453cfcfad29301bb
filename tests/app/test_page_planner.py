"""The Memory planner page: measure every lever setting once, rank those that fit, hand one to the Train page."""

import math

import pytest
from app_support import chart, error_after, metric, open_app, set_numbers

from gradacc import recipes
from gradacc.analysis import planner
from gradacc.app import inputs

# Short sequences keep the 12 measurements (4 model loads) to a few seconds.
LENGTH = 32


def measured_page(values: dict, model: str | None = None, change_optimizer: bool = True):
    at = open_app("planner")
    assert "Press **Measure**" in at.info[0].value
    if model:
        at.selectbox(key="form.planner.model_choice").set_value(model).run()
    set_numbers(at, "planner", {"max_seq_length": LENGTH})
    at.button(key="measure").click().run()
    assert not at.exception, [e.value for e in at.exception]
    at.checkbox(key="form.planner.change_optimizer").set_value(change_optimizer).run()
    return set_numbers(at, "planner", values)


def test_ranks_every_lever_setting_that_fits_and_checks_the_line_on_a_held_out_micro_batch(app_home):
    at = measured_page({"budget_mb": 3.0, "target_effective_batch": 64})
    table = at.dataframe[0].value
    assert len(table) == len(planner.LEVER_GRID) == 12
    assert {(c, p, o) for c, p, o in zip(table["checkpointing"], table["precision"], table["optimizer"])} == {
        ("on" if levers["gradient_checkpointing"] else "off", levers["precision"], levers["optimizer"])
        for levers in planner.LEVER_GRID}
    fits = table["predicted peak"] != "does not fit"
    # 3 MB: tiny-bert's AdamW state (static 3.1 MB) never fits; SGD and Adafactor do.
    assert set(table[~fits]["optimizer"]) == {"adamw"} and set(table[fits]["optimizer"]) == {"sgd", "adafactor"}
    for m, k in zip(table[fits]["m"], table[fits]["k"]):
        assert m * k == 64 and int(m) & (int(m) - 1) == 0  # a power of two, the target exactly
    fastest = at.success[0].value
    assert fastest.startswith("Pick: **") and "adamw" not in fastest.split("**")[1]
    assert at.info[0].value.startswith("Least memory that fits: **")
    # The chosen setting (the pick by default) is the one the metrics, chart and check describe.
    assert at.selectbox(key="form.planner.setting").value in fastest
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    assert f"m = {m}, k = {k}" in fastest and int(metric(at, "Effective batch")) == 64
    figure = chart(at, "Memory plan: peak memory by micro-batch size")
    assert [trace["name"] for trace in figure["data"]] == ["predicted", "measured", "measured, not fitted on"]
    assert figure["data"][2]["x"] == [planner.HELD_OUT_SIZE]
    check = at.dataframe[1].value
    assert list(check["micro-batch size"]) == [1, 2, 4, 8]
    assert list(check["used for"]) == ["the fit"] * 3 + ["the check"]
    assert any("Checked on a micro-batch it was not fitted on" in e.value and "an error of **" in e.value
               for e in at.markdown)

    # A lighter setting chosen: its own breakdown.
    at.selectbox(key="form.planner.setting").set_value("checkpointing on · bf16 · adafactor").run()
    assert at.subheader[-1].value == "checkpointing on · bf16 · adafactor"
    assert metric(at, "Optimizer state").endswith("kB")  # factored rows and columns, not two moments

    # More memory: the target in one micro-batch.
    set_numbers(at, "planner", {"budget_mb": 1000.0})
    assert metric(at, "Micro-batch size (m)") == "64" and metric(at, "Accumulation steps (k)") == "1"
    assert not at.exception


def test_a_bad_budget_or_target_is_refused_next_to_its_field(app_home):
    at = measured_page({"budget_mb": 1.0})
    assert "Memory budget (MB) 1 is too small for every setting" in error_after(at, "form.planner.budget_mb")
    assert not at.success and not any(m.label == "Micro-batch size (m)" for m in at.metric)
    set_numbers(at, "planner", {"budget_mb": 0.0})
    assert error_after(at, "form.planner.budget_mb").startswith("Memory budget (MB) must be more than 0")
    set_numbers(at, "planner", {"budget_mb": 100.0, "target_effective_batch": 0})
    assert error_after(at, "form.planner.target_effective_batch").startswith("Target effective batch must be a whole")
    assert not at.exception


def test_an_emptied_field_says_it_is_empty_and_nothing_is_measured_or_planned(app_home):
    at = measured_page({"budget_mb": None})
    assert error_after(at, "form.planner.budget_mb") == "Memory budget (MB) is empty: type a number."
    assert not at.exception and not at.success and not at.dataframe  # no pick, no ranking
    set_numbers(at, "planner", {"budget_mb": 3.0, "max_seq_length": None})
    assert error_after(at, "form.planner.max_seq_length") == "Max sequence length (tokens) is empty: type a whole number."
    assert at.button(key="measure").disabled


def test_use_these_settings_carries_m_k_the_levers_and_the_optimizers_own_learning_rate_to_the_train_page(app_home):
    # 3 MB: AdamW does not fit; tiny-bert's recipe has a measured rate for Adafactor, so the planner offers it.
    at = measured_page({"budget_mb": 3.0, "target_effective_batch": 64})
    own = recipes.recipe_for("tiny-bert").learning_rate_for("adafactor")
    offered = at.selectbox(key="form.planner.setting").options
    assert "checkpointing on · bf16 · adafactor" in offered
    assert all("sgd" not in label for label in offered) == (recipes.recipe_for("tiny-bert")
                                                           .learning_rate_for("sgd") is None)
    assert "trains at its own learning rate" in at.success[0].value and "of its own:" not in at.success[0].value
    at.selectbox(key="form.planner.setting").set_value("checkpointing on · bf16 · adafactor").run()
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    at.button(key="use_plan").click().run()
    assert at.title[0].value == "Gradient accumulation, live"
    config = at.session_state["train_config"]
    assert (config.micro_batch_size, config.grad_accum_steps, config.max_seq_length) == (m, k, LENGTH)
    assert (config.gradient_checkpointing, config.precision, config.optimizer) == (True, "bf16", "adafactor")
    assert config.learning_rate == own != recipes.recipe_for("tiny-bert").learning_rate
    assert at.number_input(key="form.train.micro_batch_size").value == m
    assert at.number_input(key="form.train.grad_accum_steps").value == k
    assert at.number_input(key="form.train.learning_rate").value == own
    # Adafactor arrives with its own rate: nothing to warn about before Start.
    assert not at.warning, [w.value for w in at.warning]
    assert at.toggle(key="form.train.gradient_checkpointing").value is True
    assert at.radio(key="form.train.precision").value == "bf16"
    assert at.selectbox(key="form.train.optimizer").value == "adafactor"
    # The form's top says it was just filled, and with what.
    filled = [box.value for box in at.info if box.value.startswith("Filled from the Memory planner: ")]
    assert filled == [f"Filled from the Memory planner: Model tiny-bert, Max sequence length (tokens) {LENGTH}, "
                      f"Micro-batch size (m) {m}, Accumulation steps (k) {k}, Memory budget (MB) 3, "
                      f"Gradient checkpointing on, Precision bf16, Optimizer adafactor, Epochs {config.epochs}."]
    # Once the visitor changes what the planner filled, the form no longer says the planner chose it.
    at.number_input(key="form.train.grad_accum_steps").set_value(k + 1).run()
    assert not [box.value for box in at.info if box.value.startswith("Filled from")]


def test_the_plan_reaches_the_code_page_and_later_train_edits_are_kept(app_home):
    # Pages share the Train form's RunConfig: the planner writes its advice into it, the Code page reads it,
    # and the Train form does not fall back to the plan once the visitor has edited it.
    at = measured_page({"budget_mb": 20.0, "target_effective_batch": 64})
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    at.button(key="use_plan").click().run()
    assert at.number_input(key="form.train.max_seq_length").value == LENGTH
    at.switch_page("pages/train.py").run()  # AppTest's next run() would run the planner again
    assert at.number_input(key="form.train.micro_batch_size").value == m
    set_numbers(at, "train", {"epochs": 5})
    at.switch_page("pages/code.py").run()
    code = at.code[0].value
    header = {line.split("#")[0].strip() for line in code.splitlines()}
    assert {f"micro_batch_size = {m}", f"grad_accum_steps = {k}", "epochs = 5"} <= header
    at.switch_page("pages/train.py").run()
    assert at.number_input(key="form.train.epochs").value == 5
    assert at.number_input(key="form.train.micro_batch_size").value == m
    assert not at.exception


@pytest.fixture
def model_folder(tmp_path, monkeypatch):
    """A small BERT saved with save_pretrained: to gradacc a pretrained model, with the pretrained recipe."""
    from gradacc.training.sources.models import tiny_bert, tiny_bert_tokenizer

    folder = tmp_path / "models" / "small-bert"
    tiny_bert(2, {0: "negative", 1: "positive"}, seed=0, dropout=0.1).save_pretrained(str(folder))
    tiny_bert_tokenizer().save_pretrained(str(folder))
    monkeypatch.setenv("GRADACC_MODEL_DIRS", str(folder.parent))
    return str(folder)


def test_in_a_fresh_session_the_plan_reaches_the_train_page_whole_with_the_models_recipe(app_home, model_folder):
    at = open_app("planner")
    at.selectbox(key="form.planner.model_choice").set_value(inputs.OTHER_MODEL).run()
    at.text_input(key="form.planner.model_custom").input(model_folder).run()
    set_numbers(at, "planner", {"max_seq_length": LENGTH})
    at.button(key="measure").click().run()
    assert not at.exception, [e.value for e in at.exception]
    set_numbers(at, "planner", {"budget_mb": 50.0, "target_effective_batch": 64})
    pick = at.success[0].value
    assert pick.startswith("Pick: **") and "· adamw**" in pick  # the Train form's optimizer, not a lighter one
    assert set(at.dataframe[0].value["optimizer"]) == {"adamw", "sgd", "adafactor"}  # all shown, adamw picked
    # Allowed to change the optimizer, the planner still offers none but AdamW: the recipe for a pretrained
    # model has no rate for SGD or Adafactor, and another optimizer's would be a guess.
    at.checkbox(key="form.planner.change_optimizer").set_value(True).run()
    assert all(label.endswith("· adamw") for label in at.selectbox(key="form.planner.setting").options)
    at.checkbox(key="form.planner.change_optimizer").set_value(False).run()
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    at.button(key="use_plan").click().run()
    assert not at.exception and at.title[0].value == "Gradient accumulation, live"
    config = at.session_state["train_config"]
    recipe = recipes.PRETRAINED_RECIPE
    assert (config.model, config.micro_batch_size, config.grad_accum_steps) == (model_folder, m, k)
    assert (config.learning_rate, config.epochs, config.max_seq_length) == (recipe.learning_rate, recipe.epochs, LENGTH)
    assert config.memory_budget_mb == 50.0 and config.optimizer == "adamw"
    assert at.text_input(key="form.train.model_custom").value == model_folder
    assert at.number_input(key="form.train.learning_rate").value == recipe.learning_rate
    assert at.number_input(key="form.train.memory_budget_mb").value == 50.0
    assert any(i.value.startswith("Set to the recipe for a pretrained model: Learning rate 5e-05") for i in at.info)
    assert not at.error and not at.warning


def test_several_processes_show_each_ranks_memory_replicated_and_sharded_both_ways(app_home):
    at = measured_page({"budget_mb": 3.0, "target_effective_batch": 64})
    assert not at.table  # one process: nothing to spread
    at.selectbox(key="form.planner.processes").set_value(8).run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.table[0].value
    assert list(table["way"]) == ["replicated (DDP)", "sharded (FSDP), per-window sync",
                                  "sharded (FSDP), per-micro-batch sync"]
    for m, k in zip(table["m"].dropna(), table["k"].dropna()):
        assert m * k * 8 == 64
    verdict = at.info[-1].value
    assert verdict.startswith(("Both ways", "Per-window sync does not fit", "No accumulation", "Neither"))
    set_numbers(at, "planner", {"target_effective_batch": 60})  # not a multiple of 8: said, next to the field
    assert "multiple of the 8 processes" in error_after(at, "form.planner.target_effective_batch")


def test_the_pick_counts_the_runs_optimizer_steps_and_hands_the_epochs_that_learn_to_the_train_page(app_home):
    # The planner's defaults (target 256, budget 100 MB) on the Train form's data: 2,000 built-in examples.
    at = measured_page({}, change_optimizer=False)
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    per_epoch = math.ceil(math.ceil(2000 / m) / k)  # counted by hand
    minimum = recipes.recipe_for("tiny-bert").min_optimizer_steps
    epochs = max(recipes.recipe_for("tiny-bert").epochs, math.ceil(minimum / per_epoch))
    assert per_epoch * recipes.recipe_for("tiny-bert").epochs < minimum <= per_epoch * epochs  # the case
    pick = at.success[0].value
    assert f"2,000 training examples at 256 a step: {per_epoch} optimizer steps an epoch" in pick
    assert f"Train {epochs} epochs ({per_epoch * epochs} steps)" in pick
    assert (metric(at, "Epochs"), metric(at, "Optimizer steps")) == (str(epochs), str(per_epoch * epochs))
    at.button(key="use_plan").click().run()
    assert at.title[0].value == "Gradient accumulation, live"
    assert at.session_state["train_config"].epochs == epochs == at.number_input(key="form.train.epochs").value
    assert metric(at, "Optimizer steps") == str(per_epoch * epochs)  # the Train page counts the same
    assert not at.exception


def test_the_pick_counts_the_train_forms_data_and_keeps_its_epochs_where_they_give_enough(app_home):
    at = open_app("train")
    set_numbers(at, "train", {"train_samples": 1000, "epochs": 40})
    at.switch_page("pages/planner.py").run()
    set_numbers(at, "planner", {"max_seq_length": LENGTH})
    at.button(key="measure").click().run()
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    per_epoch = math.ceil(math.ceil(1000 / m) / k)
    assert f"1,000 training examples at 256 a step: {per_epoch} optimizer steps an epoch, {per_epoch * 40} in the " \
           f"40 epochs of the run; tiny-bert learns from" in at.success[0].value
    assert metric(at, "Epochs") == "40"


def test_a_model_that_cannot_run_here_is_planned_from_its_config_on_a_gpu_preset(app_home, tmp_path, monkeypatch):
    from transformers import LlamaConfig

    monkeypatch.setenv("GRADACC_MODEL_DIRS", str(tmp_path))  # the deployment's model folders: a visitor's paths stay in

    LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=176, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=512, max_position_embeddings=256).save_pretrained(tmp_path / "tiny")
    at = open_app("planner")
    at.text_input(key="form.planner.config_source").set_value(str(tmp_path / "tiny"))
    at.selectbox(key="form.planner.config_gpu").set_value("16 GB")
    at.number_input(key="form.planner.config_length").set_value(128)
    at.number_input(key="form.planner.config_target").set_value(16).run()
    at.button(key="plan_config").click().run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert len(table) == 36 and table["m"].iloc[0] == 16 and table["k"].iloc[0] == 1
    assert {"weights (GB)", "activations (GB)", "logits + loss (GB)", "framework overhead (GB)"} <= set(table.columns)
    assert any("accelerate estimate-memory" in caption.value for caption in at.caption)
    # on several GPUs every setting three ways: replicated, and sharded with each sync; the replica first where it fits
    at.selectbox(key="form.planner.config_processes").set_value(4).run()
    at.button(key="plan_config").click().run()
    table = at.dataframe[0].value
    assert len(table) == 108 and set(table["ranks"]) == {"DDP", "FSDP per-window", "FSDP per-micro-batch"}
    assert table["ranks"].iloc[0] == "DDP"
    at.text_input(key="form.planner.config_source").set_value("no/such/folder/x").run()
    at.button(key="plan_config").click().run()
    assert at.error[0].value == "Model 'no/such/folder/x': no such file or folder."
    # bad input in the page's words (the field's label), not the command line's flags
    at.text_input(key="form.planner.config_source").set_value(str(tmp_path / "tiny"))
    at.number_input(key="form.planner.config_length").set_value(4096).run()
    at.button(key="plan_config").click().run()
    length = at.number_input(key="form.planner.config_length").label
    assert at.error[0].value == f"{length} 4096 is longer than the model's max_position_embeddings (256)."
    # a visitor reads no config outside the deployment's model folders
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=512).save_pretrained(outside)
    at.text_input(key="form.planner.config_source").set_value(str(outside)).run()
    at.button(key="plan_config").click().run()
    assert "is outside the allowed folders" in at.error[0].value and "--" not in at.error[0].value
