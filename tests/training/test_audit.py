"""gradacc.audit on a user's own training: a real Trainer with the callback, hand-written Accelerate loops,
the command line, and the README's example (run as written)."""

import contextlib
import json
import re
import tempfile

import pytest
import torch

from gradacc.cli import main
from support import ROOT

K = 4


def bert_config(dropout: float = 0.0, num_labels: int = 2):
    from transformers import BertConfig

    return BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                      max_position_embeddings=32, num_labels=num_labels, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout)


def sentences(count: int = 32, token_labels: bool = False) -> list[dict]:
    """Sentences of uneven lengths (2 to 12 tokens): token-level micro-batches hold different numbers of items."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        length = 2 + (i * 7) % 11
        ids = torch.randint(1, 64, (length,), generator=generator)
        labels = torch.randint(0, 3, (length,), generator=generator) if token_labels else torch.tensor(i % 2)
        out.append({"input_ids": ids, "labels": labels})
    return out


def collate(examples: list[dict]) -> dict:
    width = max(len(e["input_ids"]) for e in examples)
    pad = lambda t, value: torch.nn.functional.pad(t, (0, width - len(t)), value=value)  # noqa: E731
    batch = {"input_ids": torch.stack([pad(e["input_ids"], 0) for e in examples]),
             "attention_mask": torch.stack([pad(torch.ones_like(e["input_ids"]), 0) for e in examples])}
    labels = [e["labels"] for e in examples]
    batch["labels"] = torch.stack([pad(l, -100) for l in labels]) if labels[0].dim() else torch.stack(labels)
    return batch


def train_with_trainer(*, audit=None, dropout=0.0, loss_func=None, token_labels=False, steps=2, max_grad_norm=1.0):
    """A stock Trainer on a tiny BERT; returns (trainer, loss logged at each step)."""
    from transformers import (BertForSequenceClassification, BertForTokenClassification, PrinterCallback, Trainer,
                              TrainingArguments)

    torch.manual_seed(0)
    head = BertForTokenClassification if token_labels else BertForSequenceClassification
    model = head(bert_config(dropout, num_labels=3 if token_labels else 2))
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, gradient_accumulation_steps=K,
                             max_steps=steps, logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
                             save_strategy="no", max_grad_norm=max_grad_norm)
    trainer = Trainer(model=model, args=args, train_dataset=sentences(token_labels=token_labels), data_collator=collate,
                      compute_loss_func=loss_func)
    trainer.remove_callback(PrinterCallback)
    if audit is not None:
        trainer.add_callback(audit)
    trainer.train()
    return trainer, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_trainer_default_on_bert_is_k_times_too_large_and_the_audit_says_so_with_the_fix(tmp_path):
    from gradacc.audit import AccumulationAudit

    audit = AccumulationAudit(json_path=tmp_path / "audit.json")
    trainer, _ = train_with_trainer(audit=audit)
    report = audit.report
    assert report["gradient"] == "k× too large"
    assert report["rel_error"] == pytest.approx(K - 1, rel=1e-4)
    assert report["reference"] == "one pass over the window"
    assert "#47688" in report["meaning"] and "token_mean_loss" in report["fix"]
    assert report["checks"]["logged_loss"]["ratio"] == pytest.approx(K, rel=1e-4)
    assert report["checks"]["scheduler"] == {"steps": 1, "expected": 1, "ok": True}
    assert report["checks"]["clipping"] == {"micro_batches_clipped_after": [K], "ok": True}
    assert not report["ok"]
    entries = [e for e in trainer.state.log_history if "gradacc_audit" in e]
    assert len(entries) == 1 and entries[0]["step"] == 1 and entries[0]["gradacc_audit"]["line"] == report["line"]
    assert json.loads((tmp_path / "audit.json").read_text())["rel_error"] == pytest.approx(report["rel_error"])


def test_token_mean_loss_makes_a_token_level_head_exact():
    """Token labels on sentences of uneven lengths: each micro-batch weighted by its tokens, one pass."""
    from gradacc.audit import AccumulationAudit, token_mean_loss

    audit = AccumulationAudit()
    train_with_trainer(audit=audit, loss_func=token_mean_loss, token_labels=True)
    report = audit.report
    assert report["ok"], report["line"]
    assert report["gradient"] == "exact" and report["rel_error"] <= 1e-5
    assert report["reference"] == "one pass over the window"
    assert report["checks"]["logged_loss"]["ratio"] == pytest.approx(1, abs=1e-5)


def test_trainer_default_on_a_token_head_is_named_as_weighting_not_a_scale():
    from gradacc.audit import AccumulationAudit

    audit = AccumulationAudit()
    train_with_trainer(audit=audit, token_labels=True)
    assert audit.report["gradient"] == "weighted by micro-batch, not by item", audit.report["line"]
    assert audit.report["residual"] > 0.02


def test_the_run_after_the_audit_is_bit_identical_to_a_run_without_it():
    """Dropout on: the audit replays the window's random state, and puts every state back after."""
    from gradacc.audit import AccumulationAudit

    audit = AccumulationAudit()
    audited, audited_losses = train_with_trainer(audit=audit, dropout=0.1, steps=3)
    plain, plain_losses = train_with_trainer(dropout=0.1, steps=3)
    assert audit.report["reference"].startswith("replayed per micro-batch")
    assert audit.report["gradient"] == "k× too large"  # the run's own dropout masks: the scale is measured exactly
    assert audit.report["rel_error"] == pytest.approx(K - 1, rel=1e-4)
    assert len(audited_losses) == 3 and audited_losses == plain_losses
    for (name, a), (_, b) in zip(audited.model.named_parameters(), plain.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


# ---- a hand-written Accelerate loop ----------------------------------------------------------------------

def accelerate_loop(*, k=2, batches=4, scheduler_per_micro_batch=False, clip_per_micro_batch=False,
                    prepared_loader=False, backward="accelerator"):
    """The user's loop, as people write it; returns the audit of its first window."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from transformers import BertForSequenceClassification

    from gradacc.audit import audit_accelerate

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    torch.manual_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=k, cpu=True)
    model = BertForSequenceClassification(bert_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    loader = torch.utils.data.DataLoader(sentences(4 * batches), batch_size=4, collate_fn=collate)
    if prepared_loader:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # the scheduler left unprepared
    else:
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    window = list(loader)[:k]
    with audit_accelerate(accelerator, model, optimizer, window, lr_scheduler=scheduler) as audit:
        for batch in (loader if prepared_loader else window):
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                if backward == "plain":  # without Accelerate's ÷k
                    loss.backward()
                else:  # "divided": ÷k by hand, and Accelerate's ÷k again
                    accelerator.backward(loss / k if backward == "divided" else loss)
                if clip_per_micro_batch:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                elif accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if scheduler_per_micro_batch or accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad()
    return audit.report


def test_a_correct_accelerate_loop_is_exact():
    report = accelerate_loop()
    assert report["ok"], report["line"]
    assert report["rel_error"] <= 1e-5
    assert report["checks"]["scheduler"]["steps"] == 1 and report["checks"]["clipping"]["ok"]


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler\.step\(\)` before")  # the user's mistake, as torch sees it
def test_a_scheduler_stepped_and_clipping_run_per_micro_batch_are_each_named():
    report = accelerate_loop(k=4, scheduler_per_micro_batch=True, clip_per_micro_batch=True, prepared_loader=True)
    assert report["checks"]["scheduler"] == {"steps": 4, "expected": 1, "ok": False}
    assert report["checks"]["clipping"]["micro_batches_clipped_after"] == [1, 2, 3, 4]
    assert any(p.startswith("scheduler stepped 4×") for p in report["problems"])
    assert any(p.startswith("clipping ran 4×") for p in report["problems"])


@pytest.mark.parametrize("backward, named, error", [("plain", "k× too large", 1.0),
                                                    ("divided", "k× too small", 0.5)])
def test_a_loss_back_propagated_without_or_twice_through_accelerates_division_is_named(backward, named, error):
    report = accelerate_loop(backward=backward)
    assert report["gradient"] == named, report["line"]
    assert report["rel_error"] == pytest.approx(error, rel=1e-4) and report["fix"]


def test_a_short_first_window_divided_by_the_configured_k_is_named():
    """One micro-batch in the dataloader, k=2: Accelerate steps at its end, ÷ 2 all the same."""
    report = accelerate_loop(k=2, batches=1, prepared_loader=True)
    assert report["gradient"] == "short window ÷ configured k", report["line"]
    assert report["micro_batches"] == 1 and report["rel_error"] == pytest.approx(0.5, rel=1e-4)


# ---- the command line and the README -------------------------------------------------------------------

def test_cli_audits_a_stock_trainer_on_a_saved_model_and_refuses_bad_input_in_the_flags_words(capsys, tmp_path):
    from transformers import BertForSequenceClassification

    from gradacc.training.sources.models import tiny_bert_tokenizer

    tokenizer = tiny_bert_tokenizer()
    config = bert_config(dropout=0.1)
    config.vocab_size = tokenizer.vocab_size
    BertForSequenceClassification(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    assert main(["audit", "--model", str(tmp_path / "model"), "-m", "4", "-k", "3", "--max-seq-length", "32",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gradient"] == "k× too large" and report["rel_error"] == pytest.approx(2, rel=1e-4)
    assert main(["audit", "--model", str(tmp_path / "model"), "-k", "2", "--max-seq-length", "32"]) == 0
    assert capsys.readouterr().out.startswith("gradacc audit: gradient k× too large")
    assert main(["audit", "--model", "tiny-bert", "-k", "1"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --grad-accum-steps must be at least 2")
    assert main(["audit", "--model", str(tmp_path / "missing"), "-k", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model") and len(err.splitlines()) == 1


def test_cli_finds_a_causal_lm_exact_its_tokens_counted_from_the_second(capsys):
    """tiny-gpt on texts of uneven lengths: GPT-2's own loss divides by num_items_in_batch (shifted labels)."""
    assert main(["audit", "--model", "tiny-gpt", "-m", "4", "-k", "3", "--max-seq-length", "32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["rel_error"] <= 1e-5, report["line"]
    assert report["checks"]["logged_loss"]["ratio"] == pytest.approx(1, abs=1e-5)


@pytest.mark.parametrize("loss_type", [None, "ForCausalLM"])
def test_gpt2_on_a_stock_trainer_is_found_dividing_by_every_label_until_its_loss_type_is_named(loss_type):
    """GPT2LMHeadModel's loss predicts from the second token, but its loss_type is None, so Trainer 5.24 counts
    num_items_in_batch over every label: the step is (predicted ÷ labelled tokens) of the right one. Naming the
    loss type fixes it. Dropout on: the reference replays each micro-batch, weighted by its predicted tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainingArguments

    from gradacc.audit import AccumulationAudit

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2))
    if loss_type:
        model.loss_type = loss_type
    examples = [{"input_ids": e["input_ids"], "labels": e["input_ids"]} for e in sentences()]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, gradient_accumulation_steps=K,
                             max_steps=1, report_to="none", use_cpu=True, disable_tqdm=True, save_strategy="no",
                             train_sampling_strategy="sequential")  # the first window: the first 16 texts
    audit = AccumulationAudit()
    trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=collate, callbacks=[audit])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    report = audit.report
    assert report["reference"].startswith("replayed per micro-batch")
    if loss_type:
        assert report["ok"] and report["rel_error"] <= 1e-5, report["line"]
        return
    labelled = sum(len(e["input_ids"]) for e in examples[:4 * K])
    predicted = labelled - 4 * K  # each text's first token predicts nothing
    assert report["gradient"] == "items miscounted", report["line"]
    assert report["scale"] == pytest.approx(predicted / labelled, rel=1e-4)
    assert f"num_items_in_batch = {labelled}" in report["meaning"] and 'loss_type = "ForCausalLM"' in report["fix"]


def test_readme_example_runs_as_written(capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Audit your own training", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    # Trainer prints its own log dicts too (PrinterCallback); the example's two lines are the rest.
    printed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("{")]
    assert printed == ["k× too large 3.0", "exact 0.0"]


def test_a_window_that_does_not_fit_in_memory_falls_back_to_per_micro_batch_sums():
    """The one-pass reference runs out of memory (a loss_fn that refuses more than a micro-batch, as a device
    would): the audit sums the correctly weighted micro-batches instead, with the same verdict."""
    from gradacc.audit import AccumulationAudit

    def small_batches_only(model, batch):
        if len(batch["input_ids"]) > 4:
            raise torch.OutOfMemoryError("the window does not fit")
        return model(**batch).loss

    audit = AccumulationAudit(loss_fn=small_batches_only)
    train_with_trainer(audit=audit)
    assert audit.report["reference"] == "per micro-batch (the whole window did not fit in memory)"
    assert audit.report["gradient"] == "k× too large"
    assert audit.report["rel_error"] == pytest.approx(K - 1, rel=1e-4)


def test_an_audited_accelerate_loop_goes_on_bit_identical_to_one_without_the_audit():
    """Dropout on, 3 windows of k=2: the same loss at every micro-batch and the same weights at the end."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from transformers import BertForSequenceClassification

    from gradacc.audit import audit_accelerate

    def loop(audited: bool):
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        torch.manual_seed(0)
        accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
        model = BertForSequenceClassification(bert_config(dropout=0.1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, optimizer = accelerator.prepare(model, optimizer)
        batches = [collate(sentences(24)[i:i + 4]) for i in range(0, 24, 4)]
        audit = audit_accelerate(accelerator, model, optimizer, batches[:2]) if audited else contextlib.nullcontext()
        losses = []
        for index, window in enumerate((batches[:2], batches[2:4], batches[4:])):
            with audit if index == 0 else contextlib.nullcontext():  # around the first window only
                for batch in window:
                    with accelerator.accumulate(model):
                        loss = model(**batch).loss
                        accelerator.backward(loss)
                        losses.append(loss.item())
                        optimizer.step()
                        optimizer.zero_grad()
        return losses, [p.detach().clone() for p in model.parameters()], audit

    audited_losses, audited_weights, audit = loop(True)
    plain_losses, plain_weights, _ = loop(False)
    assert audit.report["ok"] and audit.report["reference"].startswith("replayed"), audit.report["line"]
    assert audited_losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(audited_weights, plain_weights, strict=True))
