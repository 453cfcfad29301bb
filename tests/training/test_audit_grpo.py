"""gradacc.audit on TRL's GRPOTrainer: a user's GRPO script (audit_scripts/train_grpo.py, from TRL's quickstart) with
``audit_trainer``, each verdict against the truth computed another way: the bench's float64 replay (a float64 copy
of the weights, the whole window's documented objective at once, autograd), and by hand from the stored token
counts. An exact loss type (grpo, with the default clipping and with β > 0 off-policy), bnpo (its documented local
mean: "varies with the micro-batch by design"), dapo at steps_per_generation = 2k (scaled by the generation's token
count, the next step's scale the rest of it) and with the fix the audit names (exact), and a setting outside the
audit's objectives (not judged)."""

import importlib.util

import pytest
import torch

from gradacc.audit import audit_trainer
from gradacc.bench.grpo import StepJudge
from gradacc.training.audit import verdict as V
from gradacc.training.audit.vocabulary import LossKind
from support import ROOT

SPEC = importlib.util.spec_from_file_location("train_grpo", ROOT / "tests/training/audit_scripts/train_grpo.py")
script = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(script)


def audited(loss_type, k=2, steps_per_generation=None, steps=1, **extra):
    """The user's trainer with the audit, and the truth beside it: the bench's StepJudge, fed the inputs of each
    micro-batch's loss. (verdict, the truth's steps, the micro-batches' recorded inputs)."""
    from transformers import PrinterCallback

    trainer = script.trainer(loss_type, k, steps_per_generation, steps=steps, **extra)
    trainer.remove_callback(PrinterCallback)
    trainer.recorded, compute = [], trainer._compute_loss
    seen = []

    def recording(model, inputs):
        kept = {key: value.detach().clone() for key, value in inputs.items() if torch.is_tensor(value)}
        trainer.recorded.append(kept)
        seen.append(kept)
        return compute(model, inputs)

    trainer._compute_loss = recording
    truth = StepJudge(trainer, loss_type, script.tiny_qwen2())
    trainer.add_callback(truth)
    audit = audit_trainer(trainer)
    trainer.train()
    return audit.verdict, truth.steps, seen


def test_grpo_is_exact_with_the_default_clipping_judged_before_it():
    """max_grad_norm=1.0 (GRPOConfig's default) clips the step: the truth measures the clipped gradient at
    min(1, 1/‖t‖) of its window's, the audit judges it before clipping, as the window made it: exact."""
    verdict, truth, _ = audited("grpo")
    [step] = truth
    assert step["scale"] == pytest.approx(min(1.0, 1.0 / step["truth_norm"]), rel=1e-4) and step["residual"] < 1e-4
    assert verdict.kind == LossKind.GRPO and verdict.gradient == V.EXACT and verdict.ok, verdict.line
    assert abs(verdict.fit.scale - 1) < 1e-4 and verdict.fit.residual < 1e-4
    assert "grpo is accumulation-invariant by design" in verdict.meaning
    assert verdict.check("clipping").ok and "after micro-batch 2" in verdict.check("clipping").detail


def test_bnpo_varies_with_the_micro_batch_by_design_and_is_no_problem():
    verdict, truth, _ = audited("bnpo", max_grad_norm=0.0)
    [step] = truth
    assert step["verdict"] == "exact"  # the step is bnpo's documented local mean...
    versus = step["vs_window_token_mean"]  # ...which is not the window's token mean
    assert versus["residual"] > 1e-2
    assert verdict.gradient == V.BY_DESIGN and verdict.ok and not verdict.problems, verdict.line
    assert verdict.line.startswith("gradacc audit (trainer, Qwen2ForCausalLM): varies with the micro-batch by "
                                   "design — ")
    assert f"the step is {versus['scale']:.4g}× (residual {versus['residual']:.2g})" in verdict.meaning
    assert "Not a bug" in verdict.meaning and verdict.fix is None


def test_dapo_two_windows_per_generation_is_scaled_by_the_generation_and_the_named_fix_makes_it_exact():
    """steps_per_generation = 2k: one generation feeds two steps, the second off-policy (its ratios ≠ 1). The
    first step's scale is the window's tokens ÷ (the generation's × k/spg), by hand; the second (the truth's) is
    the rest of the generation's tokens, as the verdict says."""
    verdict, truth, seen = audited("dapo", k=2, steps_per_generation=4, steps=2, max_grad_norm=0.0)
    first, second = truth
    window_tokens = sum(int(inputs["completion_mask"].sum()) for inputs in seen[:2])
    generation_tokens = int(seen[0]["num_items_in_batch"])
    by_hand = window_tokens / (generation_tokens * 2 / 4)
    assert by_hand != pytest.approx(1, abs=1e-3), "the generation's tokens fell evenly: nothing to tell apart"
    assert first["scale"] == pytest.approx(by_hand, rel=1e-5) and second["scale"] == pytest.approx(2 - by_hand,
                                                                                                    rel=1e-5)
    assert verdict.gradient == V.GENERATION_COUNT and not verdict.ok, verdict.line
    assert verdict.fit.scale == pytest.approx(first["scale"], rel=1e-5) and verdict.fit.residual < 1e-4
    assert f"the step is {by_hand:.4g}×" in verdict.meaning
    assert f"the generation's other window then gets {2 - by_hand:.4g}×" in verdict.meaning
    assert verdict.fix == "GRPOConfig(steps_per_generation=2) (= gradient_accumulation_steps)"

    fixed, truth, _ = audited("dapo", k=2, steps_per_generation=2, max_grad_norm=0.0)
    assert truth[0]["verdict"] == "exact"
    assert fixed.gradient == V.EXACT and fixed.ok, fixed.line
    assert "dapo is accumulation-invariant only while steps_per_generation = gradient_accumulation_steps" in \
        fixed.meaning


def test_in_bf16_the_audit_judges_within_bf16s_noise():
    """bf16=True (autocast on the CPU): the replay runs under the micro-batch's own autocast; dapo at spg = 2k is
    still named, at the count ratio within bf16's rounding, as the float64 truth measures it."""
    verdict, truth, seen = audited("dapo", k=2, steps_per_generation=4, bf16=True, max_grad_norm=0.0)
    by_hand = sum(int(inputs["completion_mask"].sum()) for inputs in seen[:2]) / (int(seen[0]["num_items_in_batch"])
                                                                                / 2)
    assert verdict.precision == "bf16" and verdict.gradient == V.GENERATION_COUNT, verdict.line
    assert verdict.fit.scale == pytest.approx(by_hand, abs=2e-3) and truth[0]["scale"] == pytest.approx(by_hand,
                                                                                                         abs=2e-3)
    assert verdict.fit.residual < 1e-2 and truth[0]["residual"] < 1e-2


def test_dapo_with_a_generation_per_micro_batch_weights_each_by_its_own_count():
    """steps_per_generation < k: each micro-batch is its own generation, divided by its own tokens × k: no scale of
    the window's objective (the truth's residual), and the audit names the generation count."""
    verdict, truth, seen = audited("dapo", k=2, steps_per_generation=1, max_grad_norm=0.0)
    counts = [int(inputs["num_items_in_batch"]) for inputs in seen]
    assert counts == [int(inputs["completion_mask"].sum()) for inputs in seen] and counts[0] != counts[1]
    assert truth[0]["verdict"] == "differs"
    assert verdict.gradient == V.GENERATION_COUNT and not verdict.ok, verdict.line
    assert verdict.fit.residual == pytest.approx(truth[0]["residual"], rel=1e-3)
    assert "each micro-batch's tokens are weighted by its own generation batch's count" in verdict.meaning
    assert f"each generation batch's own token count ({counts[0]}, {counts[1]})" in verdict.meaning


def test_grpo_with_a_kl_term_off_policy_is_exact():
    """β > 0 (the KL to a saved reference, × the importance ratio by default) at steps_per_generation = 2k: the
    stored old and reference log-probs are in the audit's objective."""
    verdict, truth, seen = audited("grpo", k=1, steps_per_generation=2, beta=0.04, max_grad_norm=0.0)
    assert "ref_per_token_logps" in seen[0] and "old_per_token_logps" in seen[0]
    assert truth[0]["verdict"] == "exact"
    assert verdict.gradient == V.EXACT and verdict.ok, verdict.line


def test_settings_outside_the_documented_objectives_are_not_judged_with_the_reason():
    verdict, _, _ = audited("grpo", k=1, num_iterations=2)
    assert not verdict.judged and not verdict.ok
    assert verdict.line.startswith("gradacc audit (trainer, Qwen2ForCausalLM): not judged — GRPOTrainer, "
                                   "num_iterations=2: each generation is trained on more than once")


def test_a_window_whose_rewards_all_tie_is_not_judged(monkeypatch):
    """Every advantage 0: the objective has no gradient to compare with, and the verdict says why."""
    monkeypatch.setattr(script, "reward_len", lambda completions, **kwargs: [1.0] * len(completions))
    verdict, truth, _ = audited("grpo", max_grad_norm=0.0)
    assert truth[0]["verdict"] == "no signal"
    assert not verdict.judged and "every advantage 0" in verdict.meaning, verdict.line


def test_the_audited_run_is_bit_identical_to_the_run_without_it():
    """The audit's replays restore every random state and write no gradient: two steps of one generation (the second
    off-policy) end on the same weights, bit for bit."""
    from transformers import PrinterCallback

    def weights(audit: bool) -> torch.Tensor:
        trainer = script.trainer("dapo", 2, 4, steps=2, max_grad_norm=0.0)
        trainer.remove_callback(PrinterCallback)
        if audit:
            audit_trainer(trainer)
        trainer.train()
        return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])

    assert torch.equal(weights(True), weights(False))
