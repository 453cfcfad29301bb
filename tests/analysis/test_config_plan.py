"""Planning from a config alone (gradacc.analysis.config_plan, `gradacc plan --model CONFIG`): exact parameters, a
70B config on the meta device, predictions against measured peaks, bad input in one line."""

import json
import resource

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from attack_support import assert_one_error_line, cli
from gradacc.analysis import config_plan
from gradacc.training.memory import architecture

TINY_LLAMA = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=176, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
TINY_GPT2 = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=256, bos_token_id=0, eos_token_id=0)
# Small enough to train here in a second, larger than the copies the fit is measured on (width 64 to 128).
SMALL_LLAMA = dict(num_hidden_layers=3, hidden_size=128, intermediate_size=352, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=2048, max_position_embeddings=256)
SMALL_GPT2 = dict(n_layer=3, n_embd=128, n_head=4, vocab_size=2048, n_positions=256, bos_token_id=0, eos_token_id=0)
LLAMA_70B = dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                 intermediate_size=28672, vocab_size=128256, max_position_embeddings=8192)


@pytest.mark.parametrize("config", [LlamaConfig(**TINY_LLAMA), GPT2Config(**TINY_GPT2)], ids=["llama", "gpt2-tied"])
def test_the_meta_device_counts_the_parameters_of_the_real_model_exactly(config):
    real = AutoModelForCausalLM.from_config(config)
    meta = architecture.empty_model(config)
    assert all(p.device.type == "meta" for p in meta.parameters())
    assert architecture.shape_of(meta, config).parameters == sum(p.numel() for p in real.parameters())


def test_a_70b_config_plans_on_the_meta_device_without_allocating_its_weights():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    config = LlamaConfig(**LLAMA_70B)
    result = config_plan.plan("llama-70b", budget_mb=80_000, sequence_length=2048, target_effective_batch=256,
                              processes=8, config=config)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert result["parameters"] == 70_553_706_496  # Llama-3-70B's count
    assert grown < 2e9, grown  # the weights alone would be 282 GB in fp32
    fitting = [row for row in result["rows"] if row["fits"]]
    assert fitting, "on 8 × 80 GB something fits a 70B model"
    for row in result["rows"]:
        terms = row["terms"]
        assert terms["peak"] == pytest.approx(sum(terms[name] for name in config_plan.TERMS)
                                              + terms["step_temporaries"])
    # accelerate's view: 16 bytes a parameter in fp32 (weights, gradients, two Adam states), no activations
    assert result["accelerate"]["adam_fp32_bytes"] == pytest.approx(16 * result["parameters"], rel=1e-6)
    # and on one 24 GB GPU nothing fits: the line says the smallest footprint and what would fit
    alone = config_plan.plan("llama-70b", budget_mb=24_576, sequence_length=2048, target_effective_batch=256,
                             config=config)
    assert alone["reason"].startswith("no setting fits 24,576 MB: the smallest footprint is ")
    assert "GPUs sharded (FSDP" in alone["reason"]


@pytest.mark.parametrize("config", [LlamaConfig(**SMALL_LLAMA), GPT2Config(**SMALL_GPT2)], ids=["llama", "gpt2"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["checkpointing-off", "checkpointing-on"])
def test_the_predicted_peak_is_within_ten_percent_of_the_measured_one(config, checkpointing):
    setting = {"lora_rank": None, "precision": "fp32", "optimizer": "adamw", "gradient_checkpointing": checkpointing}
    for micro_batch_size, sequence_length in ((2, 128), (4, 64)):
        checked = config_plan.check_prediction(config, setting, micro_batch_size, sequence_length)
        assert abs(checked["error"]) <= 0.10, checked
        assert abs(checked["activation_error"]) <= 0.10, checked


def test_pure_bf16_checkpointed_gpt2_fits_the_layers_and_the_heads_forward_apart():
    """On the CPU, GPT-2's attention (dropout on: sdpa's math path) holds the checkpointed forward's peak at long
    sequences, the logits and the loss at short ones. Fitted as one phase, the fit stood in for the logits with the
    largest parameter (the tied embedding) and over-predicted a short sequence's activations by a third; each moment
    its own phase (architecture.PHASES), neither forward phase has a term in the weights (pure bf16: no autocast
    copies, no temporary the size of a weight)."""
    config = GPT2Config(**SMALL_GPT2)
    setting = {"lora_rank": None, "precision": "bf16-pure", "optimizer": "adamw", "gradient_checkpointing": True}
    for micro_batch_size, sequence_length in ((1, 64), (2, 128)):
        checked = config_plan.check_prediction(config, setting, micro_batch_size, sequence_length)
        assert abs(checked["error"]) <= 0.10, checked
        assert abs(checked["activation_error"]) <= 0.10, checked
    fit = config_plan.fit_activations(config, precision="bf16-pure", checkpointing=True, lora_rank=None)
    assert len(fit["phase_coefficients"]) == len(architecture.PHASES)
    for phase in ("layers_forward", "head_forward"):
        coefficients = fit["phase_coefficients"][architecture.PHASES.index(phase)]
        assert coefficients["largest_parameter"] < 0.5 and coefficients["linear_parameters"] == 0, (phase,
                                                                                                   coefficients)


def test_lora_trains_only_the_adapters_and_plans_their_state_alone():
    config = LlamaConfig(**TINY_LLAMA)
    shape = architecture.shape_of(architecture.empty_model(config), config)
    model = architecture.add_lora(AutoModelForCausalLM.from_config(config), 8)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == shape.lora_parameters(8) > 0
    static = config_plan.static_terms(shape, lora_rank=8, precision="fp32", optimizer="adamw")
    assert static["optimizer_state"] == 2 * 4 * trainable and static["gradients"] == 4 * trainable


@pytest.fixture
def tiny_folder(tmp_path):
    LlamaConfig(**TINY_LLAMA).save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_plan_from_a_config_folder_shows_every_term_and_accelerates_view(capsys, tiny_folder):
    code, out, err = cli(capsys, "plan", "--model", str(tiny_folder), "--memory-budget-mb", "2000",
                         "--max-seq-length", "128", "--target-effective-batch", "16")
    assert code == 0, err
    assert "built on the meta device" in out and "pick: full · fp32 · adamw · checkpointing off, m=16, k=1" in out
    for head in ("weights", "grads", "optimizer", "activations", "logits+loss", "overhead", "sharding"):
        assert head in out.splitlines()[2]
    assert "accelerate estimate-memory (weights + gradients + Adam states, batch 1, no activations)" in out
    assert "framework overhead: assumed" in out
    code, out, _ = cli(capsys, "plan", "--model", str(tiny_folder / "config.json"), "--memory-budget-mb", "2000",
                       "--max-seq-length", "128", "--target-effective-batch", "16", "--json")
    assert code == 0 and json.loads(out)["parameters"] == 2 * 512 * 64 + 2 * (
        64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64) + 64
    # the pick's weighing, the one the audit test below runs as the plan says
    assert json.loads(out)["normalisation"]["kind"] == "causal_lm"


def test_plan_from_a_config_refuses_bad_input_in_one_line(capsys, tmp_path, tiny_folder, monkeypatch):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"model_type": "no-such-model"}))
    assert_one_error_line(*cli(capsys, "plan", "--model", str(broken), "--memory-budget-mb", "100",
                               "--target-effective-batch", "8"), 2, "transformers cannot read this config")
    unbuildable = tmp_path / "unbuildable.json"  # read as a BertConfig; BERT's attention refuses to be built from it
    unbuildable.write_text(json.dumps({"model_type": "bert", "hidden_size": 30, "num_attention_heads": 4}))
    assert_one_error_line(*cli(capsys, "plan", "--model", str(unbuildable), "--memory-budget-mb", "100",
                               "--target-effective-batch", "8"), 2,
                          "transformers cannot build a model from this config", "not a multiple of the number of "
                          "attention heads")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_error_line(*cli(capsys, "plan", "--model", "some-org/some-model", "--memory-budget-mb", "100",
                               "--target-effective-batch", "8"), 2,
                          "--model 'some-org/some-model': the hub cannot be reached; give a folder or a config.json")
    assert_one_error_line(*cli(capsys, "plan", "--model", str(tiny_folder), "--memory-budget-mb", "1",
                               "--max-seq-length", "128", "--target-effective-batch", "8"), 2,
                          "no setting fits 1 MB: the smallest footprint is", "a larger budget is the only way")
    assert_one_error_line(*cli(capsys, "plan", "--model", str(tiny_folder), "--memory-budget-mb", "100",
                               "--max-seq-length", "4096", "--target-effective-batch", "8"), 2,
                          "--max-seq-length 4096 is longer than the model's max_position_embeddings (256)")


def test_per_window_sync_holds_the_whole_gradients_and_per_micro_batch_sync_a_shard_of_them():
    """On P ranks each lever setting is planned with both of FSDP's ways to sync (gradacc.analysis.sharding's
    per-rank terms): per-window's gradients do not shrink with P and it needs a window (k ≥ 2)."""
    config = LlamaConfig(**TINY_LLAMA)
    shape = architecture.shape_of(architecture.empty_model(config), config)
    static = config_plan.static_terms(shape, lora_rank=None, precision="fp32", optimizer="adamw")
    window = config_plan.fsdp_terms(static, shape, 4, 4, sync="per-window")
    each = config_plan.fsdp_terms(static, shape, 4, 4, sync="per-micro-batch")
    assert window["gradients"] == 4 * shape.parameters and each["gradients"] == 4 * shape.parameters / 4
    assert window["weights"] == each["weights"] == 4 * shape.parameters / 4
    # the largest group gathered (its weights), plus what its reduce-scatter holds: the last layer's ÷ P once per
    # window, or the largest group's whole gradients and their shard every micro-batch
    assert window["sharding_buffers"] == 4 * shape.largest_group + 4 * shape.first_reduced / 4
    assert each["sharding_buffers"] == 4 * shape.largest_group + 4 * shape.largest_group * (1 + 1 / 4)
    assert config_plan.setting_label({"lora_rank": None, "precision": "fp32", "optimizer": "adamw",
                                      "gradient_checkpointing": False, "sync": "per-window"}).endswith(
        "FSDP per-window sync")


def test_on_several_ranks_ddp_is_planned_too_and_picked_where_it_fits(capsys, tiny_folder):
    """Each setting replicated as well as sharded: a DDP rank holds the whole model, its gradients and optimizer
    state, and the all-reduce buckets (a flat copy of the gradients, torch's default). Where DDP fits it is the pick
    (sharding is a lever); where only a shard fits, FSDP is."""
    config = LlamaConfig(**TINY_LLAMA)
    roomy = config_plan.plan("tiny", budget_mb=2000, sequence_length=128, target_effective_batch=16, processes=4,
                             config=config)
    by_way = {}
    for row in roomy["rows"]:
        by_way.setdefault((row["lora_rank"], row["precision"], row["optimizer"], row["gradient_checkpointing"]),
                          {})[row["sync"]] = row
    assert all(set(ways) == {"ddp", "per-window", "per-micro-batch"} for ways in by_way.values())
    shape = architecture.shape_of(architecture.empty_model(config), config)
    static = config_plan.static_terms(shape, lora_rank=None, precision="fp32", optimizer="adamw")
    ddp = by_way[(None, "fp32", "adamw", False)]["ddp"]["terms"]
    assert (ddp["weights"], ddp["gradients"], ddp["optimizer_state"]) == (
        static["weights"], static["gradients"], static["optimizer_state"])
    assert ddp["sharding_buffers"] == static["gradients"]
    assert roomy["rows"][0]["sync"] == "ddp" and config_plan.setting_label(roomy["rows"][0]).endswith("DDP (replicated)")
    # a budget between a shard's least peak and a replica's: that setting fits sharded only
    shard = by_way[(None, "fp32", "adamw", False)]["per-window"]["least_bytes"]
    budget_mb = (shard + ddp["weights"] / 2) / 1e6
    assert shard + ddp["weights"] / 2 < by_way[(None, "fp32", "adamw", False)]["ddp"]["least_bytes"]
    tight = config_plan.plan("tiny", budget_mb=budget_mb, sequence_length=128, target_effective_batch=16,
                             processes=4, config=config)
    full = {row["sync"]: row["fits"] for row in tight["rows"] if row["lora_rank"] is None and row["precision"] == "fp32"
            and row["optimizer"] == "adamw" and not row["gradient_checkpointing"]}
    assert full == {"ddp": False, "per-window": True, "per-micro-batch": True}
    code, out, err = cli(capsys, "plan", "--model", str(tiny_folder), "--memory-budget-mb", "2000",
                         "--max-seq-length", "128", "--target-effective-batch", "16", "--processes", "4")
    assert code == 0, err
    assert "replicated (DDP) or sharded (FSDP), per rank" in out.splitlines()[0]
    assert {"DDP", "FSDP per-window", "FSDP per-micro-batch"} <= {line[41:63].strip() for line in out.splitlines()[3:]}


def follow(normalisation: dict, model):
    """The plan's Trainer advice applied as written: its compute_loss_func, its loss_type."""
    from gradacc import audit

    if 'model.loss_type = "ForCausalLM"' in normalisation["trainer"]:
        model.loss_type = "ForCausalLM"
    named = normalisation["trainer"].partition("compute_loss_func=gradacc.audit.")[2]
    return getattr(audit, named) if named else None


def test_the_picks_accumulation_run_as_the_plan_says_is_exact_under_gradacc_audit():
    """The items a config plan's pick weighs its micro-batches by (``plan()["normalisation"]``, from the model alone:
    no fit is measured here, the pick's m and k are the CLI tests'), run with Trainer as the plan says, on texts
    of uneven lengths: gradacc's audit and the truth from the logits (audit_truth) both find the window's gradient
    exact. On GPT-2 the advice matters: without the loss_type it sets, Trainer counts each text's first token too."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "training"))  # the audit's tiny data and its truth
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from audit_support import lm_collator, lm_data, train, trainer_args
    from gradacc.training.audit import verdict as V

    config = LlamaConfig(**TINY_LLAMA)
    pick = {"micro_batch_size": 4, "grad_accum_steps": 4}
    gpt2 = GPT2Config(**TINY_GPT2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    def run(config, weighing, advice_followed=True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        loss_func = follow(weighing, model) if advice_followed else None
        args = {**trainer_args(k=pick["grad_accum_steps"]), "per_device_train_batch_size": pick["micro_batch_size"]}
        trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=lm_data(32),
                          data_collator=lm_collator(), compute_loss_func=loss_func)
        return train(trainer, "causal")

    for config, weighing in ((config, config_plan.normalisation(architecture.empty_model(config))),
                             (gpt2, config_plan.normalisation(architecture.empty_model(gpt2)))):
        assert weighing["kind"] == "causal_lm" and "num_items_in_batch" in weighing["trainer"]
        assert weighing["loss_normalization"] == "exact" and "/ window_items" in weighing["loop"]
        verdict, truth = run(config, weighing)
        assert verdict.gradient == V.EXACT and verdict.ok, verdict.line
        assert truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=1e-5)
        assert len(set(verdict.items)) > 1  # micro-batches of unequal tokens: a weighting by micro-batch would show
    stock, stock_truth = run(gpt2, weighing, advice_followed=False)  # the loss_type the advice sets is what counts
    assert stock.gradient == V.MISCOUNTED and stock_truth["accumulated_vs_truth"]["ratio"] < 0.99, stock.line
