"""The Memory planner page: measure once, recommend m and k for a budget, hand them to the Train page."""

from app_support import chart, error_after, metric, open_app, set_numbers


def test_measures_the_model_and_recommends_micro_batch_and_accumulation(app_home):
    at = open_app("planner")
    assert "Press **Measure**" in at.info[0].value
    at.button(key="measure").click().run()
    assert not at.exception
    assert metric(at, "Parameters").endswith("kB")  # tiny-bert: about 190k float32 parameters
    set_numbers(at, "planner", {"budget_mb": 20.0, "target_effective_batch": 64})
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    assert 1 <= m < 64 and m * k >= 64 and (m - 1) * k < 64  # the fewest steps, no larger m than needed
    assert int(metric(at, "Effective batch")) == m * k
    figure = chart(at, "Memory plan: peak memory by micro-batch size")
    assert [trace["name"] for trace in figure["data"]] == ["predicted", "measured"]
    measured = at.dataframe[0].value
    assert list(measured["micro-batch size"]) == [1, 2, 4, 8]

    # More memory: a larger micro-batch, fewer steps.
    set_numbers(at, "planner", {"budget_mb": 1000.0})
    assert metric(at, "Micro-batch size (m)") == "64" and metric(at, "Accumulation steps (k)") == "1"

    # Too little: said next to the budget.
    set_numbers(at, "planner", {"budget_mb": 1.0})
    assert "too small" in error_after(at, "form.planner.budget_mb")
    assert not at.exception


def test_use_these_settings_fills_in_the_train_page(app_home):
    at = open_app("planner")
    at.button(key="measure").click().run()
    set_numbers(at, "planner", {"budget_mb": 20.0, "target_effective_batch": 64})
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    at.button(key="use_plan").click().run()
    assert at.title[0].value == "Gradient accumulation, live"
    assert at.number_input(key="form.train.micro_batch_size").value == m
    assert at.number_input(key="form.train.grad_accum_steps").value == k


def test_the_plan_reaches_the_code_page_and_later_train_edits_are_kept(app_home):
    # Pages share the Train form's RunConfig: the planner writes its advice into it, the Code page reads it,
    # and the Train form does not fall back to the plan once the visitor has edited it.
    at = open_app("planner")
    at.button(key="measure").click().run()
    set_numbers(at, "planner", {"max_seq_length": 48, "budget_mb": 20.0, "target_effective_batch": 64})
    at.button(key="measure").click().run()
    m, k = int(metric(at, "Micro-batch size (m)")), int(metric(at, "Accumulation steps (k)"))
    at.button(key="use_plan").click().run()
    assert at.number_input(key="form.train.max_seq_length").value == 48
    at.switch_page("pages/train.py").run()  # AppTest's next run() would run the planner again
    assert at.number_input(key="form.train.micro_batch_size").value == m
    set_numbers(at, "train", {"epochs": 5})
    at.switch_page("pages/code.py").run()
    code = at.code[0].value
    header = {line.split("#")[0].strip() for line in code.splitlines()}
    assert {f"micro_batch_size = {m}", f"gradient_accumulation_steps = {k}", "epochs = 5"} <= header
    at.switch_page("pages/train.py").run()
    assert at.number_input(key="form.train.epochs").value == 5
    assert at.number_input(key="form.train.micro_batch_size").value == m
    assert not at.exception
