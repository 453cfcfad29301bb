"""The tests' truth for gradacc.audit: the true gradient of one window's mean loss over its items, computed from the
logits by hand with each micro-batch's random state replayed, using none of gradacc's code.

``Truth(model, kind)`` before the run trains (``model``: the module the loop calls; the PeftModel with PEFT):

* a forward pre-hook and a forward hook on ``model`` record, at each forward, torch's CPU (and CUDA) random state,
  the autocast state, grad mode, whether PEFT's adapters are off, copies of the call's inputs, and a copy of the
  output's logits (or TRL's fused ``log_probs``);
* the window ends where the loop hands its gradient over: ``close_on(trainer)`` (a callback added before the
  audit's) or ``close_on(optimizer)`` (its ``step`` wrapped after the audit's); the audit's own replays come after;
* ``torch.nn.utils.clip_grad_norm_`` / ``clip_grads_with_norm_`` are wrapped: the gradient before the window's last
  clipping is kept;
* at the first real optimizer step (``register_optimizer_step_pre_hook``), with every forward hook of ``model`` set
  aside, each recorded forward with gradients on is replayed from its own random state and must give its logits back
  bit for bit; the loss is computed by hand from the replayed logits (cross-entropy over labels ≠ -100, shifted for a
  causal LM; squared error for a regression head; DPO's -logsigmoid(β·margin) with the reference log-probs from the
  recorded no-grad forwards, replayed the same way), summed over the window and divided by its items; backward.
  Gradients and random states are put back: the run goes on unchanged.

``result``: ``accumulated_vs_truth`` (the gradient before its last clipping against the truth: ``ratio`` = a·t/t·t,
``rel_error``, ``residual``), ``applied_vs_truth``, ``replay_bitwise``, ``window_items``, ``items``.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

LOSS_KWARGS = ("labels", "num_items_in_batch", "fused_lm_head", "shift_labels", "return_dict")


def rng_take():
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def rng_put(state):
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _clone(value):
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def main_tensor(output):
    for name in ("logits", "log_probs"):
        value = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
        if torch.is_tensor(value):
            return value
    return output[0] if isinstance(output, (tuple, list)) else output


def adapters_disabled(module) -> bool:
    for sub in module.modules():
        if hasattr(sub, "lora_A") and hasattr(sub, "disable_adapters"):
            return bool(sub.disable_adapters)
    return False


@contextlib.contextmanager
def hooks_off(module):
    """The module's forward hooks set aside (the audit's and the truth's own): replays seen by nobody."""
    saved = [(d, dict(d)) for d in (module._forward_pre_hooks, module._forward_hooks)]
    for d, _ in saved:
        d.clear()
    try:
        yield
    finally:
        for d, items in saved:
            d.update(items)


def smoothed_cross_entropy(logits, labels, epsilon):
    """Σ (1 − ε)·(−log p_label) + ε·(mean over the classes of −log p): label smoothing written out."""
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return ((1 - epsilon) * nll - epsilon * logp.mean(dim=-1)).sum()


def summed_loss(kind, logits, labels, label_smoothing=0.0):
    """(sum of the per-item losses, number of items) of one micro-batch."""
    logits = logits.float()
    if kind == "classification" and label_smoothing:
        return smoothed_cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), label_smoothing), \
            labels.numel()
    if kind == "classification":
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), reduction="sum"), labels.numel()
    if kind == "regression":
        return F.mse_loss(logits.view(-1), labels.view(-1).float(), reduction="sum"), labels.numel()
    if kind == "token":
        kept = labels != -100
        return F.cross_entropy(logits[kept], labels[kept], reduction="sum"), int(kept.sum())
    if kind == "causal":
        target = labels[:, 1:]
        kept = target != -100
        return F.cross_entropy(logits[:, :-1][kept], target[kept], reduction="sum"), int(kept.sum())
    if kind == "targets":  # nanoGPT's model(x, y): y already shifted, -1 ignored
        kept = labels != -1
        return F.cross_entropy(logits[kept], labels[kept], reduction="sum"), int(kept.sum())
    raise ValueError(kind)


def sequence_logps(logits, labels):
    target = labels[:, 1:]
    kept = target != -100
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return (logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * kept).sum(dim=1)


def flat(named: dict):
    return torch.cat([named[n].reshape(-1).double() for n in sorted(named)])


def compare(applied: dict, truth: dict) -> dict:
    a, t = flat(applied), flat(truth)
    tt = float(t @ t)
    s = float(a @ t) / tt
    return {"ratio": s, "rel_error": float((a - t).norm()) / math.sqrt(tt),
            "residual": float((a - s * t).norm()) / math.sqrt(tt)}


class Truth:
    """See the module. ``kind``: classification | regression | token | causal | dpo | targets (nanoGPT's
    ``model(x, y)``: the targets are the forward's second positional argument, -1 ignored)."""

    def __init__(self, model, kind, ref_model=None, beta=0.1, label_smoothing=0.0, router=None):
        self.model, self.kind, self.beta, self.ref_model = model, kind, beta, ref_model
        # An MoE model: (coef, router_loss(router_logits, attention_mask)); coef × the micro-batches' mean router loss
        # is added to the objective (its forward adds coef · aux_loss to its loss; TRL's DPOTrainer adds it to DPO's).
        self.router = router
        self.label_smoothing = label_smoothing
        self.records, self.ref_records = [], []
        self.open = True
        self.result = None
        self.pending_labels = None
        self._depth = 0
        self._preclip = None
        self._handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                         model.register_forward_hook(self._post, with_kwargs=True)]
        if ref_model is not None:
            self._handles += [ref_model.register_forward_pre_hook(self._ref_pre, with_kwargs=True)]
        self._handles.append(register_optimizer_step_pre_hook(self._on_step))
        self._clip_originals = {}
        for name in ("clip_grad_norm_", "clip_grads_with_norm_"):
            self._clip_originals[name] = getattr(torch.nn.utils, name)
            setattr(torch.nn.utils, name, self._clip(self._clip_originals[name]))

    # -- recording
    def _record(self, module, args, kwargs):
        return {"args": _clone(args), "kwargs": _clone(kwargs), "rng": rng_take(),
                "autocast": (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
                "grad": torch.is_grad_enabled(), "adapters_disabled": adapters_disabled(module),
                "labels": _clone(self.pending_labels), "output": None}

    def _pre(self, module, args, kwargs):
        self._depth += 1
        if self.open and self._depth == 1:
            self.records.append(self._record(module, args, kwargs))

    def _post(self, module, args, kwargs, output):
        self._depth -= 1
        if self.open and self._depth == 0 and self.records and self.records[-1]["output"] is None:
            self.records[-1]["output"] = _clone(main_tensor(output))

    def _ref_pre(self, module, args, kwargs):
        if self.open:
            self.ref_records.append(self._record(module, args, kwargs))

    def _clip(self, original):
        def clip(parameters, max_norm, *args, **kwargs):
            if self.result is None and math.isfinite(float(max_norm)):
                parameters = [parameters] if torch.is_tensor(parameters) else list(parameters)
                if self.open:
                    self._preclip = self._grads()
                    self._clip_forwards = len(self.grad_records())
            return original(parameters, max_norm, *args, **kwargs)
        return clip

    def close_on(self, owner, when=lambda: True):
        """End the window where ``owner`` (a Trainer, or an optimizer whose step was patched already, at a call when
        ``when()``: Accelerate's steps only while it syncs) hands over the gradient, before anything else sees it."""
        from transformers import Trainer, TrainerCallback

        truth = self
        if isinstance(owner, Trainer):
            class Close(TrainerCallback):
                def on_pre_optimizer_step(self, args, state, control, **kwargs):
                    truth.open = False

            owner.add_callback(Close())
            step = owner.training_step

            def training_step(model, inputs, num_items_in_batch=None):  # labels Trainer pops before the forward
                truth.pending_labels = inputs.get("labels")
                return step(model, inputs, num_items_in_batch)

            owner.training_step = training_step
            return
        step = owner.step

        def closing_step(*args, **kwargs):
            if when():
                truth.open = False
            return step(*args, **kwargs)

        owner.step = closing_step

    # -- the truth
    def params(self):
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def _grads(self):
        return {n: p.grad.detach().clone() for n, p in self.params().items() if p.grad is not None}

    def grad_records(self):
        return [r for r in self.records if r["grad"]]

    def close(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for name, original in self._clip_originals.items():
            setattr(torch.nn.utils, name, original)

    def _on_step(self, optimizer, args, kwargs):
        if self.result is not None:
            return
        self.open = False
        applied = self._grads()
        saved = {n: p.grad for n, p in self.params().items()}
        rng = rng_take()
        try:
            for p in self.params().values():
                p.grad = None
            with hooks_off(self.model):
                info = self._dpo() if self.kind == "dpo" else self._compute()
            truth = self._grads()
        finally:
            for n, p in self.params().items():
                p.grad = saved[n]
            rng_put(rng)
        accumulated = applied
        if self._preclip is not None and self._clip_forwards == len(self.grad_records()):
            accumulated = self._preclip
        alone = info.pop("dpo_alone", None)
        self.result = {**info, "applied_vs_truth": compare(applied, truth),
                       "accumulated_vs_truth": compare(accumulated, truth)}
        if alone is not None:
            self.result["applied_vs_dpo_alone"] = compare(applied, alone)
        self.close()

    def _replay(self, module, record, strip=(), grad=True):
        kwargs = {k: v for k, v in record["kwargs"].items() if k not in strip}
        enabled, dtype = record["autocast"]
        adapters = module.disable_adapter() if record["adapters_disabled"] and hasattr(module, "disable_adapter") \
            else contextlib.nullcontext()
        rng_put(record["rng"])
        with adapters, torch.autocast("cpu", dtype=dtype, enabled=enabled), torch.set_grad_enabled(grad):
            return module(*record["args"], **kwargs)

    def _labels(self, record):
        if self.kind == "targets":
            return record["args"][1]
        labels = record["kwargs"].get("labels")
        return labels if labels is not None else record["labels"]

    def _logits_checked(self, record, checks):
        """The replayed plain forward's logits; the exact call replayed first must give its output back."""
        with torch.no_grad():
            again = main_tensor(self._replay(self.model, record))
        same = again.shape == record["output"].shape and bool(torch.equal(again, record["output"]))
        logits = main_tensor(self._replay(self.model, record, strip=LOSS_KWARGS))
        if not same and again.shape != logits.shape:  # fused log-probs (TRL): checked against the hand ones
            labels = self._labels(record)
            with torch.no_grad():
                target = labels[:, 1:]
                kept = target != -100
                logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, target.clamp(min=0).unsqueeze(-1))
                same = bool(torch.allclose(logp.squeeze(-1)[kept], again.float()[kept], atol=1e-5, rtol=1e-5))
        checks.append(same)
        return logits

    def _compute(self):
        records, checks, per_batch = self.grad_records(), [], []
        labels = [self._labels(r) for r in records]
        total = sum(summed_loss_items(self.kind, l) for l in labels)
        for record, label in zip(records, labels):
            loss, items = summed_loss(self.kind, self._logits_checked(record, checks), label, self.label_smoothing)
            (loss / total).backward()
            per_batch.append(items)
        info = {"micro_batches": len(records), "window_items": total, "items": per_batch, "replay_bitwise": checks}
        self._router_term(records)
        return info

    def _router_term(self, records) -> None:
        """An MoE model's router term, added to the truth: coef × the micro-batches' mean router loss, by hand."""
        if self.router is None:
            return
        coefficient, router_loss = self.router
        for record in records:
            out = self._replay(self.model, record, strip=LOSS_KWARGS)
            aux = router_loss(out.router_logits, record["kwargs"].get("attention_mask"))
            (coefficient * aux / len(records)).backward()

    def _dpo(self):
        records, checks = self.grad_records(), []
        ref_records = self.ref_records or [r for r in self.records if not r["grad"]]
        ref_module = self.ref_model or self.model
        refs = []
        for record in ref_records:
            out = self._replay(ref_module, record, strip=LOSS_KWARGS, grad=False)
            refs.append(sequence_logps(main_tensor(out), record["kwargs"]["labels"]))
        pairs = sum(r["kwargs"]["labels"].shape[0] // 2 for r in records)
        for record, ref in zip(records, refs, strict=True):
            logps = sequence_logps(self._logits_checked(record, checks), record["kwargs"]["labels"])
            (chosen, rejected), (ref_chosen, ref_rejected) = logps.chunk(2), ref.chunk(2)
            loss = -F.logsigmoid(self.beta * ((chosen - ref_chosen) - (rejected - ref_rejected))).sum()
            (loss / pairs).backward()
        info = {"micro_batches": len(records), "window_items": pairs, "replay_bitwise": checks}
        if self.router is not None:  # DPO's part alone kept, then the router term added
            info["dpo_alone"] = self._grads()
            self._router_term(records)
        return info


def router_loss_by_hand(router_logits, top_k, attention_mask):
    """E · Σ_e (top-k choices of e ÷ rows) · (router probabilities of e summed ÷ rows), over every layer's rows
    that are not padding, one row at a time."""
    experts = router_logits[0].shape[-1]
    keep = attention_mask.reshape(-1).tolist()
    chosen, probability, rows = [0] * experts, 0, 0
    for layer in router_logits:
        for row, kept in zip(layer, keep):
            if not kept:
                continue
            p = torch.softmax(row.double(), dim=-1)
            for expert in sorted(range(experts), key=lambda e: -float(p[e].detach()))[:top_k]:
                chosen[expert] += 1
            probability, rows = probability + p, rows + 1
    return experts * sum(chosen[e] / rows * probability[e] / rows for e in range(experts))


def summed_loss_items(kind, labels) -> int:
    if kind == "targets":
        return int((labels != -1).sum())
    if kind == "causal":
        return int((labels[:, 1:] != -100).sum())
    if kind == "token":
        return int((labels != -100).sum())
    return labels.numel()
