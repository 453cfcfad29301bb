"""gradacc.audit on TRL: SFTTrainer on a causal LM with and without a LoRA adapter, padded and packed, and on GPT-2
(Trainer's miscount, with its fix); DPOTrainer on a tiny pair set. Each verdict against the independent truth
(audit_truth.py): the loss by hand from the replayed logits (for DPO, -logsigmoid(β·margin) with the reference
log-probs from the recorded no-grad forwards, replayed the same way)."""

import pytest
import torch

from audit_support import dpo_trainer, gpt2, qwen2, texts, tokenizer, train, trainer_args
from gradacc.training.audit import verdict as V
from gradacc.training.audit.vocabulary import LossKind


def sft(model, *, packing=False, lora=False):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(**trainer_args(), packing=packing, max_length=32, bf16=False, gradient_checkpointing=False)
    peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, task_type="CAUSAL_LM",
                             target_modules=["c_attn"] if "GPT2" in type(model).__name__ else ["q_proj", "v_proj"]) \
        if lora else None
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": texts(48)}),
                         processing_class=tokenizer(), peft_config=peft_config)
    return train(trainer, "causal")


def agrees_with_truth(verdict, truth):
    measured = truth["accumulated_vs_truth"]
    assert all(truth["replay_bitwise"]), truth["replay_bitwise"]
    assert verdict.fit.scale == pytest.approx(measured["ratio"], rel=1e-4)
    assert verdict.fit.residual == pytest.approx(measured["residual"], rel=0.05, abs=1e-5)


@pytest.mark.parametrize("packing, lora", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["padded", "packed", "padded LoRA", "packed LoRA"])
def test_sft_trainer_on_qwen2_with_attention_dropout_is_exact(packing, lora):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    verdict, truth = sft(Qwen2ForCausalLM(qwen2(0.1)), packing=packing, lora=lora)
    agrees_with_truth(verdict, truth)
    assert truth["accumulated_vs_truth"]["rel_error"] < 1e-5
    assert verdict.ok and verdict.gradient == V.EXACT, verdict.line
    assert verdict.kind == LossKind.FUSED_CAUSAL and verdict.model.startswith("Qwen2ForCausalLM")


def test_sft_trainer_on_gpt2_counts_every_label_and_the_loss_type_fix_makes_it_exact():
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    verdict, truth = sft(GPT2LMHeadModel(gpt2()))
    agrees_with_truth(verdict, truth)
    assert verdict.gradient == V.MISCOUNTED and verdict.fit.scale < 0.95, verdict.line
    assert 'model.loss_type = "ForCausalLM"' in verdict.fix
    torch.manual_seed(0)
    model = GPT2LMHeadModel(gpt2())
    model.loss_type = "ForCausalLM"
    fixed, truth = sft(model)
    agrees_with_truth(fixed, truth)
    assert fixed.ok, fixed.line


def test_dpo_trainer_on_a_tiny_pair_set_is_exact(tmp_path):
    """DPO's loss is its trainer's own (no labels in the batch): the audit replays its compute_loss, the policy's
    forward and the reference's, from the micro-batch's random state; each pair counts once. The model is a saved
    folder, as DPOTrainer loads its reference model from the policy's name."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    trainer = dpo_trainer(Qwen2ForCausalLM(qwen2(0.1)), tmp_path / "policy")
    verdict, truth = train(trainer, "dpo", ref_model=trainer.ref_model, beta=trainer.args.beta)
    agrees_with_truth(verdict, truth)
    assert verdict.ok and verdict.gradient == V.EXACT, verdict.line
    assert verdict.kind == LossKind.DPO and verdict.micro_batches == 2 and verdict.items == (2, 2)  # pairs
