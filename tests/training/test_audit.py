"""gradacc.audit on fresh Trainer scripts (tiny BERT, Llama, Qwen2 and GPT-2, dropout on), each verdict against the
truth computed independently (audit_truth.py: the logits by hand, each micro-batch's random state replayed); every
cause in the catalogue with its fix applied to the same script, after which the audit says exact."""

import pytest
import torch

from audit_support import (K, bert, cls_data, gpt2, llama, lm_collator, lm_data, padding_collator, qwen2,
                           tokenizer, train, trainer_args)
from gradacc.training.audit import verdict as V
from gradacc.training.audit.vocabulary import LossKind


def run_trainer(model, kind, data, collator, *, loss_func=None, trainer_class=None, **args):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    trainer = (trainer_class or Trainer)(model=model, args=TrainingArguments(**trainer_args(**args)),
                                         train_dataset=data, data_collator=collator, compute_loss_func=loss_func)
    return train(trainer, kind)


def agrees_with_truth(verdict, truth, rel=1e-4):
    """The audit's scale and residual are the truth's (both measure the gradient before its last clipping)."""
    measured = truth["accumulated_vs_truth"]
    assert all(truth["replay_bitwise"]), truth["replay_bitwise"]
    assert verdict.fit.scale == pytest.approx(measured["ratio"], rel=rel, abs=1e-6)
    assert verdict.fit.residual == pytest.approx(measured["residual"], rel=0.05, abs=2e-3 if verdict.precision
                                                 != "fp32" else 1e-5)


def classifier(num_labels=2, **extra):
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(bert(num_labels=num_labels, **extra))


def test_bert_classifier_is_k_times_too_large_and_token_mean_loss_makes_it_exact():
    from gradacc.audit import token_mean_loss

    verdict, truth = run_trainer(classifier(), "classification", cls_data(), padding_collator())
    agrees_with_truth(verdict, truth)
    assert verdict.gradient == V.K_TIMES and verdict.fit.scale == pytest.approx(K, rel=1e-5)
    assert "#47688" in verdict.meaning and "gradacc.audit.classifier_mean_loss" in verdict.fix
    assert verdict.check("logged_loss").ok is False and "the gradient's own cause" in verdict.check("logged_loss").detail
    fixed, truth = run_trainer(classifier(), "classification", cls_data(), padding_collator(), loss_func=token_mean_loss)
    agrees_with_truth(fixed, truth)
    assert fixed.ok and fixed.gradient == V.EXACT, fixed.line
    assert fixed.check("logged_loss").ok and fixed.check("scheduler").ok and fixed.check("clipping").ok


def test_a_regression_head_gets_a_squared_error_fix_never_a_cross_entropy_one():
    from gradacc.audit import regression_mean_loss

    verdict, truth = run_trainer(classifier(num_labels=1), "regression", cls_data(regression=True), padding_collator())
    agrees_with_truth(verdict, truth)
    assert verdict.gradient == V.K_TIMES and verdict.kind == LossKind.REGRESSION
    assert "regression_mean_loss" in verdict.fix and "token_mean_loss" not in verdict.fix
    fixed, truth = run_trainer(classifier(num_labels=1), "regression", cls_data(regression=True), padding_collator(),
                               loss_func=regression_mean_loss)
    agrees_with_truth(fixed, truth)
    assert fixed.ok, fixed.line


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_causal_lms_with_attention_dropout_are_exact_no_false_alarm(family):
    """Llama and Qwen2 draw their dropout inside attention (functional / SDPA dropout_p), not in nn.Dropout: each
    micro-batch is replayed from its own random state all the same."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama(0.1)) if family == "llama" else Qwen2ForCausalLM(qwen2(0.1))
    verdict, truth = run_trainer(model, "causal", lm_data(), lm_collator())
    agrees_with_truth(verdict, truth)
    assert truth["accumulated_vs_truth"]["rel_error"] < 1e-5
    assert verdict.ok and verdict.gradient == V.EXACT, verdict.line
    assert len(set(verdict.items)) > 1  # micro-batches of unequal tokens: an equal weighting would show


def test_a_correct_bf16_run_is_exact_and_a_one_percent_miscount_in_bf16_is_flagged():
    """GPT-2 on texts of 70-96 tokens: Trainer counts every label, the loss the tokens after the first: 0.988×.
    In bf16 the scale's noise is measured from the residual; the miscount stands out, the fixed run is exact."""
    from transformers import GPT2LMHeadModel

    long_texts = lm_data(count=16, seed=7, low=70, high=97)
    torch.manual_seed(0)
    verdict, truth = run_trainer(GPT2LMHeadModel(gpt2()), "causal", long_texts, lm_collator(), bf16=True)
    assert verdict.precision == "bf16"
    assert verdict.gradient == V.MISCOUNTED, verdict.line
    assert verdict.fit.scale == pytest.approx(verdict.window_items / verdict.counted_items, abs=verdict.fit.tolerance)
    assert abs(verdict.fit.scale - 1) >= 0.01 > verdict.fit.tolerance
    assert truth["accumulated_vs_truth"]["ratio"] == pytest.approx(verdict.fit.scale, abs=2e-3)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(gpt2())
    model.loss_type = "ForCausalLM"  # the fix the verdict names
    assert 'loss_type = "ForCausalLM"' in verdict.fix
    fixed, truth = run_trainer(model, "causal", long_texts, lm_collator(), bf16=True)
    assert fixed.ok and fixed.gradient == V.EXACT, fixed.line
    assert truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=2e-3)


def test_gpt2_items_miscounted_with_the_measured_ratio_also_at_k_1():
    """k = 1 is audited too: Trainer's miscount does not need accumulation."""
    from transformers import GPT2LMHeadModel

    for k in (4, 1):
        torch.manual_seed(0)
        verdict, truth = run_trainer(GPT2LMHeadModel(gpt2()), "causal", lm_data(), lm_collator(), k=k)
        agrees_with_truth(verdict, truth)
        assert verdict.k == k and verdict.micro_batches == k
        assert verdict.gradient == V.MISCOUNTED and verdict.counted_items > verdict.window_items
        assert f"num_items_in_batch = {verdict.counted_items:g}" in verdict.meaning


def test_a_token_classifier_weighted_by_micro_batch_is_named_so_and_token_mean_loss_fixes_it():
    from transformers import BertForTokenClassification, DataCollatorForTokenClassification

    from gradacc.audit import token_mean_loss

    tok = tokenizer()
    data = [{**tok(t), "labels": [i % 3] * len(tok(t)["input_ids"])} for i, t in enumerate(
        __import__("audit_support").texts(48, 2))]

    def model():
        torch.manual_seed(0)
        return BertForTokenClassification(bert(num_labels=3))

    collator = DataCollatorForTokenClassification(tok)
    verdict, truth = run_trainer(model(), "token", data, collator)
    agrees_with_truth(verdict, truth)
    assert verdict.gradient == V.WEIGHTED, verdict.line
    assert verdict.weighted_fit.plain_scale and verdict.weighted_fit.scale == pytest.approx(K, rel=1e-4)
    assert "token_mean_loss" in verdict.fix
    fixed, truth = run_trainer(model(), "token", data, collator, loss_func=token_mean_loss)
    agrees_with_truth(fixed, truth)
    assert fixed.ok, fixed.line


def clipping_trainer(max_norm=0.05):
    from transformers import Trainer

    class ClipEachMicroBatch(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            return loss

    return ClipEachMicroBatch


def test_clipping_inside_the_window_is_named_with_what_it_did_and_moving_it_fixes_it():
    from gradacc.audit import regression_mean_loss

    verdict, _ = run_trainer(classifier(num_labels=1), None, cls_data(regression=True), padding_collator(),
                             loss_func=regression_mean_loss, trainer_class=clipping_trainer())
    assert verdict.gradient == V.CLIPPED, verdict.line
    early = [c for c in verdict.clips if c.after_micro_batch < verdict.micro_batches]
    assert [c.after_micro_batch for c in early] == [1, 2, 3] and all(c.norm_after < c.norm_before for c in early)
    assert "max_grad_norm" in verdict.fix and verdict.check("clipping").ok is False
    fixed, truth = run_trainer(classifier(num_labels=1), "regression", cls_data(regression=True), padding_collator(),
                               loss_func=regression_mean_loss, max_grad_norm=0.05)
    agrees_with_truth(fixed, truth)
    assert fixed.ok and fixed.clips[0].norm_after == pytest.approx(0.05, rel=1e-4), fixed.line


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler\.step\(\)` before")  # the user's mistake, as torch sees it
def test_zero_grad_and_a_scheduler_stepped_inside_the_window_are_named():
    from transformers import Trainer

    from gradacc.audit import token_mean_loss

    class Misplaced(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            model.zero_grad()  # wipes the micro-batches before this one
            self.lr_scheduler.step()
            return super().training_step(model, inputs, num_items_in_batch)

    verdict, _ = run_trainer(classifier(), None, cls_data(), padding_collator(), loss_func=token_mean_loss,
                             trainer_class=Misplaced)
    assert verdict.gradient == V.ZEROED and "micro-batch 1, 2, 3 of 4" in verdict.meaning, verdict.line
    assert verdict.check("scheduler").ok is False and "5×" in verdict.check("scheduler").detail
    assert "remove zero_grad from Misplaced.training_step" in verdict.fix
    fixed, _ = run_trainer(classifier(), None, cls_data(), padding_collator(), loss_func=token_mean_loss)
    assert fixed.ok and fixed.check("scheduler").ok, fixed.line


def test_a_peft_classifier_under_plain_trainer_is_k_times_and_fixed_the_same_way():
    """transformers #47688 through PEFT: LoRA on a BERT classifier, plain Trainer."""
    from peft import LoraConfig, get_peft_model

    from gradacc.audit import token_mean_loss

    def model():
        return get_peft_model(classifier(), LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, lora_dropout=0.1,
                                                       target_modules=["query", "value"]))

    verdict, truth = run_trainer(model(), "classification", cls_data(), padding_collator())
    agrees_with_truth(verdict, truth)
    assert verdict.gradient == V.K_TIMES and verdict.model == "BertForSequenceClassification (PEFT)"
    fixed, truth = run_trainer(model(), "classification", cls_data(), padding_collator(), loss_func=token_mean_loss)
    agrees_with_truth(fixed, truth)
    assert fixed.ok, fixed.line


def test_a_compute_loss_func_of_ones_own_that_ignores_num_items_is_told_so_in_its_words():
    import torch.nn.functional as F

    def mean_loss(outputs, labels, num_items_in_batch=None):
        return F.cross_entropy(outputs.logits, labels)

    def summed_over_window(outputs, labels, num_items_in_batch=None):
        return F.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch

    verdict, truth = run_trainer(classifier(), "classification", cls_data(), padding_collator(), loss_func=mean_loss)
    agrees_with_truth(verdict, truth)
    assert verdict.gradient == V.K_TIMES and "your compute_loss_func" in verdict.meaning
    assert "num_items_in_batch" in verdict.fix and "gradacc.audit" not in verdict.fix
    fixed, _ = run_trainer(classifier(), None, cls_data(), padding_collator(), loss_func=summed_over_window)
    assert fixed.ok, fixed.line


def test_a_compute_loss_that_divides_by_k_on_top_of_num_items_is_k_times_too_small_and_told_not_to():
    from transformers import Trainer

    from gradacc.audit import token_mean_loss

    class DividedAgain(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss / self.args.gradient_accumulation_steps  # "accumulation needs ÷ k"

    verdict, truth = run_trainer(classifier(), "classification", cls_data(), padding_collator(),
                                 loss_func=token_mean_loss, trainer_class=DividedAgain)
    agrees_with_truth(verdict, truth)
    assert verdict.gradient == V.DIVIDED_TWICE and "remove the ÷k from DividedAgain.compute_loss" in verdict.fix
    fixed, _ = run_trainer(classifier(), None, cls_data(), padding_collator(), loss_func=token_mean_loss)
    assert fixed.ok, fixed.line


def test_a_model_whose_randomness_cannot_be_replayed_is_not_judged_in_one_line():
    """Noise from a generator of the model's own: the replay cannot give the same output, and the audit says so."""
    from transformers import BertForSequenceClassification

    class OwnNoise(BertForSequenceClassification):
        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            output.logits = output.logits + torch.rand(output.logits.shape, generator=self.noise)
            return output

    torch.manual_seed(0)
    model = OwnNoise(bert(num_labels=2))
    model.noise = torch.Generator().manual_seed(1)
    verdict, _ = run_trainer(model, None, cls_data(), padding_collator(), remove_unused_columns=False)
    assert verdict.gradient == V.NOT_JUDGED and not verdict.judged and not verdict.ok
    assert "could not be replayed" in verdict.line and "\n" not in verdict.line


def test_the_audited_run_goes_on_bit_identical_to_a_run_without_it():
    """Dropout on (functional attention dropout), 3 optimizer steps: the same logged losses and final weights."""
    from transformers import LlamaForCausalLM, PrinterCallback, Trainer, TrainingArguments

    from gradacc.audit import audit_trainer

    def run(audited):
        torch.manual_seed(0)
        trainer = Trainer(model=LlamaForCausalLM(llama(0.1)), args=TrainingArguments(**trainer_args(steps=3)),
                          train_dataset=lm_data(), data_collator=lm_collator())
        trainer.remove_callback(PrinterCallback)
        audit = audit_trainer(trainer) if audited else None
        trainer.train()
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        return audit, losses, [p.detach().clone() for p in trainer.model.parameters()], trainer

    audit, audited_losses, audited_weights, trainer = run(True)
    _, plain_losses, plain_weights, _ = run(False)
    assert audit.verdict.ok, audit.verdict.line
    assert len(audited_losses) == 3 and audited_losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(audited_weights, plain_weights, strict=True))
    entries = [e for e in trainer.state.log_history if "gradacc_audit" in e]
    assert len(entries) == 1 and entries[0]["gradacc_audit"]["line"] == audit.verdict.line


def test_the_verdict_is_an_immutable_value_with_its_json_form(tmp_path):
    import dataclasses
    import json

    from transformers import Trainer, TrainingArguments

    from gradacc.audit import Verdict, audit_trainer

    torch.manual_seed(0)
    trainer = Trainer(model=classifier(), args=TrainingArguments(**trainer_args()), train_dataset=cls_data(),
                      data_collator=padding_collator())
    audit = audit_trainer(trainer, json_path=tmp_path / "verdict.json")
    trainer.train()
    assert isinstance(audit.verdict, Verdict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        audit.verdict.gradient = V.EXACT
    written = json.loads((tmp_path / "verdict.json").read_text())
    assert written["gradient"] == V.K_TIMES and written["line"] == audit.verdict.line and written["ok"] is False
