"""Memory planner math: the activation line, the recommendation, and a real measurement of tiny-bert."""

import pytest

from gradacc.analysis import planner
from gradacc.errors import GradaccError
from gradacc.analysis.planner import ActivationFit, fit_activations, recommend

MB = planner.MB


def test_a_line_through_exact_points_is_recovered():
    fit = fit_activations({1: 1_500, 2: 2_500, 4: 4_500, 8: 8_500})
    assert fit.fixed_bytes == pytest.approx(500)
    assert fit.bytes_per_example == pytest.approx(1_000)
    assert fit.predict(16) == pytest.approx(16_500)


def test_one_point_goes_through_the_origin_and_noise_never_gives_a_negative_slope():
    assert fit_activations({4: 4_000}) == ActivationFit(0.0, 1_000.0)
    assert fit_activations({1: 5_000, 2: 4_000}).bytes_per_example == 0.0
    with pytest.raises(GradaccError):
        fit_activations({})


def test_recommends_the_fewest_steps_that_reach_the_target_exactly_when_possible():
    fit = ActivationFit(fixed_bytes=0, bytes_per_example=1 * MB)
    # 100 MB budget, 10 MB static: 90 examples fit; 256 needs k = ceil(256/90) = 3, then m = ceil(256/3) = 86.
    plan = recommend(10 * MB, fit, 100 * MB, 256)
    assert plan.largest_fitting_micro_batch == 90
    assert (plan.micro_batch_size, plan.grad_accum_steps, plan.effective_batch) == (86, 3, 258)
    assert plan.peak_bytes == pytest.approx(96 * MB)
    # A target that divides evenly: m = 128, k = 2, not 239 × 2 = 478.
    plan = recommend(10 * MB, fit, 249 * MB, 256)
    assert (plan.micro_batch_size, plan.grad_accum_steps, plan.effective_batch) == (128, 2, 256)


def test_a_budget_that_fits_the_target_in_one_micro_batch_needs_no_accumulation():
    plan = recommend(10 * MB, ActivationFit(0, 1 * MB), 10_000 * MB, 64)
    assert (plan.micro_batch_size, plan.grad_accum_steps) == (64, 1)


def test_processes_share_the_target():
    plan = recommend(0, ActivationFit(0, 1 * MB), 16 * MB, 64, num_processes=2)
    assert (plan.micro_batch_size, plan.grad_accum_steps, plan.effective_batch) == (16, 2, 64)


@pytest.mark.parametrize("budget, target, field", [(5 * MB, 8, "budget_mb"), (0, 8, "budget_mb"),
                                                    (100 * MB, 0, "target_effective_batch")])
def test_impossible_plans_are_refused_with_the_field(budget, target, field):
    with pytest.raises(GradaccError) as raised:
        recommend(4 * MB, ActivationFit(0, 2 * MB), budget, target)
    assert raised.value.field == field


def test_chart_sizes_cover_the_measurements_and_the_plan():
    plan = recommend(0, ActivationFit(0, MB), 100 * MB, 24)
    assert planner.chart_sizes(plan) == [1, 2, 4, 8, 16, 24, 32]


def test_measuring_tiny_bert_gives_static_bytes_and_a_linear_activation_cost():
    measurement = planner.measure("tiny-bert", 32, sizes=(1, 2, 4))
    static = measurement.static
    assert static["gradients"] == static["parameters"] and static["optimizer_state"] == 2 * static["parameters"]
    assert set(measurement.activations) == {1, 2, 4}
    fit = measurement.fit
    # Activations grow in proportion to the micro-batch (padded to the same length).
    for size, measured in measurement.activations.items():
        assert fit.predict(size) == pytest.approx(measured, rel=0.05)
    assert measurement.activations[4] > 3 * measurement.activations[1]


def test_the_lever_planner_hits_the_target_exactly_and_checks_its_line_on_a_held_out_micro_batch():
    grid = (planner.LEVER_GRID[0], {"gradient_checkpointing": True, "precision": "bf16", "optimizer": "adafactor"})
    measured = planner.measure_levers("tiny-bert", 64, grid=grid)
    plain, light = measured
    assert light["static"]["total"] < plain["static"]["total"]
    assert light["fit"]["bytes_per_example"] < plain["fit"]["bytes_per_example"]
    for row in measured:  # fitted on 1, 2, 4; checked on 8
        assert set(row["activations"]) == {1, 2, 4, 8} and abs(row["held_out_error"]) < 0.05
    budget_mb = (plain["static"]["total"] + plain["fit"]["fixed_bytes"] + plain["fit"]["bytes_per_example"] * 6) / 1e6
    plan = planner.plan_levers(measured, budget_mb, 48)
    for row in plan["rows"]:
        assert row["micro_batch_size"] * row["grad_accum_steps"] == 48  # m a power of two dividing the target
        assert row["predicted_peak_bytes"] <= budget_mb * 1e6
    by_levers = {row["precision"]: row for row in plan["rows"]}
    assert by_levers["fp32"]["micro_batch_size"] == 4 and by_levers["bf16"]["micro_batch_size"] == 16
    assert plan["cheapest_memory"]["precision"] == "bf16"
    assert plan["fastest"] in plan["rows"]
