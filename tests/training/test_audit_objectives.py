"""gradacc.audit against a reference of its own, on Trainer scripts written as users write them: a subclass whose
compute_loss is the common pattern (``return outputs.loss``) or hides a factor, DPO's loss computed by the audit from
the policy's and the reference's log-probabilities (a ``loss * k`` inside a DPOTrainer subclass is seen), label
smoothing by hand, and objectives the audit does not know (GRPO, a loss that is not the model's) never judged as the
model's cross-entropy. Each verdict against the independent truth (audit_truth.py), each fix applied and judged."""

import functools

import pytest
import torch

from audit_support import cls_data, dpo_trainer, llama, lm_collator, lm_data, pairs, padding_collator, qwen2, texts, \
    tokenizer, train, trainer_args
from gradacc.training.audit import verdict as V
from gradacc.training.audit.vocabulary import LossKind
from test_audit import agrees_with_truth, classifier, run_trainer


def llama_lm():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(llama(0.1))


def test_a_compute_loss_returning_outputs_loss_is_told_to_pass_num_items_in_batch_and_that_fix_is_exact():
    """The common override on a causal LM: Trainer, seeing a model that takes loss kwargs, does not divide by k, and
    the override never hands the model num_items_in_batch. The fix names the override and the argument; settings
    the override ignores (compute_loss_func, loss_type) are never offered."""
    from transformers import Trainer

    class MyTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    class Fixed(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs, num_items_in_batch=num_items_in_batch)  # the fix the verdict names
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    verdict, truth = run_trainer(llama_lm(), "causal", lm_data(), lm_collator(), trainer_class=MyTrainer)
    agrees_with_truth(verdict, truth)
    assert verdict.gradient == V.WEIGHTED, verdict.line
    assert verdict.fix.startswith("in MyTrainer.compute_loss, pass num_items_in_batch to the model")
    assert "compute_loss_func" not in verdict.fix and "loss_type" not in verdict.fix
    fixed, fixed_truth = run_trainer(llama_lm(), "causal", lm_data(), lm_collator(), trainer_class=Fixed)
    assert fixed.ok and fixed.gradient == V.EXACT, fixed.line
    assert fixed_truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=1e-6)


def test_a_compute_loss_that_is_not_the_models_loss_is_not_judged_as_if_it_were():
    from transformers import Trainer

    class Contrastive(Trainer):  # an objective of the user's own, on the same batches
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            logits = model(**inputs).logits
            return logits.pow(2).mean() + 0.1 * logits.std()

    verdict, _ = run_trainer(classifier(), None, cls_data(), padding_collator(), trainer_class=Contrastive)
    assert not verdict.judged, verdict.line
    assert verdict.meaning.startswith("the loss Contrastive.compute_loss returns is not the model's own classifier "
                                      "loss") and "loss_fn=" in verdict.meaning


def dpo(tmp_path, data, trainer_class=None, **config):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    trainer = dpo_trainer(Qwen2ForCausalLM(qwen2(0.1)), tmp_path / "policy", data, trainer_class, **config)
    return train(trainer, "dpo", ref_model=trainer.ref_model, beta=trainer.args.beta)


def test_a_factor_inside_a_dpo_trainers_compute_loss_is_seen_against_dpos_loss_computed_by_the_audit(tmp_path):
    """Replaying the trainer's own compute_loss would call this 'exact'; the audit computes DPO's loss itself."""
    from trl import DPOTrainer

    class Scaled(DPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch) * \
                self.args.gradient_accumulation_steps

    verdict, truth = dpo(tmp_path, pairs(16), trainer_class=Scaled)
    agrees_with_truth(verdict, truth)
    assert verdict.kind == LossKind.DPO and verdict.gradient == V.K_TIMES, verdict.line
    assert verdict.fix.startswith("remove the factor of k from Scaled.compute_loss")
    assert verdict.reference == ""  # computed by the audit, not replayed
    fixed, _ = dpo(tmp_path, pairs(16))
    assert fixed.ok, fixed.line


def test_dpo_with_a_short_micro_batch_is_told_what_does_fix_it_and_that_fix_is_exact(tmp_path):
    """3 pairs at 2 a micro-batch and k = 2: the window holds micro-batches of 2 and 1 pairs, each pair-mean counted
    equally (DPOTrainer's compute_loss gets no num_items_in_batch). No setting reweights it; dropping it does."""
    verdict, truth = dpo(tmp_path, pairs(3))
    agrees_with_truth(verdict, truth)
    assert verdict.items == (2, 1) and verdict.gradient == V.WEIGHTED, verdict.line
    assert "dataloader_drop_last=True" in verdict.fix and "loss_is_scaled_for_ga" not in verdict.fix
    fixed, fixed_truth = dpo(tmp_path, pairs(3), dataloader_drop_last=True)
    assert fixed.ok and fixed.items == (2,), fixed.line
    assert fixed_truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=1e-6)


def test_label_smoothing_is_computed_by_hand_and_a_compute_loss_func_that_drops_it_is_said():
    """Trainer's default on BERT with label_smoothing_factor is exact (its label smoother divides by
    num_items_in_batch): against the smoothed loss written out by hand, as the truth measures, no false alarm.
    compute_loss_func=token_mean_loss drops the smoothing (Trainer checks compute_loss_func first): said, with the
    partial that keeps it, which is then judged exact with the smoothing kept."""
    from gradacc.audit import token_mean_loss

    epsilon = 0.1

    def run(loss_func):
        from transformers import Trainer, TrainingArguments

        torch.manual_seed(0)
        trainer = Trainer(model=classifier(), args=TrainingArguments(**trainer_args(label_smoothing_factor=epsilon)),
                          train_dataset=cls_data(), data_collator=padding_collator(), compute_loss_func=loss_func)
        return train(trainer, "classification", label_smoothing=epsilon)

    verdict, truth = run(None)
    agrees_with_truth(verdict, truth)
    assert verdict.ok and verdict.gradient == V.EXACT and verdict.reference == "", verdict.line
    dropped, _ = run(token_mean_loss)
    assert dropped.gradient == V.EXACT and not dropped.ok, dropped.line
    objective = dropped.check("objective")
    assert objective.ok is False and objective.detail.startswith("Trainer drops label smoothing when "
                                                                 "compute_loss_func is set")
    assert objective.fix == ("pass compute_loss_func=functools.partial(gradacc.audit.classifier_mean_loss, "
                             "label_smoothing=0.1)")
    kept, kept_truth = run(functools.partial(token_mean_loss, label_smoothing=epsilon))
    assert kept.ok and kept.check("objective").ok, kept.line
    assert kept_truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=1e-6)
    assert "your compute_loss_func, replayed: a constant factor inside it is not seen" in kept.line


def test_grpo_is_judged_against_its_own_objective_not_the_models_cross_entropy():
    """GRPO's gradient is its own surrogate's: judged against the model's cross-entropy it would read 'k× too
    large' on a correct run. The audit judges it against its loss_type's documented objective (the default dapo, at
    the default steps_per_generation = k: exact; tests/training/test_audit_grpo.py checks it against the truth)."""
    from datasets import Dataset
    from transformers import Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    args = GRPOConfig(**{**trainer_args(k=2), "per_device_train_batch_size": 4}, num_generations=4,
                      max_completion_length=6, bf16=False, gradient_checkpointing=False)
    trainer = GRPOTrainer(model=Qwen2ForCausalLM(qwen2(0.0)), args=args, processing_class=tokenizer(),
                          reward_funcs=lambda completions, **kwargs: [float(len(c)) for c in completions],
                          train_dataset=Dataset.from_dict({"prompt": texts(16, seed=7, low=2, high=5)}))
    verdict, _ = train(trainer, None)
    assert verdict.kind == LossKind.GRPO and verdict.gradient == V.EXACT and verdict.ok, verdict.line
    assert "the documented dapo objective" in verdict.meaning


def test_a_callback_added_the_usual_way_fails_at_construction_naming_audit_trainer():
    from gradacc.audit import AccumulationAudit

    with pytest.raises(TypeError) as raised:
        AccumulationAudit()
    assert str(raised.value).endswith("audit = gradacc.audit.audit_trainer(trainer)")
