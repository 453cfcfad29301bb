"""gradacc.audit on Lightning runs written as Lightning's docs write them (a LightningModule, ``Trainer(
accumulate_grad_batches=k)``), with ``callbacks=[AuditCallback()]``: each verdict against the independent truth
(audit_truth.py: the window's mean loss over its items, from the logits by hand in float64), each cause's fix applied
to the same module and judged exact, and the audited run bit-identical to one without the callback."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

L = pytest.importorskip("lightning", reason="gradacc.audit's Lightning tests need lightning (pip install "
                                            "gradacc[lightning], or requirements-dev.txt)")

from audit_support import K, lm_collator, lm_data, llama, mixtral  # noqa: E402 (after the skip: lightning is optional)
from audit_truth import Truth, router_loss_by_hand  # noqa: E402
from gradacc.training.audit import verdict as V  # noqa: E402
from gradacc.training.audit.vocabulary import Cause, CheckName, LossKind  # noqa: E402
from support import ROOT  # noqa: E402


# -- the user's scripts -------------------------------------------------------------------------------------------

class TokenLM(L.LightningModule):
    """A causal LM whose training_step takes the mean over the micro-batch's non-pad tokens (as one writes it from
    Lightning's docs): Lightning divides it by k, so each micro-batch's mean counts equally (Lightning #20350)."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM(llama(0.1))

    def training_step(self, batch, batch_idx):
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1),
                               ignore_index=-100)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3)


class TokenLMByItems(TokenLM):
    """The verdict's fix: each micro-batch's summed loss, counted tokens, and the gradients × k × processes ÷ the
    window's tokens over all processes in on_before_optimizer_step."""

    def __init__(self):
        super().__init__()
        self.window_tokens = 0

    def training_step(self, batch, batch_idx):
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        target = batch["labels"][:, 1:]
        self.window_tokens += int((target != -100).sum())
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                               reduction="sum")

    def on_before_optimizer_step(self, optimizer):
        tokens = self.trainer.strategy.reduce(torch.tensor(float(self.window_tokens), device=self.device),
                                              reduce_op="sum")
        for p in self.parameters():
            if p.grad is not None:
                p.grad.mul_(self.trainer.accumulate_grad_batches * self.trainer.world_size / tokens)
        self.window_tokens = 0


class LitHF(L.LightningModule):
    """Lightning's 🤗 recipe: ``forward(**batch)`` calls the model with its labels, ``training_step`` returns the
    model's own loss (a mean over the micro-batch's tokens)."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM(llama(0.1))

    def forward(self, **inputs):
        return self.model(**inputs)

    def training_step(self, batch, batch_idx):
        return self(**batch)[0]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3)


class LitMoE(LitHF):
    """Lightning's 🤗 recipe on a mixture of experts (a tiny Mixtral, router loss on): the model's loss holds its
    router term, coef · aux_loss, which Lightning divides by k with the rest."""

    def __init__(self):
        L.LightningModule.__init__(self)
        from transformers import MixtralForCausalLM

        self.model = MixtralForCausalLM(mixtral(ROUTER_COEFFICIENT))


class Classifier(L.LightningModule):
    """A plain classifier with a mean cross-entropy over the micro-batch's examples, called as ``self(x)``."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ByWindow:
    """The short window's fix, for any LightningModule it is mixed into: the gradients × k ÷ the window's
    micro-batches."""

    def __init__(self):
        super().__init__()
        self.seen = 0

    def training_step(self, batch, batch_idx):
        self.seen += 1
        return super().training_step(batch, batch_idx)

    def on_before_optimizer_step(self, optimizer):
        for p in self.parameters():
            if p.grad is not None:
                p.grad.mul_(self.trainer.accumulate_grad_batches / self.seen)
        self.seen = 0


class ClassifierByWindow(ByWindow, Classifier):
    """The short window's fix on the classifier."""


class LitMoEByWindow(ByWindow, LitMoE):
    """The short window's fix on the MoE module."""


class ClassifierDividedByK(Classifier):
    """Divides by k itself, as Lightning does already."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) / self.trainer.accumulate_grad_batches


class ClassifierTimesK(Classifier):
    """Multiplies by k, undoing Lightning's division."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * self.trainer.accumulate_grad_batches


class ClassifierZeroingEachStep(Classifier):
    """Zeroes the gradients at the start of every training_step, inside the window."""

    def training_step(self, batch, batch_idx):
        self.optimizers().zero_grad()
        return super().training_step(batch, batch_idx)


class ClassifierClippingEachBackward(Classifier):
    """Clips after every backward, inside the window."""

    def on_after_backward(self):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 0.01)


def summed_cross_entropy(model, batch):
    """The audit's loss_fn for the classifier: (the loss summed over the batch's examples, its examples)."""
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="sum"), len(y)


def classification_data(examples):
    generator = torch.Generator().manual_seed(3)
    return torch.utils.data.TensorDataset(torch.randn(examples, 8, generator=generator),
                                          torch.randint(0, 3, (examples,), generator=generator))


# -- running them -------------------------------------------------------------------------------------------------

class _CloseTruth(L.Callback):
    """The truth's side: labels handed to its records, its recording closed where the step's hooks begin (before
    the audit replays), and its reference computed after the module's own on_before_optimizer_step."""

    def __init__(self, truth, labels):
        self.truth, self.labels = truth, labels

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.truth.pending_labels = self.labels(batch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.truth.open = False


def run(module_cls, data, *, kind=None, labels=None, k=K, epochs=1, max_steps=-1, audited=True, collate=None,
        clip=1.0, router=None, **audit_options):
    """``Trainer(accumulate_grad_batches=k).fit`` on CPU; (verdict, truth result, weights after the run)."""
    from gradacc.audit import AuditCallback

    L.seed_everything(0, verbose=False)
    module = module_cls()
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, collate_fn=collate)
    audit = AuditCallback(**audit_options) if audited else None
    callbacks = [audit] if audit else []
    truth = None
    if kind:
        truth = Truth(getattr(module, "model", module), kind, router=router)
        truth._handles.pop().remove()  # Lightning steps with a closure: the truth is taken after the hooks instead
        callbacks.insert(0, _CloseTruth(truth, labels))
        clipping = module.configure_gradient_clipping

        def truth_then_clip(*args, **kwargs):  # after on_before_optimizer_step, before Lightning clips
            truth._on_step(None, (), {})
            return clipping(*args, **kwargs)

        module.configure_gradient_clipping = truth_then_clip
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, max_steps=max_steps,
                        accumulate_grad_batches=k, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=clip)
    trainer.fit(module, loader)
    if truth is not None:
        truth.close()
    weights = [p.detach().clone() for p in module.parameters()]
    return (audit.verdict if audit else None), (truth.result if truth else None), weights


def matches_truth(verdict, truth):
    measured = truth["accumulated_vs_truth"]
    assert all(truth["replay_bitwise"])
    assert verdict.fit.scale == pytest.approx(measured["ratio"], rel=1e-4)
    assert verdict.fit.residual == pytest.approx(measured["residual"], rel=0.05, abs=1e-5)


def lm_labels(batch):
    return batch["labels"]


def class_labels(batch):
    return batch[1]


# -- the tests ----------------------------------------------------------------------------------------------------

def test_a_token_mean_per_micro_batch_is_weighted_by_micro_batch_and_weighting_by_items_is_exact():
    verdict, truth, _ = run(TokenLM, lm_data(32), kind="causal", labels=lm_labels, collate=lm_collator(), max_steps=1)
    matches_truth(verdict, truth)
    assert verdict.who == "lightning" and verdict.gradient == V.WEIGHTED, verdict.line
    assert verdict.model == "LlamaForCausalLM" and verdict.micro_batches == K
    assert verdict.weighted_fit.scale == pytest.approx(1, abs=1e-5) and verdict.weighted_fit.residual < 1e-5
    assert "on_before_optimizer_step" in verdict.fix and "accumulate_grad_batches" in verdict.fix
    assert "labels[:, 1:]" in verdict.fix and "#20350" in verdict.fix

    fixed, truth, _ = run(TokenLMByItems, lm_data(32), kind="causal", labels=lm_labels, collate=lm_collator(),
                          max_steps=1)
    matches_truth(fixed, truth)
    assert fixed.ok and fixed.gradient == V.EXACT, fixed.line


def test_a_forward_that_calls_the_hf_model_with_labels_is_recorded_and_its_own_loss_is_judged():
    """training_step calls self(**batch): the LightningModule's forward is recorded; the loss's kind is found from
    the 🤗 model's own .loss (a causal LM's)."""
    verdict, truth, _ = run(LitHF, lm_data(32), kind="causal", labels=lm_labels, collate=lm_collator(), max_steps=1)
    matches_truth(verdict, truth)
    assert verdict.model == "LitHF" and verdict.kind == LossKind.CAUSAL and verdict.gradient == V.WEIGHTED, verdict.line


ROUTER_COEFFICIENT = 0.02


def moe_truth():
    return ROUTER_COEFFICIENT, lambda logits, mask: router_loss_by_hand(logits, 2, mask)


def test_an_moe_model_in_a_lightning_module_has_its_router_term_judged_against_the_truth():
    """The MoE model inside the LightningModule is found (its router loss's settings, its router weights): with
    micro-batches of equal tokens the step is the window's mean loss plus coef × the micro-batches' mean router loss
    (the truth by hand, router term included), and the audit says exact, the router term exact on the router weights;
    with uneven ones, Lightning's per-micro-batch weighting of the main loss (#20350), the router term still right,
    and a fix that says why weighting by items in training_step would not keep the router term."""
    even = lm_data(32, low=6, high=7)  # every text 6 words: every micro-batch the same tokens
    verdict, truth, _ = run(LitMoE, even, kind="causal", labels=lm_labels, collate=lm_collator(), max_steps=1,
                            router=moe_truth())
    measured = truth["accumulated_vs_truth"]
    assert all(truth["replay_bitwise"]) and measured["ratio"] == pytest.approx(1, abs=1e-5)
    assert measured["residual"] < 1e-5
    assert verdict.ok and verdict.gradient == V.EXACT and verdict.router.cause == V.EXACT, verdict.line

    verdict, truth, _ = run(LitMoE, lm_data(32), kind="causal", labels=lm_labels, collate=lm_collator(), max_steps=1,
                            router=moe_truth())
    assert truth["accumulated_vs_truth"]["residual"] > 0.01  # not the window's mean objective: as the audit says
    assert verdict.gradient == V.WEIGHTED and verdict.router.cause == V.EXACT, verdict.line
    assert verdict.weighted_fit.plain_scale and verdict.weighted_fit.near(1)
    assert verdict.check(CheckName.ROUTER_LOSS).ok
    assert verdict.fix.endswith("or keep Lightning's weighting knowingly") and "#20350" in verdict.fix


def test_an_moe_models_short_last_window_is_put_right_main_and_router_term_by_one_rescale():
    """20 examples at 4 a batch, k = 4: the epoch's last window holds 1 micro-batch, its main loss and its router term
    both divided by 4, 1/4 of the window's (j/k, by hand). The fix's first way (× k ÷ the window's micro-batches) is
    named for both, and applied to the same module it makes both exact; weighting by items is not offered alone."""
    even = lm_data(20, low=6, high=7)
    verdict, _, _ = run(LitMoE, even, collate=lm_collator(), window="last")
    assert verdict.gradient == V.SHORT_WINDOW and verdict.micro_batches == 1, verdict.line
    assert verdict.fit.scale == pytest.approx(1 / K, rel=1e-4)
    assert verdict.router.cause == Cause.ROUTER_SCALED and verdict.router.fit.scale == pytest.approx(1 / K, rel=1e-4)
    assert verdict.fix.endswith("take the first way: it puts the router term right too (weighting by items would "
                                "rescale it)")
    assert verdict.check(CheckName.ROUTER_LOSS).fix.startswith("the gradient's fix above, its first way")

    fixed, _, _ = run(LitMoEByWindow, even, collate=lm_collator(), window="last")
    assert fixed.ok and fixed.gradient == V.EXACT and fixed.router.cause == V.EXACT, fixed.line


def test_a_plain_classifier_with_equal_micro_batches_is_exact_and_the_audited_run_is_bit_identical():
    """Two epochs of two windows each; loss_fn gives the summed cross-entropy and the examples. The weights after the
    run equal those of the same run without the callback; the scheduler (interval "step") stepped once."""
    verdict, truth, weights = run(Classifier, classification_data(32), kind="classification", labels=class_labels,
                                  epochs=2, loss_fn=summed_cross_entropy)
    _, _, plain = run(Classifier, classification_data(32), epochs=2, audited=False)
    _, _, audited_alone = run(Classifier, classification_data(32), epochs=2, loss_fn=summed_cross_entropy)
    matches_truth(verdict, truth)
    assert verdict.ok and verdict.gradient == V.EXACT and verdict.kind == LossKind.USER_LOSS, verdict.line
    assert verdict.micro_batches == K and verdict.window_items == 4 * K
    assert verdict.check("scheduler").ok and verdict.check("last_window") is None
    assert all(torch.equal(a, b) for a, b in zip(weights, plain, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(audited_alone, plain, strict=True))


def test_an_epoch_shorter_than_k_is_a_short_window_divided_by_k_and_rescaling_it_is_exact():
    """Two batches an epoch, k = 4 (Lightning #21808, #19987): Lightning steps at the epoch's end, each ÷ 4."""
    verdict, truth, _ = run(Classifier, classification_data(8), kind="classification", labels=class_labels,
                            loss_fn=summed_cross_entropy)
    matches_truth(verdict, truth)
    assert verdict.gradient == V.SHORT_WINDOW and verdict.micro_batches == 2, verdict.line
    assert verdict.fit.scale == pytest.approx(2 / K, rel=1e-5)
    assert "#19987" in verdict.fix and "on_before_optimizer_step" in verdict.fix

    fixed, truth, _ = run(ClassifierByWindow, classification_data(8), kind="classification", labels=class_labels,
                          loss_fn=summed_cross_entropy)
    matches_truth(fixed, truth)
    assert fixed.ok, fixed.line


def test_the_epochs_short_last_window_is_named_when_asked_for():
    """Six batches an epoch, k = 4: the first window is exact and says its last window was not judged;
    window="last" judges the 2-batch window at the epoch's end: 2/4 of its mean-loss gradient."""
    first, *_ = run(Classifier, classification_data(24), loss_fn=summed_cross_entropy)
    assert first.ok and "window='last'" in first.check("last_window").detail, first.line
    last, *_ = run(Classifier, classification_data(24), loss_fn=summed_cross_entropy, window="last")
    assert last.gradient == V.SHORT_WINDOW and last.micro_batches == 2, last.line
    assert last.fit.scale == pytest.approx(2 / K, rel=1e-5)
    fixed, *_ = run(ClassifierByWindow, classification_data(24), loss_fn=summed_cross_entropy, window="last")
    assert fixed.ok and fixed.micro_batches == 2, fixed.line


@pytest.mark.parametrize("module_cls, cause, said", [
    (ClassifierDividedByK, V.DIVIDED_TWICE, "do not divide the loss by accumulate_grad_batches in training_step"),
    (ClassifierTimesK, V.K_TIMES, "return the micro-batch's mean loss from training_step as it is"),
    (ClassifierClippingEachBackward, V.CLIPPED, "Trainer(gradient_clip_val=...)"),
    (ClassifierZeroingEachStep, V.ZEROED, "remove zero_grad from training_step")],
    ids=["divided by k twice", "times k", "clipped after each backward", "zeroed in each training_step"])
def test_a_loss_scaled_by_k_clipped_or_zeroed_inside_the_window_is_named_with_lightnings_fix(module_cls, cause, said):
    verdict, truth, _ = run(module_cls, classification_data(32), kind="classification", labels=class_labels,
                            max_steps=1, loss_fn=summed_cross_entropy)
    assert verdict.gradient == cause and said in verdict.fix, verdict.line
    if cause in (V.DIVIDED_TWICE, V.K_TIMES):
        matches_truth(verdict, truth)
        assert verdict.fit.scale == pytest.approx(1 / K if cause == V.DIVIDED_TWICE else K, rel=1e-5)
        assert "Trainer" not in verdict.meaning and "accelerator" not in verdict.meaning, verdict.line
    elif cause == V.CLIPPED:
        assert [c.after_micro_batch for c in verdict.clips] == [1, 2, 3, 4]
        assert said in verdict.check("clipping").fix
    else:
        assert "after micro-batch 1, 2, 3 of 4" in verdict.meaning, verdict.line


def test_bf16_mixed_a_token_mean_is_still_weighted_by_micro_batch_and_the_fix_is_exact():
    def bf16(module_cls):
        L.seed_everything(0, verbose=False)
        audit = AuditCallback()
        trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", max_steps=1, accumulate_grad_batches=K,
                            callbacks=[audit], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.fit(module_cls(), torch.utils.data.DataLoader(lm_data(32), batch_size=4, shuffle=True,
                                                              collate_fn=lm_collator()))
        return audit.verdict

    from gradacc.audit import AuditCallback

    stock, fixed = bf16(TokenLM), bf16(TokenLMByItems)
    assert stock.precision == "bf16" and stock.gradient == V.WEIGHTED, stock.line
    assert fixed.precision == "bf16" and fixed.ok, fixed.line


def test_the_same_callback_audits_each_fit_it_is_given_to():
    from gradacc.audit import AuditCallback

    audit, verdicts = AuditCallback(loss_fn=summed_cross_entropy), []
    L.seed_everything(0, verbose=False)
    module = Classifier()
    for data in (classification_data(32), classification_data(8)):
        trainer = L.Trainer(accelerator="cpu", max_steps=1, accumulate_grad_batches=K, callbacks=[audit], logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
        verdicts.append(audit.verdict)
    assert [v.gradient for v in verdicts] == [V.EXACT, V.SHORT_WINDOW], [v.line for v in verdicts]


class ManualClassifier(Classifier):
    """Manual optimization: the loop is the module's own, Lightning divides nothing."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        self.manual_backward(F.cross_entropy(self(batch[0]), batch[1]))
        optimizer.step()
        optimizer.zero_grad()


def test_manual_optimization_is_not_watched_and_the_run_is_unchanged():
    """Lightning refuses k > 1 and its own clipping with manual optimization: k = 1, no clipping."""
    verdict, _, weights = run(ManualClassifier, classification_data(16), k=1, clip=None, loss_fn=summed_cross_entropy)
    _, _, plain = run(ManualClassifier, classification_data(16), k=1, clip=None, audited=False)
    assert verdict is None
    assert all(torch.equal(a, b) for a, b in zip(weights, plain, strict=True))


def test_a_loss_outside_a_model_the_audit_knows_asks_for_loss_fn():
    verdict, *_ = run(Classifier, classification_data(32), max_steps=1)
    assert not verdict.judged and "AuditCallback(loss_fn=" in verdict.meaning, verdict.line


SCRIPT = str(ROOT / "tests" / "training" / "audit_scripts" / "lightning_train.py")


def gradacc_audit(*args):
    """``gradacc audit --strict --json -- python lightning_train.py ARGS``: (exit status, the verdicts)."""
    import json

    result = subprocess.run([sys.executable, "-m", "gradacc", "audit", "--strict", "--json", "--", sys.executable,
                             SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=240)
    verdicts = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"')]
    assert len(verdicts) == 1, result.stdout + result.stderr[-3000:]
    return result.returncode, verdicts[0]


def test_gradacc_audit_attaches_the_callback_to_a_lightning_script_unchanged():
    """tests/training/audit_scripts/lightning_train.py, a Lightning user's script with nothing of gradacc in it: its
    token means per micro-batch fail the CI step (exit 3); its fix, run with ``import pytorch_lightning as L``, is
    exact (exit 0)."""
    status, verdict = gradacc_audit()
    assert status == 3 and verdict["gradient"] == V.WEIGHTED, verdict["line"]
    assert verdict["line"].startswith("gradacc audit (lightning, LlamaForCausalLM): gradient weighted by micro-batch")
    pytest.importorskip("pytorch_lightning", reason="lightning's own dependency; the fix runs on it")
    status, verdict = gradacc_audit("--fixed", "--pytorch-lightning")
    assert status == 0 and verdict["gradient"] == V.EXACT, verdict["line"]


def test_ddp_on_two_processes_is_audited_and_the_fix_counts_the_items_over_all_processes():
    """Trainer(devices=2, strategy="ddp") on the CPU: the verdict is said once, for both processes' window; the fix
    (the count reduced over processes, × k × world_size) is exact."""
    status, verdict = gradacc_audit("--ddp")
    assert status == 3 and verdict["gradient"] == V.WEIGHTED and verdict["num_processes"] == 2, verdict["line"]
    status, verdict = gradacc_audit("--ddp", "--fixed")
    assert status == 0 and verdict["gradient"] == V.EXACT and verdict["num_processes"] == 2, verdict["line"]


def test_the_docs_lightning_example_runs_as_written_and_prints_what_it_says(capsys):
    import re

    text = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    part = text.split("<!-- runs as written: tests/training/test_audit_lightning.py -->")[1]
    code = re.match(r"\s*```python\n(.*?)```", part, re.S).group(1)
    printed = [line[2:] for line in code.splitlines() if line.startswith("# ")]
    exec(compile(code, "docs/audit.md", "exec"), {"__name__": "docs_example"})
    assert capsys.readouterr().out.splitlines() == printed == ["weighted_by_micro_batch", "exact"]
