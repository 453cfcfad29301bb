"""Memory planner math: the activation line, the plan over lever settings, and a real measurement of tiny-bert."""

import pytest

from gradacc.analysis import planner
from gradacc.recipes import recipe_for
from gradacc.errors import GradaccError
from gradacc.analysis.planner import ActivationFit, fit_activations

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


def setting(levers: dict, static_mb: float, per_example_mb: float, seconds: float) -> dict:
    """A measured lever setting as measure_levers returns it, with round figures."""
    return {"levers": levers, "static": {"total": static_mb * MB}, "seconds_per_example": seconds,
            "fit": {"fixed_bytes": 0.0, "bytes_per_example": per_example_mb * MB},
            "activations": {1: per_example_mb * MB, 2: 2 * per_example_mb * MB, 4: 4 * per_example_mb * MB,
                            8: 8 * per_example_mb * MB}, "held_out_error": 0.0}


HEAVY = {"gradient_checkpointing": False, "precision": "fp32", "optimizer": "adamw"}
LIGHT = {"gradient_checkpointing": True, "precision": "bf16", "optimizer": "adafactor"}


def test_each_setting_gets_the_largest_power_of_two_that_fits_and_divides_the_target():
    measured = [setting(HEAVY, 10, 1, 0.001), setting(LIGHT, 4, 0.25, 0.002)]
    plan = planner.plan_levers(measured, 50, 96)  # 96 = 32 × 3: m can be 1, 2, 4, 8, 16 or 32
    heavy, light = (next(r for r in plan["rows"] if r["optimizer"] == o) for o in ("adamw", "adafactor"))
    assert (heavy["micro_batch_size"], heavy["grad_accum_steps"]) == (32, 3)  # 10 + 32 = 42 MB; 64 does not divide
    assert heavy["predicted_peak_bytes"] == pytest.approx(42 * MB)
    assert (light["micro_batch_size"], light["grad_accum_steps"]) == (32, 3)
    assert plan["fastest"] == heavy and plan["cheapest_memory"] == light and plan["reason"] is None
    assert light["least_bytes"] == pytest.approx(4.25 * MB)  # what it needs at m = 1
    # Least memory is what a setting needs, not its peak at the largest m it fits (that fills any budget alike):
    # heavy, m=8: 20 + 2 × 8 = 36 MB; light, m=128: 4 + 0.3 × 128 = 42.4 MB; at m = 1, 22 MB against 4.3 MB.
    plan = planner.plan_levers([setting(HEAVY, 20, 2, 0.001), setting(LIGHT, 4, 0.3, 0.002)], 50, 256)
    assert [r["micro_batch_size"] for r in plan["rows"]] == [8, 128]
    assert plan["cheapest_memory"]["optimizer"] == "adafactor"
    assert planner.measurement_of(measured, light)["levers"] == LIGHT
    check = planner.held_out_check(measured[0])
    assert (check["size"], check["fitted_on"], check["error"]) == (8, [1, 2, 4], 0.0)
    assert check["predicted"] == check["measured"] == 8 * MB


def test_a_setting_that_does_not_fit_is_ranked_last_and_nothing_fitting_is_said_in_one_line():
    measured = [setting(HEAVY, 10, 1, 0.001), setting(LIGHT, 4, 0.25, 0.002)]
    plan = planner.plan_levers(measured, 8, 64)  # the heavy setting's static 10 MB alone is over 8 MB
    assert [r["fits"] for r in plan["rows"]] == [True, False] and plan["fastest"]["optimizer"] == "adafactor"
    nothing = planner.plan_levers(measured, 2, 64)
    assert nothing["fastest"] is None and nothing["cheapest_memory"] is None
    assert nothing["reason"] == ("Memory budget (MB) 2 is too small for every setting: even a micro-batch of 1 with "
                                 "the lightest (checkpointing on · bf16 · adafactor) needs about 4.2 MB (its "
                                 "parameters, gradients and optimizer state alone are 4.0 MB).")


@pytest.mark.parametrize("budget_mb, target, field", [(0, 8, "budget_mb"), (float("nan"), 8, "budget_mb"),
                                                       (100, 0, "target_effective_batch"),
                                                       (100, 2.5, "target_effective_batch")])
def test_impossible_inputs_are_refused_with_the_field(budget_mb, target, field):
    with pytest.raises(GradaccError) as raised:
        planner.plan_levers([setting(HEAVY, 1, 1, 0.001)], budget_mb, target)
    assert raised.value.field == field


def test_chart_sizes_cover_the_measurements_and_the_plan():
    assert planner.chart_sizes(16) == [1, 2, 4, 8, 16, 32]
    assert planner.chart_sizes(None) == [1, 2, 4, 8, 16]


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


CHECKPOINTED = {"gradient_checkpointing": True, "precision": "fp32", "optimizer": "adamw"}
SGD = {"gradient_checkpointing": False, "precision": "fp32", "optimizer": "sgd"}


ADAFACTOR = {"gradient_checkpointing": False, "precision": "fp32", "optimizer": "adafactor"}


def test_the_pick_keeps_the_optimizer_and_prefers_accumulation_to_a_lever_that_costs_time():
    # Adafactor is the fastest and fits m = 64; AdamW fits with accumulation (m = 16, k = 4); checkpointing is slower.
    measured = [setting(HEAVY, 10, 2, 0.0010), setting(CHECKPOINTED, 10, 0.5, 0.0014),
                setting(ADAFACTOR, 5, 1, 0.0008)]
    plan = planner.plan_levers(measured, 50, 64)
    top = planner.pick(plan, "adamw", False, model="tiny-bert")
    assert planner.levers_of(top["row"]) == HEAVY and top["row"]["grad_accum_steps"] == 4
    assert top["why"].startswith("Accumulation alone fits (m = 16, k = 4)")
    assert "checkpointing on · fp32 · adamw fits too but takes +40% time per example" in top["why"]
    assert top["learning_rate"] is None  # the run keeps its own rate
    # adamw-fused takes AdamW's learning rate: the same candidates.
    assert planner.pick(plan, "adamw-fused", False, model="tiny-bert")["row"] is top["row"]
    # Allowed to change the optimizer, Adafactor (20% faster, beyond the noise) wins, with its own measured rate.
    allowed = planner.pick(plan, "adamw", True, model="tiny-bert")
    own = recipe_for("tiny-bert").learning_rate_for("adafactor")
    assert allowed["row"]["optimizer"] == "adafactor" and "20% faster per example than checkpointing off" in allowed["why"]
    assert allowed["learning_rate"] == own != recipe_for("tiny-bert").learning_rate
    assert (f"adafactor trains at its own learning rate, {own:g}, measured for tiny-bert's recipe" in allowed["why"]
            and "not adamw's" in allowed["why"])
    # Within the timing's noise, fewer levers win even when allowed.
    close = planner.plan_levers([setting(HEAVY, 10, 2, 0.0010), setting(ADAFACTOR, 5, 1, 0.00095)], 50, 64)
    assert planner.pick(close, "adamw", True, model="tiny-bert")["row"]["optimizer"] == "adamw"


def test_the_planner_never_offers_an_optimizer_the_recipe_has_no_learning_rate_for():
    # A pretrained folder's recipe has AdamW's rate only: SGD and Adafactor, fastest and fitting, are not offered.
    measured = [setting(HEAVY, 10, 2, 0.0010), setting(SGD, 5, 1, 0.0008), setting(ADAFACTOR, 5, 1, 0.0008)]
    plan = planner.plan_levers(measured, 50, 64)
    allowed = planner.allowed_rows(plan, "adamw", True, model="/models/a-pretrained-folder")
    assert [row["optimizer"] for row in allowed] == ["adamw"]
    top = planner.pick(plan, "adamw", True, model="/models/a-pretrained-folder")
    assert top["row"]["optimizer"] == "adamw" and top["learning_rate"] is None
    # With nothing else fitting, the planner names what it leaves out and why.
    tight = planner.plan_levers(measured, 11, 64)  # AdamW needs 12 MB at m = 1
    assert planner.pick(tight, "adamw", True, model="/models/a-pretrained-folder") is None
    assert planner.unrated_optimizers(tight, "adamw", "/models/a-pretrained-folder") == ["sgd", "adafactor"]
    # A built-in model offers exactly the optimizers its recipe has a rate for.
    recipe = recipe_for("tiny-bert")
    offered = {row["optimizer"] for row in planner.allowed_rows(plan, "adamw", True, model="tiny-bert")}
    assert offered == {"adamw"} | {name for name in ("sgd", "adafactor") if recipe.learning_rate_for(name)}


def test_a_lever_is_picked_when_accumulation_alone_does_not_fit():
    measured = [setting(HEAVY, 10, 8, 0.0010), setting(CHECKPOINTED, 10, 1, 0.0014), setting(SGD, 2, 1, 0.0008)]
    plan = planner.plan_levers(measured, 16, 64)  # AdamW without checkpointing needs 18 MB at m = 1
    top = planner.pick(plan, "adamw", False, model="tiny-bert")
    assert planner.levers_of(top["row"]) == CHECKPOINTED
    assert top["why"].startswith("Accumulation alone does not fit: without checkpointing not even a micro-batch")
    assert planner.pick(planner.plan_levers(measured[:1], 16, 64), "adamw", False, model="tiny-bert") is None


# ---- several processes, sharded or not (gradacc.analysis.sharding.plan_processes) -----------------------

def sharded_setting(parameters: int = 25_000_000, layer: int = 2_000_000) -> dict:
    """A measured fp32 AdamW setting of a model with 10 layers: 4 bytes of parameters and gradients, 8 of state."""
    root = parameters - 10 * layer
    return {"static": {"parameters": 4 * parameters, "gradients": 4 * parameters, "optimizer_state": 8 * parameters,
                       "total": 16 * parameters},
            "fit": {"fixed_bytes": 0.0, "bytes_per_example": 5 * MB},
            "shape": {"parameters": parameters, "largest_group": max(layer, root), "first_reduced": layer,
                      "root": root}}


def test_sharding_divides_what_every_rank_holds_and_per_window_sync_keeps_the_whole_gradient():
    from gradacc.analysis import sharding

    plan = sharding.plan_processes(sharded_setting(), budget_mb=250, target_effective_batch=256, processes=8)
    ways = plan["ways"]
    # Replicated: 400 MB static on every rank. Sharded: 300/8 MB of parameters and state, plus the gradients.
    assert ways["ddp"]["static_bytes"] == 400 * MB
    assert ways["per-window"]["gradient_bytes"] == pytest.approx(100 * MB + 4 * 2 * MB / 8)
    assert ways["per-micro-batch"]["gradient_bytes"] == pytest.approx(100 * MB / 8 + 4 * 5 * MB * (1 + 1 / 8))
    assert ways["per-micro-batch"]["static_bytes"] < ways["per-window"]["static_bytes"] < ways["ddp"]["static_bytes"]
    assert not ways["ddp"]["fits"]  # 400 MB of replicated state alone is over 250 MB
    for way in (ways["per-window"], ways["per-micro-batch"]):  # m × k × 8 processes = 256 exactly
        assert way["micro_batch_size"] * way["grad_accum_steps"] * 8 == 256
    # Per-micro-batch sync sends k times the gradient bytes per window (a ring sends 7/8 of them).
    k = ways["per-micro-batch"]["grad_accum_steps"]
    assert ways["per-micro-batch"]["sent_bytes"] == pytest.approx(k * 100 * MB * 7 / 8)
    assert ways["per-window"]["sent_bytes"] == pytest.approx(100 * MB * 7 / 8)
    assert plan["verdict"].startswith("Both ways to sync fit")


def test_the_planner_says_when_only_per_micro_batch_sync_fits_and_what_it_sends():
    from gradacc.analysis import sharding

    # 120 MB per rank: per-window's 101 MB of gradients and the rest are over it; per-micro-batch's 35 MB leave room.
    plan = sharding.plan_processes(sharded_setting(), budget_mb=120, target_effective_batch=64, processes=8)
    ways = plan["ways"]
    assert not ways["ddp"]["fits"] and not ways["per-window"]["fits"] and ways["per-micro-batch"]["fits"]
    assert plan["verdict"].startswith("Per-window sync does not fit: it holds the whole model's gradients (101.0 MB)")
    assert ways["per-micro-batch"]["micro_batch_size"] == 4 and ways["per-micro-batch"]["grad_accum_steps"] == 2
    assert plan["verdict"].endswith("sends 175.0 MB of gradients per window instead of 87.5 MB (2×).")


def test_no_accumulation_needed_is_said_as_such():
    from gradacc.analysis import sharding

    plan = sharding.plan_processes(sharded_setting(), budget_mb=5000, target_effective_batch=64, processes=8)
    assert plan["ways"]["per-micro-batch"]["grad_accum_steps"] == 1
    assert plan["ways"]["per-window"]["grad_accum_steps"] == 2  # planned with a window to accumulate
    assert plan["verdict"].startswith("No accumulation is needed: m = 8 per rank")


def test_a_target_the_processes_do_not_divide_is_refused_with_the_field():
    from gradacc.analysis import sharding

    with pytest.raises(GradaccError, match="multiple of the 8 processes") as refused:
        sharding.plan_processes(sharded_setting(), budget_mb=2000, target_effective_batch=60, processes=8)
    assert refused.value.field == "target_effective_batch"


def test_the_formula_of_real_sizes_holds_its_parameter_counts():
    from gradacc.analysis import sharding

    counts = {row["model"]: row["parameters"] for row in sharding.real_sizes()}
    assert counts["1B"] == pytest.approx(1.236e9, rel=0.01) and counts["8B"] == pytest.approx(8.03e9, rel=0.01)
    assert counts["70B"] == pytest.approx(70.55e9, rel=0.01)
    seventy = next(row for row in sharding.real_sizes() if row["model"] == "70B" and row["processes"] == 64)
    # Per-window sync holds the unsharded bf16 gradients whatever P: 141 GB, no 80 GB device holds them.
    assert seventy["grad_bytes"]["per-window"] == pytest.approx(2 * counts["70B"])
    assert seventy["grad_bytes"]["per-window"] / seventy["grad_bytes"]["per-micro-batch"] == pytest.approx(64)
