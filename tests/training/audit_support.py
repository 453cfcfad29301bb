"""Tiny models of four families, a word-level tokenizer, texts of uneven lengths, and scripts written as a user would
write them from the 🤗 docs (Trainer, an Accelerate loop, TRL's SFTTrainer and DPOTrainer, PEFT), each run with
gradacc's audit and the independent truth (audit_truth.py) side by side. Everything is built locally, in seconds."""

from __future__ import annotations

import contextlib
import tempfile

import torch

from gradacc.bench.words import VOCAB, WORDS, tokenizer

K = 4


def texts(count=48, seed=0, low=3, high=14):
    """``count`` texts of ``low`` to ``high`` - 1 words: uneven lengths, so micro-batches hold unequal tokens."""
    generator = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (low + (i * 7) % (high - low),),
                                                      generator=generator).tolist()) for i in range(count)]


SMALL = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=3)


def llama(dropout=0.1, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, max_position_embeddings=128, attention_dropout=dropout, **SMALL, **extra)


def qwen2(dropout=0.1, **extra):
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, max_position_embeddings=128, attention_dropout=dropout, **SMALL, **extra)


def gpt2(dropout=0.1, **extra):
    from transformers import GPT2Config

    return GPT2Config(n_positions=128, n_embd=16, n_layer=1, n_head=2, resid_pdrop=dropout, embd_pdrop=dropout,
                      attn_pdrop=dropout, **SMALL, **extra)


def bert(dropout=0.1, **extra):
    from transformers import BertConfig

    return BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                      max_position_embeddings=128, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                      vocab_size=VOCAB, pad_token_id=0, **extra)


def whole_router_term(grpo_trainer):
    """``grpo_trainer`` (TRL's GRPOTrainer) as TRL wrote it before it divided the router term by the accumulation
    steps: each micro-batch adds router_aux_loss_coef · aux_loss whole (its aux_loss × k here, which TRL's ÷ k brings
    back to whole)."""
    class WholeRouterTerm(grpo_trainer):
        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if aux_loss is not None and self.model.training:
                aux_loss = aux_loss * self.current_gradient_accumulation_steps
            return logps, entropies, aux_loss

    return WholeRouterTerm


def mixtral(coefficient):
    from transformers import MixtralConfig

    return MixtralConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=128, num_local_experts=4,
                         num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=coefficient,
                         num_labels=2, **SMALL)


def lm_data(count=48, seed=0, low=3, high=14):
    tok = tokenizer()
    return [{"input_ids": tok(t)["input_ids"]} for t in texts(count, seed, low, high)]


def cls_data(count=48, regression=False):
    tok = tokenizer()
    return [{**tok(t), "labels": float(i % 5) / 4 if regression else i % 2} for i, t in enumerate(texts(count, 1))]


def lm_collator():
    from transformers import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(tokenizer=tokenizer(), mlm=False)


def padding_collator():
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer=tokenizer())


# Trainer's output_dir: the runs save nothing (save_strategy "no"), so one folder serves them all, removed at exit.
OUTPUT_DIR = tempfile.TemporaryDirectory(prefix="gradacc-audit-test-")


def trainer_args(k=K, steps=1, **extra) -> dict:
    """TrainingArguments' (and TRL configs') keywords for a short CPU run: m = 4, k micro-batches per step."""
    return dict(output_dir=OUTPUT_DIR.name, per_device_train_batch_size=4,
                gradient_accumulation_steps=k, max_steps=steps, report_to="none", use_cpu=True, logging_steps=1,
                save_strategy="no", disable_tqdm=True, **extra)


def train(trainer, kind: str | None, ref_model=None, beta=0.1, label_smoothing=0.0, router=None):
    """``trainer.train()`` with the truth (when ``kind`` is given) and gradacc's audit; (verdict, truth result)."""
    from transformers import PrinterCallback

    from gradacc.audit import audit_trainer
    from audit_truth import Truth

    trainer.remove_callback(PrinterCallback)
    truth = None
    if kind:
        truth = Truth(trainer.model, kind, ref_model=ref_model, beta=beta, label_smoothing=label_smoothing,
                      router=router)
        truth.close_on(trainer)  # before the audit's callback: the window ends before the audit replays it
    audit = audit_trainer(trainer)
    try:
        trainer.train()
    finally:
        if truth is not None:
            truth.close()
    return audit.verdict, truth.result if truth else None


def pairs(count=16):
    """``count`` tiny preference pairs of uneven lengths (prompt, chosen, rejected)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": texts(count, seed=3, low=2, high=6),
                              "chosen": texts(count, seed=4, low=2, high=7),
                              "rejected": texts(count, seed=5, low=2, high=8)})


def dpo_trainer(model, folder, data=None, trainer_class=None, **config):
    """A DPOTrainer (k = 2, 2 pairs a micro-batch, fp32, no checkpointing) on ``data`` (default: 16 pairs), its
    policy ``model`` saved in ``folder`` first and loaded from there: DPOTrainer loads its reference model from the
    policy's name."""
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(**{**trainer_args(k=2), "per_device_train_batch_size": 2, **config}, bf16=False,
                     gradient_checkpointing=False, max_length=32)
    if not (folder / "config.json").exists():
        model.save_pretrained(folder)
    return (trainer_class or DPOTrainer)(model=type(model).from_pretrained(folder), args=args,
                                         train_dataset=pairs() if data is None else data,
                                         processing_class=tokenizer())


def reset_accelerate():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def accelerate_loop(model_fn, data, collate, *, kind=None, k=K, epochs=1, audited=True, backward="accelerator",
                    mixed_precision="no", clip_every=False, scheduler_every=False, body=None, autocast=None,
                    before_step=None, loss_fn=None, zero_grad="optimizer"):
    """accelerate's examples/by_feature/gradient_accumulation.py loop on a tiny model, with the audit one line before
    it; returns (verdict, truth result, weights after the run, sync pattern, per-micro-batch losses).

    ``body(model, batch, output, accelerator)``: the loss to back-propagate (default: the model's own);
    ``before_step(model, accelerator)``: the loop's own lines before its clipping and ``optimizer.step()``;
    ``loss_fn``: given to the audit; ``zero_grad``: "optimizer" (the prepared one) or "model" (``model.zero_grad()``)."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup

    from gradacc.audit import audit_accelerate
    from audit_truth import Truth

    reset_accelerate()
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision, gradient_accumulation_steps=k)
    model = model_fn()
    loader = DataLoader(data, shuffle=True, collate_fn=collate, batch_size=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=100)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    audit = audit_accelerate(accelerator, model, optimizer, loss_fn=loss_fn) if audited else None  # the one added line
    truth = None
    if kind:
        truth = Truth(accelerator.unwrap_model(model), kind)
        truth.close_on(optimizer, when=lambda: accelerator.sync_gradients)
    syncs, losses = [], []
    for _ in range(epochs):
        model.train()
        for batch in loader:
            with accelerator.accumulate(model):
                with autocast() if autocast else contextlib.nullcontext():
                    output = model(**batch)
                loss = body(model, batch, output, accelerator) if body else output.loss
                if backward == "plain":
                    loss.backward()
                else:
                    accelerator.backward(loss / k if backward == "divided" else loss)
                syncs.append(accelerator.sync_gradients)
                losses.append(float(loss.detach()))
                if before_step:
                    before_step(accelerator.unwrap_model(model), accelerator)
                if clip_every:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                elif accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if scheduler_every:
                    scheduler.scheduler.step()  # the torch scheduler itself, every micro-batch
                else:
                    scheduler.step()
                (model if zero_grad == "model" else optimizer).zero_grad()
    if truth is not None:
        truth.close()
    weights = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    return (audit.verdict if audit else None), (truth.result if truth else None), weights, syncs, losses
