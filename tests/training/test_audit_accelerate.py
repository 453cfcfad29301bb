"""gradacc.audit on Accelerate loops written as accelerate's examples/by_feature/gradient_accumulation.py writes them,
with ``audit = audit_accelerate(accelerator, model, optimizer)`` one line before the loop: each verdict against the
independent truth, each cause's fix applied to the same loop, and the audited run bit-identical to one without it."""

import pytest
import torch

from audit_support import (K, accelerate_loop, bert, cls_data, lm_collator, lm_data, llama, padding_collator, qwen2)
from gradacc.training.audit import verdict as V
from gradacc.training.audit.vocabulary import LossKind


def bert_classifier():
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification(bert(num_labels=2))


def llama_lm():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(llama(0.1))


def matches_truth(verdict, truth):
    measured = truth["accumulated_vs_truth"]
    assert all(truth["replay_bitwise"])
    assert verdict.fit.scale == pytest.approx(measured["ratio"], rel=1e-4)
    assert verdict.fit.residual == pytest.approx(measured["residual"], rel=0.05, abs=1e-5)


@pytest.mark.parametrize("examples", [32, 16], ids=["two windows an epoch", "an epoch of exactly k batches"])
def test_the_recipe_is_exact_and_the_audited_run_is_bit_identical(examples):
    """No batch is fetched ahead: with an epoch of exactly k batches Accelerate still syncs at the window's end only
    ([F, F, F, T]), and the weights after two epochs equal those of the run without the audit."""
    verdict, truth, weights, syncs, losses = accelerate_loop(bert_classifier, cls_data(examples), padding_collator(),
                                                             kind="classification", epochs=2)
    _, _, plain_weights, plain_syncs, plain_losses = accelerate_loop(bert_classifier, cls_data(examples),
                                                                     padding_collator(), audited=False, epochs=2)
    matches_truth(verdict, truth)
    assert verdict.ok and verdict.gradient == V.EXACT, verdict.line
    assert verdict.check("scheduler").ok and verdict.check("clipping").ok
    assert syncs == plain_syncs and syncs[:K] == [False] * (K - 1) + [True]
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(weights, plain_weights, strict=True))


def test_mean_per_micro_batch_on_a_causal_lm_is_weighted_by_micro_batch_and_weighting_by_items_fixes_it():
    verdict, truth, *_ = accelerate_loop(llama_lm, lm_data(32), lm_collator(), kind="causal")
    matches_truth(verdict, truth)
    assert verdict.gradient == V.WEIGHTED, verdict.line
    assert verdict.weighted_fit.scale == pytest.approx(1, abs=1e-5) and verdict.weighted_fit.residual < 1e-5
    assert "summed over its items" in verdict.fix and "labels[:, 1:]" in verdict.fix

    def weighted_by_items(model, batch, output, accelerator):
        logits, target = output.logits[:, :-1], batch["labels"][:, 1:]
        kept = target != -100
        tokens = accelerator.__dict__.setdefault("tokens", [0])
        tokens[0] += int(kept.sum())
        return torch.nn.functional.cross_entropy(logits[kept], target[kept], reduction="sum")

    def by_the_window_items(model, accelerator):
        if accelerator.sync_gradients:  # the verdict's fix: the gradients × k ÷ the window's tokens
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(accelerator.gradient_accumulation_steps / accelerator.tokens[0])
            accelerator.tokens[0] = 0

    fixed, truth, *_ = accelerate_loop(llama_lm, lm_data(32), lm_collator(), kind="causal", body=weighted_by_items,
                                       before_step=by_the_window_items)
    matches_truth(fixed, truth)
    assert fixed.ok, fixed.line


@pytest.mark.parametrize("backward, cause", [("plain", V.K_TIMES), ("divided", V.DIVIDED_TWICE)])
def test_a_loss_back_propagated_without_or_twice_through_accelerates_division_is_named(backward, cause):
    verdict, truth, *_ = accelerate_loop(bert_classifier, cls_data(32), padding_collator(), kind="classification",
                                         backward=backward)
    matches_truth(verdict, truth)
    assert verdict.gradient == cause, verdict.line
    assert ("accelerator.backward(loss)" in verdict.fix) and ("drop your own ÷k" in verdict.fix) == (cause ==
                                                                                                  V.DIVIDED_TWICE)
    fixed, truth, *_ = accelerate_loop(bert_classifier, cls_data(32), padding_collator(), kind="classification")
    matches_truth(fixed, truth)
    assert fixed.ok, fixed.line


def test_a_short_window_divided_by_the_configured_k_is_named_and_rescaling_it_fixes_it():
    """k = 4, but the epoch holds 2 micro-batches: Accelerate steps at its end, each micro-batch ÷ 4 all the same."""
    verdict, truth, *_ = accelerate_loop(bert_classifier, cls_data(8), padding_collator(), kind="classification")
    matches_truth(verdict, truth)
    assert verdict.gradient == V.SHORT_WINDOW and verdict.micro_batches == 2, verdict.line
    assert verdict.fit.scale == pytest.approx(2 / K, rel=1e-5)

    seen = []

    def by_the_window_length(model, accelerator):
        seen.append(1)
        if accelerator.sync_gradients:  # the verdict's fix: the gradients × k ÷ the window's micro-batches
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(accelerator.gradient_accumulation_steps / len(seen))
            seen.clear()

    fixed, truth, *_ = accelerate_loop(bert_classifier, cls_data(8), padding_collator(), kind="classification",
                                       before_step=by_the_window_length)
    matches_truth(fixed, truth)
    assert fixed.ok, fixed.line


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler\.step\(\)` before")  # the user's mistake, as torch sees it
def test_clipping_and_the_scheduler_inside_the_window_are_named_and_the_recipe_fixes_both():
    verdict, *_ = accelerate_loop(bert_classifier, cls_data(32), padding_collator(), clip_every=True,
                                  scheduler_every=True)
    assert verdict.gradient == V.CLIPPED, verdict.line
    assert [c.after_micro_batch for c in verdict.clips] == [1, 2, 3, 4]
    assert verdict.check("scheduler").ok is False and "4×" in verdict.check("scheduler").detail
    assert "sync_gradients" in verdict.fix
    fixed, truth, *_ = accelerate_loop(bert_classifier, cls_data(32), padding_collator(), kind="classification")
    matches_truth(fixed, truth)
    assert fixed.ok and fixed.check("scheduler").ok, fixed.line


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_a_right_loop_is_exact_and_a_one_percent_scale_is_flagged(precision):
    """bf16 through Accelerate's mixed precision; fp16 through the loop's own autocast (CPU: no grad scaler).
    A right loop is exact; the same loop with its loss × 0.99 is 0.99× (the noise of the scale is measured)."""
    from transformers import Qwen2ForCausalLM

    options = dict(mixed_precision="bf16") if precision == "bf16" else dict(
        autocast=lambda: torch.autocast("cpu", dtype=torch.float16))
    data = lm_data(32, low=9, high=10)  # equal lengths: the recipe is exact in any precision

    def model():
        return Qwen2ForCausalLM(qwen2(0.1))

    verdict, *_ = accelerate_loop(model, data, lm_collator(), **options)
    assert verdict.precision == precision and verdict.ok, verdict.line
    scaled, *_ = accelerate_loop(model, data, lm_collator(), body=lambda m, b, output, a: output.loss * 0.99,
                                 **options)
    assert scaled.gradient == V.SCALED and scaled.fit.scale == pytest.approx(0.99, abs=scaled.fit.tolerance)
    assert scaled.fit.tolerance < 0.01, scaled.line


def test_k_1_is_audited_on_accelerate_too():
    verdict, truth, *_ = accelerate_loop(bert_classifier, cls_data(16), padding_collator(), kind="classification", k=1)
    matches_truth(verdict, truth)
    assert verdict.k == 1 and verdict.micro_batches == 1 and verdict.ok, verdict.line


def test_a_model_with_a_generator_of_its_own_is_not_judged_and_its_loss_without_labels_asks_for_loss_fn():
    class OwnNoise(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = bert_classifier()
            self.noise = torch.Generator().manual_seed(1)

        def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
            output = self.inner(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            output.logits = output.logits + torch.rand(output.logits.shape, generator=self.noise)
            return output

    verdict, *_ = accelerate_loop(OwnNoise, cls_data(16), padding_collator())
    assert not verdict.judged and "could not be replayed" in verdict.meaning, verdict.line

    def no_labels(model, batch, output, accelerator):
        return output.logits.logsumexp(-1).mean()

    unlabelled = [{k: v for k, v in e.items() if k != "labels"} for e in cls_data(16)]
    verdict, *_ = accelerate_loop(bert_classifier, unlabelled, padding_collator(), body=no_labels)
    assert not verdict.judged and "loss_fn" in verdict.meaning, verdict.line


def test_zero_grad_of_the_model_inside_the_window_is_named_and_the_prepared_optimizers_fixes_it():
    """model.zero_grad() runs every micro-batch (the prepared optimizer's zero_grad skips while accumulating)."""
    verdict, *_ = accelerate_loop(bert_classifier, cls_data(32), padding_collator(), zero_grad="model")
    assert verdict.gradient == V.ZEROED and "micro-batch 1, 2, 3 of 4" in verdict.meaning, verdict.line
    assert "after optimizer.step() only" in verdict.fix
    fixed, truth, *_ = accelerate_loop(bert_classifier, cls_data(32), padding_collator(), kind="classification")
    assert fixed.ok, fixed.line


def test_another_objective_is_named_so_and_given_as_loss_fn_it_is_exact():
    """Cross-entropy plus a penalty on the logits: no scale of the window's mean cross-entropy, nor of equally weighted
    micro-batches; the audit says so, and with the objective as loss_fn it is exact."""
    import torch.nn.functional as F

    def penalised(model, batch, output=None, accelerator=None):
        logits = output.logits if output is not None else model(**batch).logits
        return F.cross_entropy(logits, batch["labels"]) + logits.pow(2).mean()

    verdict, *_ = accelerate_loop(bert_classifier, cls_data(32), padding_collator(), body=penalised)
    assert verdict.gradient == V.OTHER_LOSS and "loss_fn" in verdict.fix, verdict.line
    fixed, *_ = accelerate_loop(bert_classifier, cls_data(32), padding_collator(), body=penalised,
                                loss_fn=lambda model, batch: penalised(model, batch))
    assert fixed.ok and fixed.kind == LossKind.USER_LOSS, fixed.line

