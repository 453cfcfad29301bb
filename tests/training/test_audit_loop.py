"""gradacc.audit on plain PyTorch loops (the seed's first approach, nanoGPT's), written as the PyTorch docs write them,
with ``audit = audit_loop(model, optimizer)`` one line before the loop: each verdict against the independent truth
(audit_truth.py: the window's mean loss from the logits, by hand), each fix the verdict names applied to the same
loop and then judged exact, and the audited run bit-identical to the same run without the line."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from audit_support import K, bert, cls_data, llama, lm_collator, lm_data, padding_collator
from audit_truth import Truth
from gradacc.training.audit import verdict as V
from nano_gpt import GPT, loss_fn as nano_loss_fn, nano_collate, nano_data


def bert_classifier():
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification(bert(num_labels=2))


def llama_lm():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(llama(0.1))


def plain_loop(model_fn, data, collate, *, kind=None, audited=True, body=None, loss_fn=None, zero_grad="window",
               clip_every=False, scheduler_every=False, autocast=None, scaler=None, windows=2):
    """A plain loop over ``windows`` windows of K micro-batches of 4 examples; returns (verdict, truth result, weights
    after the run, per-micro-batch losses).

    ``body(model, batch, window)``: the loss to back-propagate (default: the model's own ÷ k); ``zero_grad``:
    "window" (after optimizer.step()) or "every" (before each micro-batch, the classic slip); ``clip_every``:
    clipping after each backward; ``scheduler_every``: the scheduler stepped each micro-batch; ``autocast``: a
    context; ``scaler``: a GradScaler."""
    from torch.utils.data import DataLoader

    from gradacc.audit import audit_loop

    torch.manual_seed(0)
    model = model_fn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
    audit = audit_loop(model, optimizer, loss_fn=loss_fn) if audited else None  # the one added line
    truth = None
    if kind:
        truth = Truth(model, kind)
        truth.close_on(optimizer)
    loader = DataLoader(data, batch_size=4, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
    batches = list(loader)[:windows * K]
    losses = []
    model.train()
    for start in range(0, len(batches), K):
        window = batches[start:start + K]
        for batch in window:
            if zero_grad == "every":
                optimizer.zero_grad()
            with autocast() if autocast else contextlib.nullcontext():
                loss = body(model, batch, window) if body else model(**batch).loss / K
            (scaler.scale(loss) if scaler else loss).backward()
            losses.append(float(loss.detach()))
            if clip_every:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            if scheduler_every:
                scheduler.step()
        if scaler:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if not scheduler_every:
            scheduler.step()
        optimizer.zero_grad()
    if truth is not None:
        truth.close()
    weights = [p.detach().clone() for p in model.parameters()]
    return (audit.verdict if audit else None), (truth.result if truth else None), weights, losses


def matches_truth(verdict, truth):
    measured = truth["accumulated_vs_truth"]
    assert all(truth["replay_bitwise"])
    assert verdict.fit.scale == pytest.approx(measured["ratio"], rel=1e-4)
    assert verdict.fit.residual == pytest.approx(measured["residual"], rel=0.05, abs=1e-5)


def tokens_summed_over_the_window(model, batch, window):
    """The fix the audit names for a causal LM, as its line says: each micro-batch's loss summed over its tokens ÷
    the window's tokens, counted before the window's first backward."""
    window_items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in window)
    logits = model(**batch).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100,
                           reduction="sum") / window_items


def test_a_causal_lm_loss_divided_by_k_is_weighted_by_micro_batch_and_the_named_fix_makes_it_exact():
    """The seed's first approach, loss = model(**batch).loss / k, on texts of uneven lengths: each micro-batch's mean
    counted equally, against the truth; the fix the verdict names, applied as its line says, is exact, and the
    audited run's weights equal the run's without the audit."""
    verdict, truth, *_ = plain_loop(llama_lm, lm_data(32), lm_collator(), kind="causal")
    matches_truth(verdict, truth)
    assert verdict.who == "loop" and verdict.k == K and verdict.gradient == V.WEIGHTED, verdict.line
    assert verdict.weighted_fit.scale == pytest.approx(1, abs=1e-5)
    assert "reduction='sum') / window_items" in verdict.fix and "labels[:, 1:]" in verdict.fix
    fixed, fixed_truth, weights, losses = plain_loop(llama_lm, lm_data(32), lm_collator(), kind="causal",
                                                     body=tokens_summed_over_the_window)
    assert fixed.ok and fixed.gradient == V.EXACT, fixed.line
    assert fixed_truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=1e-6)
    assert fixed.check("clipping").ok and fixed.check("scheduler").ok
    _, _, plain_weights, plain_losses = plain_loop(llama_lm, lm_data(32), lm_collator(), audited=False,
                                                   body=tokens_summed_over_the_window)
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(weights, plain_weights, strict=True))


def test_a_classifier_loss_not_divided_by_k_is_k_times_too_large_and_dividing_by_k_fixes_it():
    verdict, truth, *_ = plain_loop(bert_classifier, cls_data(32), padding_collator(), kind="classification",
                                    body=lambda model, batch, window: model(**batch).loss)
    matches_truth(verdict, truth)
    assert verdict.gradient == V.K_TIMES and verdict.fit.scale == pytest.approx(K, rel=1e-4), verdict.line
    assert "(loss / k).backward()" in verdict.fix
    fixed, fixed_truth, *_ = plain_loop(bert_classifier, cls_data(32), padding_collator(), kind="classification")
    assert fixed.ok and fixed.gradient == V.EXACT, fixed.line
    assert fixed_truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=1e-6)


def nano_mean_over_k(model, batch, window):
    x, y = batch
    _, loss = model(x, y)
    return loss / K


def nano_summed_over_the_window(model, batch, window):
    x, y = batch
    logits, _ = model(x, y)
    window_items = sum(int((t != -1).sum()) for _, t in window)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum") / window_items


def test_nanogpt_needs_a_loss_fn_and_with_it_is_judged_against_the_truth():
    """nanoGPT's model(x, y) -> (logits, loss): no labels for the audit to compute a loss from, so one line says what
    it needs instead of a verdict; given loss_fn -> (summed loss, items), its ÷k on padded sequences is weighted by
    micro-batch (as the truth measures), and the fix, each micro-batch's summed loss ÷ the window's tokens, is exact."""
    verdict, *_ = plain_loop(GPT, nano_data(32), nano_collate, body=nano_mean_over_k)
    assert not verdict.judged and "loss_fn=lambda model, batch" in verdict.meaning, verdict.line
    verdict, truth, *_ = plain_loop(GPT, nano_data(32), nano_collate, kind="targets", body=nano_mean_over_k,
                                    loss_fn=nano_loss_fn)
    matches_truth(verdict, truth)
    assert verdict.gradient == V.WEIGHTED and "your loss_fn" in verdict.fix, verdict.line
    assert verdict.window_items == truth["window_items"]
    fixed, fixed_truth, *_ = plain_loop(GPT, nano_data(32), nano_collate, kind="targets",
                                        body=nano_summed_over_the_window, loss_fn=nano_loss_fn)
    assert fixed.ok and fixed.gradient == V.EXACT, fixed.line
    assert fixed_truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=1e-6)


def test_zero_grad_clipping_and_the_scheduler_inside_the_window_are_each_named_with_the_loops_own_fix():
    zeroed, truth, *_ = plain_loop(bert_classifier, cls_data(32), padding_collator(), kind="classification",
                                   zero_grad="every")
    assert zeroed.gradient == V.ZEROED and "zero_grad() right after optimizer.step()" in zeroed.fix, zeroed.line
    assert truth["accumulated_vs_truth"]["ratio"] < 0.5  # the truth agrees: most of the window is gone
    clipped, *_ = plain_loop(bert_classifier, cls_data(32), padding_collator(), clip_every=True)
    assert clipped.gradient == V.CLIPPED and clipped.fix.startswith("clip once per window"), clipped.line
    assert clipped.check("clipping").ok is False
    scheduled, *_ = plain_loop(bert_classifier, cls_data(32), padding_collator(), scheduler_every=True)
    assert scheduled.gradient == V.EXACT and scheduled.check("scheduler").ok is False, scheduled.line
    assert "right after optimizer.step()" in scheduled.check("scheduler").fix


def test_bf16_autocast_with_a_grad_scaler_is_exact_and_the_run_unchanged():
    def run(audited):
        return plain_loop(bert_classifier, cls_data(32), padding_collator(), kind="classification" if audited else None,
                          audited=audited, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16),
                          scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))

    verdict, truth, weights, losses = run(True)
    assert verdict.precision == "bf16" and verdict.ok and verdict.gradient == V.EXACT, verdict.line
    assert truth["accumulated_vs_truth"]["ratio"] == pytest.approx(1, abs=2e-3)
    _, _, plain_weights, plain_losses = run(False)
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(weights, plain_weights, strict=True))


def test_a_loop_that_never_steps_is_not_judged_and_says_so():
    from gradacc.audit import audit_loop

    model = bert_classifier()
    audit = audit_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    batch = padding_collator()(cls_data(4))
    model(**batch).loss.backward()
    assert audit.verdict is None  # still watching
    verdict = audit.finish()
    assert not verdict.judged and verdict.meaning == ("the loop ran 1 forward of the model with gradients on and "
                                                      "optimizer.step() never ran")


def test_the_audit_leaves_nothing_installed_when_it_ends():
    """Hooks on the model, the optimizer's step and zero_grad, clipping and the scheduler's step: each put back as it
    was once the verdict is read, so the rest of the run is the user's code alone."""
    from torch.optim.lr_scheduler import LRScheduler

    from gradacc.audit import audit_loop

    model = bert_classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = (dict(model._forward_pre_hooks), dict(model._forward_hooks), vars(optimizer).get("step"),
              torch.nn.utils.clip_grad_norm_, LRScheduler.step)
    audit = audit_loop(model, optimizer)
    batch = padding_collator()(cls_data(4))
    model(**batch).loss.backward()
    optimizer.step()
    assert audit.verdict.judged
    after = (dict(model._forward_pre_hooks), dict(model._forward_hooks), vars(optimizer).get("step"),
             torch.nn.utils.clip_grad_norm_, LRScheduler.step)
    assert after == before and "zero_grad" not in vars(optimizer) and "zero_grad" not in vars(model)
