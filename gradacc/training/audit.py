"""Audit a user's own accumulation: their ``Trainer`` (a callback) or their ``accelerator.accumulate`` loop.

On the run's first optimizer step with k > 1 the audit recomputes, on the same micro-batches and the same
weights, the gradient of the window's mean loss over its items (``reference``) and compares it with the
gradient the run accumulated and is about to apply:

    relative error = ‖g_run − g_reference‖ / ‖g_reference‖   (training.gradients, as the equivalence check)

and says what the error means: ≈ k − 1 is a k× gradient (a head that ignores ``num_items_in_batch``,
transformers #47688), a plain scale j/k a short window divided by the configured k, a residual that is no
scale at all micro-batches weighted equally instead of by their items. It also counts, over that window,
the learning-rate scheduler's steps (accelerate #963), the clipping calls, DDP's gradient syncs, and (for
Trainer) compares the loss Trainer logs with the window's mean loss.

The reference costs one forward+backward of one window, once: in one pass over the whole window when no
dropout is active (falling back to one pass per micro-batch when that runs out of memory), else one pass
per micro-batch replayed from the window's random state, so the dropout masks are the run's own and the
comparison stays exact. Gradients, buffers and every random state are put back before the run goes on:
the user's run continues bit-identical to a run without the audit. The gradient about to be applied is read in
place right before the optimizer step (no copy); clipping that ran after the window's last micro-batch is undone
by the factor it scaled by, so the comparison is with the accumulated gradient itself.

``gradacc.audit`` is the public face of this module (importable without torch).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import sys
import time
from dataclasses import dataclass, field

from gradacc.training.gradients import gradient_sums
from gradacc.training.windows import loss_weight

logger = logging.getLogger("gradacc.audit")

# Relative error counted as exact: float32 recomputation in another batch shape differs by ~1e-7.
EXACT = 1e-4
EXACT_MIXED_PRECISION = 2e-2
# How far a measured scale may be from k (or j/k) and still be named as that cause.
SCALE_TOLERANCE = 0.02


# ---- the fix gradacc ships for #47688 heads ------------------------------------------------------------

def token_mean_loss(outputs, labels, num_items_in_batch=None):
    """A Trainer ``compute_loss_func``: cross-entropy summed over the labelled items ÷ ``num_items_in_batch``.

    Trainer counts ``num_items_in_batch`` over the whole accumulation window (on all ranks), so each
    micro-batch's share comes out weighted by its items and the window's gradient is that of its mean loss,
    whatever k or the window's length. For heads whose logits line up with their labels (sequence and token
    classification); a ``*ForCausalLM`` head already uses ``num_items_in_batch`` itself.
    """
    import torch.nn.functional as F

    logits = outputs["logits"]
    summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100,
                             reduction="sum")
    if num_items_in_batch is None:  # evaluation without a count: the batch's own mean
        num_items_in_batch = (labels != -100).sum()
    return summed / num_items_in_batch


# ---- shared pieces: items, states, the reference ----------------------------------------------------------

def batch_items(batch: dict, shifts_labels: bool = False) -> int:
    """Items a micro-batch adds to the loss: its labels other than -100 (a causal LM's from the second token)."""
    labels = batch["labels"]
    if labels.dim() > 1 and shifts_labels:
        labels = labels[..., 1:]
    return int((labels != -100).sum())


def shifts_labels(model) -> bool:
    """Whether the model's own loss predicts label t+1 at position t (a causal LM): its items are its labels from
    the second token. Read from the loss function the model uses, not from its class name (GPT2LMHeadModel's
    name says nothing of it)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    try:
        return model.loss_function is ForCausalLMLoss
    except AttributeError:  # not a transformers model
        return model.__class__.__name__.endswith("ForCausalLM")


def dropout_active(model) -> bool:
    import torch

    return any(isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0 and module.training
               for module in model.modules())


@dataclass
class RandomState:
    """Every random state a training loop draws from, taken and put back whole."""

    states: dict = field(default_factory=dict)

    @classmethod
    def take(cls) -> "RandomState":
        import numpy as np
        import torch

        states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.get_rng_state_all()
        return cls(states)

    def put_back(self) -> None:
        import numpy as np
        import torch

        random.setstate(self.states["python"])
        np.random.set_state(self.states["numpy"])
        torch.set_rng_state(self.states["torch"])
        if "cuda" in self.states:
            torch.cuda.set_rng_state_all(self.states["cuda"])


@contextlib.contextmanager
def set_aside(model):
    """Gradients and buffers (BatchNorm statistics) put aside and back, and random states restored: what
    runs inside leaves the user's run as it found it."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    rng = RandomState.take()
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, grad in zip(params, grads):
            p.grad = grad
        for b, saved in buffers:
            b.data.copy_(saved)
        rng.put_back()


def concatenate(batches: list[dict]) -> dict:
    """One batch of all the micro-batches, right-padded to the longest (labels with -100, the rest with 0; the
    attention mask keeps the padding out). ValueError, with the reason, for micro-batches it cannot join."""
    import torch
    import torch.nn.functional as F

    joined = {}
    for key in batches[0]:
        values = [b[key] for b in batches]
        if not all(torch.is_tensor(v) for v in values):
            raise ValueError(f"{key!r} is not a tensor")
        width = max(v.shape[-1] for v in values) if values[0].dim() > 1 else None
        if width is not None and any(v.shape[-1] != width for v in values):
            if "attention_mask" not in batches[0]:
                raise ValueError("micro-batches of different lengths without an attention mask")
            values = [F.pad(v, (0, width - v.shape[-1]), value=-100 if key == "labels" else 0) for v in values]
        joined[key] = torch.cat(values)
    return joined


def reference_gradient(model, batches: list[dict], loss_fn, items: list[int], window_items: int,
                       replay: RandomState | None = None, autocast=contextlib.nullcontext) -> dict:
    """The gradient of the mean loss over the window's items (``window_items``, on all ranks) from this
    rank's ``batches``, at the model's current weights, with the run's own gradients set aside.

    ``loss_fn(model, batch)`` is the mean loss over a batch's items. ``replay``: the random state the window
    started from; the micro-batches are then replayed one by one from it (the run's dropout masks). Else one
    pass over the concatenated window, or one per micro-batch when that runs out of memory. Returns
    ``gradient`` (name → flat tensor, not yet summed over ranks), ``loss`` (this rank's share of the window's
    mean loss) and ``mode``.
    """
    import torch

    def per_micro_batch():
        total = 0.0
        for batch, n in zip(batches, items):
            with autocast():
                # gradacc's exact weight: the micro-batch's share of the window's items (summed over ranks after).
                loss = loss_fn(model, batch) * loss_weight("exact", n, window_items, len(batches))
            loss.backward()
            total += float(loss.detach())
        return total

    with set_aside(model):
        if replay is not None:
            replay.put_back()
            loss, mode = per_micro_batch(), "replayed per micro-batch (dropout on: the run's own masks)"
        else:
            try:
                joined = concatenate(batches) if len(batches) > 1 else batches[0]
            except ValueError as reason:
                joined, why = None, str(reason)
            if joined is not None:
                try:
                    with autocast():
                        loss = loss_fn(model, joined) * (sum(items) / window_items)
                    loss.backward()
                    loss, mode = float(loss.detach()), "one pass over the window"
                except torch.OutOfMemoryError:
                    model.zero_grad(set_to_none=True)
                    joined, why = None, "the whole window did not fit in memory"
            if joined is None:
                loss, mode = per_micro_batch(), f"per micro-batch ({why})"
        # No copy: these gradients are the reference's own, and set_aside puts the run's back in their place.
        gradient = live_gradients(model)
    return {"gradient": gradient, "loss": loss, "mode": mode}


def sum_over_ranks(gradient: dict, loss: float) -> tuple[dict, float]:
    """The ranks' shares of the reference added up (one all-reduce), on one process as they are."""
    from gradacc.training import distributed

    if not distributed.is_distributed():
        return gradient, loss
    import torch
    import torch.distributed as dist

    names = sorted(gradient)
    flat = torch.cat([gradient[n] for n in names] + [torch.tensor([loss], device=gradient[names[0]].device)])
    dist.all_reduce(flat)
    out, start = {}, 0
    for n in names:
        out[n] = flat[start:start + gradient[n].numel()]
        start += gradient[n].numel()
    return out, float(flat[-1])


@contextlib.contextmanager
def counting_clips(counter: "Tally"):
    """Gradient clipping counted by the micro-batch it ran after, with the factor it scaled the gradients by:
    ``torch.nn.utils.clip_grad_norm_`` (a loop's own) and ``clip_grads_with_norm_`` (what Accelerate's, and so
    Trainer's, clipping calls). A call with an infinite norm only measures and is not counted."""
    import math

    import torch.nn.utils as utils

    originals = {name: getattr(utils, name) for name in ("clip_grad_norm_", "clip_grads_with_norm_")}

    def counted(name, original):
        def clip(parameters, max_norm, *args, **kwargs):
            result = original(parameters, max_norm, *args, **kwargs)
            if math.isfinite(float(max_norm)):
                # clip_grad_norm_ returns the norm; clip_grads_with_norm_(parameters, max_norm, total_norm) is given it.
                total = result if name == "clip_grad_norm_" else (args[0] if args else kwargs["total_norm"])
                # torch's own factor: max_norm / (norm + 1e-6), at most 1
                counter.clipped_after[counter.backwards] = min(1.0, float(max_norm) / (float(total) + 1e-6))
            return result

        return clip

    for name, original in originals.items():
        setattr(utils, name, counted(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(utils, name, original)


@dataclass
class Tally:
    """What the audited window did, counted as it ran."""

    backwards: int = 0                                   # micro-batches back-propagated so far
    clipped_after: dict = field(default_factory=dict)    # micro-batch count after which clipping ran → its factor
    scheduler_steps: int = 0
    synced_micro_batches: int | None = None              # DDP: micro-batches whose backward all-reduced
    logged_loss: float = 0.0                             # Trainer: what it adds to the loss it logs


# ---- the verdict ----------------------------------------------------------------------------------------

def judge(applied: dict, reference: dict, *, k: int, micro_batches: int, tolerance: float, who: str,
          num_processes: int = 1, applied_scale: float = 1.0, items: tuple | None = None) -> dict:
    """The relative error of ``applied`` against ``reference`` and what it means, with the fix in ``who``'s
    terms (``trainer`` or ``accelerate``).

    On P processes Trainer also multiplies each loss by P (to undo DDP's average, ``average_tokens_across_devices``),
    so a head that ignores ``num_items_in_batch`` comes out k·P× too large there. ``applied_scale``: what
    ``applied`` is multiplied by first (undoing the window's clipping). ``items``: (the window's items as the
    model's loss counts them, what Trainer counted as ``num_items_in_batch``)."""
    import math

    sums = gradient_sums(applied, reference, gradient_scale=applied_scale)
    error = math.sqrt(sums["difference"] / sums["reference"])  # equivalence.relative_error, from the same sums
    # The best scale s of the reference, and what no scale explains: ‖a − s·r‖ / ‖r‖, with
    # ‖a − s·r‖² = a·a − 2s·a·r + s²·r·r (resolves residuals well below the 2 % that names a cause).
    scale = sums["dot"] / sums["reference"]
    residual = math.sqrt(max(0.0, sums["own"] - 2 * scale * sums["dot"] + scale * scale * sums["reference"])
                         / sums["reference"])
    result = {"rel_error": error, "scale": scale, "residual": residual}

    def near(value: float) -> bool:
        return residual <= SCALE_TOLERANCE and abs(scale - value) <= SCALE_TOLERANCE * value

    if error <= tolerance:
        return {**result, "gradient": "exact", "meaning": "the gradient of the window's mean loss", "fix": None}
    too_large = k * num_processes if who == "trainer" and num_processes > 1 and near(k * num_processes) else k
    if k > 1 and near(too_large):
        times = f"k·P = {k}·{num_processes}" if too_large != k else "k"
        meaning = (f"{scale:.3g}× the gradient of the window's mean loss (relative error ≈ {times} − 1 = "
                   f"{too_large - 1})")
        if who == "trainer":
            meaning += ("; the model's forward takes **kwargs, so Trainer skips its own ÷k, but its loss head "
                        "ignores num_items_in_batch (transformers #47688)")
            fix = ("pass compute_loss_func=gradacc.audit.token_mean_loss to Trainer (it divides the summed loss by "
                   "num_items_in_batch, the window's items)")
        else:
            meaning += "; the loss was back-propagated without Accelerate's ÷k"
            fix = "call accelerator.backward(loss) (it divides by k), not loss.backward()"
        return {**result, "gradient": "k× too large", "meaning": meaning, "fix": fix}
    if who == "trainer" and items and items[1] and items[1] != items[0] and near(items[0] / items[1]):
        return {**result, "gradient": "items miscounted",
                "meaning": (f"{scale:.3g}× the gradient of the window's mean loss: Trainer divided by "
                            f"num_items_in_batch = {items[1]:g}, but the model's loss averages over {items[0]:g} "
                            "items (a causal LM predicts from the second token; Trainer counts every label when "
                            "the model's loss_type does not name ForCausalLM, as GPT2LMHeadModel's does not)"),
                "fix": ("set model.loss_type = \"ForCausalLM\" before building the Trainer, so it counts "
                        "labels[..., 1:]")}
    if k > 1 and micro_batches < k and near(micro_batches / k):
        return {**result, "gradient": "short window ÷ configured k",
                "meaning": (f"{scale:.3g}× the gradient of the window's mean loss: a short window of {micro_batches} "
                            f"micro-batches divided by the configured k={k}"),
                "fix": ("weight each micro-batch's mean loss by its items ÷ the window's items × k before "
                        "accelerator.backward (gradacc's exact weights), or drop the last partial window")}
    if k > 1 and near(1 / k):
        return {**result, "gradient": "k× too small",
                "meaning": f"{scale:.3g}× the gradient of the window's mean loss: divided by k twice",
                "fix": ("pass the micro-batch's plain mean loss to accelerator.backward (it divides by k itself)"
                        if who == "accelerate" else "do not divide the loss by k yourself: Trainer does")}
    if residual > SCALE_TOLERANCE:
        fix = ("pass compute_loss_func=gradacc.audit.token_mean_loss to Trainer" if who == "trainer" else
               "multiply each micro-batch's mean loss by its items ÷ the window's items × k before accelerator.backward")
        return {**result, "gradient": "weighted by micro-batch, not by item",
                "meaning": (f"not a plain scale of the window's mean-loss gradient (residual {residual:.2g}): "
                            "micro-batches holding different numbers of items (tokens) were weighted equally, "
                            "as a mean per micro-batch ÷ k does"),
                "fix": fix}
    return {**result, "gradient": "scaled", "meaning": f"{scale:.3g}× the gradient of the window's mean loss",
            "fix": "divide the window's summed loss by its number of items, once"}


def verdict(gradient: dict, tally: Tally, *, k: int, micro_batches: int, expected_scheduler_steps: int,
            clipping: bool, who: str, reference_loss: float | None = None, mode: str = "", reference_seconds: float = 0.0,
            seconds: float = 0.0) -> dict:
    """One report: the gradient's finding plus the scheduler, clipping, sync and logged-loss checks."""
    problems, checks = [], {}
    if gradient["gradient"] != "exact":
        problems.append(f"gradient {gradient['gradient']}")
    steps = tally.scheduler_steps
    # No step seen: no scheduler given to the audit (or none in the loop): nothing to judge.
    checks["scheduler"] = {"steps": steps, "expected": expected_scheduler_steps,
                           "ok": None if steps == 0 else steps == expected_scheduler_steps}
    if checks["scheduler"]["ok"] is False:
        problems.append(f"scheduler stepped {steps}× per optimizer step (expected {expected_scheduler_steps}): "
                        "the schedule runs that much too fast; "
                        + ("let Trainer step it (once per optimizer step), not training_step" if who == "trainer" else
                           "step it after optimizer.step() only when accelerator.sync_gradients (or prepare it "
                           "with accelerator.prepare)"))
    clips = len(tally.clipped_after)
    checks["clipping"] = {"micro_batches_clipped_after": sorted(tally.clipped_after), "ok": None}
    if clipping or clips:
        ok = set(tally.clipped_after) == {tally.backwards}
        checks["clipping"]["ok"] = ok
        if not ok:
            problems.append(f"clipping ran {clips}× in a window of {micro_batches} micro-batches (expected once, "
                            "after the last): "
                            + ("let Trainer clip (max_grad_norm), not training_step" if who == "trainer" else
                               "clip only when accelerator.sync_gradients, right before optimizer.step()"))
    if tally.synced_micro_batches is not None:
        ok = tally.synced_micro_batches <= 1
        checks["sync"] = {"synced_micro_batches": tally.synced_micro_batches, "ok": ok}
        if not ok:
            problems.append(f"gradients all-reduced in {tally.synced_micro_batches} of {micro_batches} micro-batches "
                            "(expected once per window): run the forward and backward inside "
                            "accelerator.accumulate(model)")
    if who == "trainer" and reference_loss:
        ratio = tally.logged_loss / reference_loss
        ok = abs(ratio - 1) <= 1e-3 * max(1, k)
        checks["logged_loss"] = {"logged": tally.logged_loss, "window_mean": reference_loss, "ratio": ratio, "ok": ok}
        if not ok:
            problems.append(f"logged loss {ratio:.3g}× the window's mean loss")
    report = {"who": who, "k": k, "micro_batches": micro_batches, **gradient,
              "checks": checks, "problems": problems, "ok": not problems, "reference": mode,
              "reference_seconds": reference_seconds, "audit_seconds": seconds}
    report["line"] = summary_line(report)
    return report


def summary_line(report: dict) -> str:
    if report["ok"]:
        checked = [name.replace("_", " ") for name, check in report["checks"].items() if check["ok"] is not None]
        return (f"gradacc audit: exact — the step applies the gradient of the window's mean loss (relative error "
                f"{report['rel_error']:.1e}, k={report['k']})"
                + (f"; {', '.join(checked)}: as they should" if checked else ""))
    line = f"gradacc audit: {'; '.join(report['problems'])}"
    if report["gradient"] != "exact":
        line += f" — relative error {report['rel_error']:.3g}: {report['meaning']}. Fix: {report['fix']}"
    return line


def _publish(report: dict, json_path) -> None:
    logger.warning(report["line"])
    if json_path:
        with open(json_path, "w", encoding="utf-8") as file:
            json.dump(report, file, default=str)


# ---- Trainer ----------------------------------------------------------------------------------------------

def _trainer_from_stack():
    """The Trainer that calls this callback: Trainer hands callbacks no handle on itself, so the audit finds it
    in the calling frames (``self`` of ``Trainer.train``'s inner loop)."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class _TrainerAudit:
    """The state of one audit of one Trainer run (see ``AccumulationAudit``)."""

    def __init__(self, trainer, loss_fn, json_path):
        self.trainer = trainer
        self.loss_fn = loss_fn or (lambda model, batch: model(**batch).loss)
        self.json_path = json_path
        self.tally = Tally()
        self.batches: list[dict] = []
        self.gradient: dict | None = None  # the gradient's finding
        self.counted_items: float | None = None
        self.rng_at_start: RandomState | None = None
        self.reference: dict | None = None
        self.seconds = 0.0
        self._restore = []
        self._clips = None

    def start(self):
        """The first window begins (its micro-batches already fetched): watch it."""
        trainer, tally = self.trainer, self.tally
        self.rng_at_start = RandomState.take()
        step = trainer.training_step
        scheduler_step = trainer.lr_scheduler.step

        def training_step(model, inputs, num_items_in_batch=None):
            self.batches.append(dict(inputs))
            if num_items_in_batch is not None:  # what Trainer divides the window's summed loss by (all ranks)
                self.counted_items = float(num_items_in_batch)
            loss = step(model, inputs, num_items_in_batch)
            tally.backwards += 1
            tally.logged_loss += float(loss)
            return loss

        def count_scheduler_step(*args, **kwargs):
            tally.scheduler_steps += 1
            return scheduler_step(*args, **kwargs)

        self._restore = [_patch(trainer, "training_step", training_step),
                         _patch(trainer.lr_scheduler, "step", count_scheduler_step)]
        self._clips = counting_clips(tally)
        self._clips.__enter__()

    def measure(self):
        """Before the optimizer step: the reference gradient on the same micro-batches and weights."""
        started = time.perf_counter()
        trainer = self.trainer
        model = trainer.model
        shifts = shifts_labels(model)
        device = next(model.parameters()).device
        batches = [trainer._prepare_inputs(b) for b in self.batches]
        items = [batch_items(b, shifts) for b in batches]
        window = _window_items(items, device)
        replay = self.rng_at_start if dropout_active(model) else None
        self.reference = reference_gradient(model, batches, self.loss_fn, items, window, replay=replay,
                                            autocast=trainer.compute_loss_context_manager)
        self.reference["seconds"] = time.perf_counter() - started
        self.reference["gradient"], self.reference["loss"] = sum_over_ranks(self.reference["gradient"],
                                                                           self.reference["loss"])
        # Trainer logs the mean over ranks of what each rank added up.
        from gradacc.training import distributed

        args = trainer.args
        ranks = max(1, args.world_size)
        self.tally.logged_loss = distributed.sum_over_ranks([self.tally.logged_loss], device)[0] / ranks
        # The gradient Trainer is about to apply (after its clipping, undone by its factor), read in place.
        tolerance = EXACT_MIXED_PRECISION if (args.bf16 or args.fp16) else EXACT
        self.gradient = judge(live_gradients(model), self.reference["gradient"], k=args.gradient_accumulation_steps,
                              micro_batches=len(self.batches), tolerance=tolerance, who="trainer",
                              num_processes=args.world_size, applied_scale=unclipped(self.tally),
                              items=(window, self.counted_items))
        self.reference["gradient"] = None  # freed now, not at the step's end
        self.seconds += time.perf_counter() - started

    def finish(self, state):
        for restore in self._restore:
            restore()
        self._restore = []
        if self._clips is not None:
            self._clips.__exit__(None, None, None)
        if self.gradient is None:
            return None
        args = self.trainer.args
        report = verdict(self.gradient, self.tally, k=args.gradient_accumulation_steps, micro_batches=len(self.batches),
                         expected_scheduler_steps=1, clipping=args.max_grad_norm > 0, who="trainer",
                         reference_loss=self.reference["loss"], mode=self.reference["mode"],
                         reference_seconds=self.reference["seconds"], seconds=self.seconds)
        state.log_history.append({"gradacc_audit": report, "step": state.global_step})
        if state.is_world_process_zero:  # one line for the run, not one per rank
            _publish(report, self.json_path)
        return report


def live_gradients(model) -> dict:
    """The gradients as they are now, flat, without a copy (a copy of a 20M-parameter gradient costs a good
    part of a window): read at once, before the optimizer steps."""
    return {name.removeprefix("module."): p.grad.detach().float().flatten()
            for name, p in model.named_parameters() if p.grad is not None}


def unclipped(tally: "Tally") -> float:
    """What undoes the clipping that ran after the window's last micro-batch: the gradient applied ÷ its factor is
    the gradient accumulated. Clipping of partial sums (earlier micro-batches) is left in: it changed the sum."""
    return 1.0 / tally.clipped_after.get(tally.backwards, 1.0)


def _patch(owner, name: str, replacement):
    """Set ``owner.name`` on the instance for the audited window; returns what puts it back as it was (the
    class's method, or an instance attribute the user had set)."""
    missing = object()
    before = owner.__dict__.get(name, missing)
    setattr(owner, name, replacement)

    def restore():
        if before is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, before)

    return restore


def _window_items(items: list[int], device) -> float:
    """The window's items on all ranks (one all-reduce; this rank's own on one process)."""
    from gradacc.training import distributed

    return distributed.sum_over_ranks([float(sum(items))], device)[0]


def accumulation_audit_class():
    """``AccumulationAudit``, built on first use (transformers is imported then, not with gradacc.audit)."""
    base = _callback_base()

    class AccumulationAudit(base):
        """A ``TrainerCallback`` that audits the run's first optimizer step (with gradient_accumulation_steps > 1):
        ``trainer.add_callback(AccumulationAudit())``. The verdict goes to the log, to ``state.log_history``
        (an entry ``{"gradacc_audit": report}``), to ``self.report`` and, with ``json_path``, to a JSON file.

        ``loss_fn(model, batch)``: the mean loss over a batch's items (default: the model's own ``.loss``).
        """

        def __init__(self, json_path=None, loss_fn=None):
            self.json_path = json_path
            self.loss_fn = loss_fn
            self.report: dict | None = None
            self._audit: _TrainerAudit | None = None
            self._done = False

        def on_train_begin(self, args, state, control, **kwargs):
            self._audit, self._done, self.report = None, False, None  # once per run, also when train() runs again

        def on_step_begin(self, args, state, control, **kwargs):
            if self._done or self._audit is not None or args.gradient_accumulation_steps <= 1:
                return
            trainer = _trainer_from_stack()
            if trainer is None:
                logger.warning("gradacc audit: no Trainer found calling the callback; nothing audited")
                self._done = True
                return
            self._audit = _TrainerAudit(trainer, self.loss_fn, self.json_path)
            self._audit.start()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if self._audit is not None and self._audit.reference is None:
                self._audit.measure()

        def on_step_end(self, args, state, control, **kwargs):
            if self._audit is not None:
                self.report = self._audit.finish(state)
                self._audit, self._done = None, True

        def on_train_end(self, args, state, control, **kwargs):
            if self._audit is not None:  # stopped inside the first window
                self._audit.finish(state)
                self._audit, self._done = None, True

    return AccumulationAudit


# ---- Accelerate -------------------------------------------------------------------------------------------

class AccelerateAudit:
    """A context manager around the first window of a user's ``accelerator.accumulate`` loop.

    ``batches``: that window's micro-batches on this rank, the ones the loop inside will run (build them
    before entering: with dropout on, the audit replays them from the random state at entry).
    ``loss_fn(model, batch)``: the mean loss over a batch's items (default: the model's own ``.loss``).
    The loop inside runs as written; the block should end after the window's optimizer and scheduler steps.
    ``report`` holds the verdict after the block (on every rank).
    """

    def __init__(self, accelerator, model, optimizer, batches, loss_fn=None, lr_scheduler=None, json_path=None):
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.batches = list(batches)
        self.loss_fn = loss_fn or (lambda model, batch: model(**batch).loss)
        self.lr_scheduler = lr_scheduler
        self.json_path = json_path
        self.tally = Tally()
        self.report: dict | None = None
        self._gradient = None
        self._reference = None
        self._seconds = 0.0
        self._restore = []
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        from gradacc.training.distributed import SyncProbe

        accelerator, tally = self.accelerator, self.tally
        self._rng = RandomState.take()
        backward = accelerator.backward
        step = self.optimizer.step
        probe = None
        with contextlib.suppress(RuntimeError):  # a comm hook of the user's own: syncs not counted
            probe = SyncProbe.attach(self.model)
        if probe is not None:
            tally.synced_micro_batches = 0

        def audited_backward(loss, **kwargs):
            result = backward(loss, **kwargs)
            tally.backwards += 1
            if probe is not None and probe.take():
                tally.synced_micro_batches += 1
            return result

        def audited_step(*args, **kwargs):
            if accelerator.sync_gradients and self._reference is None:
                self._measure()  # right before the step: the gradient it is about to apply
            return step(*args, **kwargs)

        self._restore = [_patch(accelerator, "backward", audited_backward),
                         _patch(self.optimizer, "step", audited_step)]
        if self.lr_scheduler is not None:
            inner = getattr(self.lr_scheduler, "scheduler", self.lr_scheduler)  # the torch scheduler itself
            inner_step = inner.step

            def counted(*args, **kwargs):
                tally.scheduler_steps += 1
                return inner_step(*args, **kwargs)

            self._restore.append(_patch(inner, "step", counted))
        self._stack.enter_context(counting_clips(tally))
        return self

    def _measure(self):
        started = time.perf_counter()
        model = self.accelerator.unwrap_model(self.model)  # no DDP collectives in the reference
        device = next(model.parameters()).device
        batches = [{key: value.to(device) if hasattr(value, "to") else value for key, value in b.items()}
                   for b in self.batches]
        shifts = shifts_labels(model)
        items = [batch_items(b, shifts) for b in batches]
        window = _window_items(items, device)
        replay = self._rng if dropout_active(model) else None
        reference = reference_gradient(model, batches, self.loss_fn, items, window, replay=replay,
                                       autocast=self.accelerator.autocast)
        reference["seconds"] = time.perf_counter() - started
        reference["gradient"], reference["loss"] = sum_over_ranks(reference["gradient"], reference["loss"])
        self._reference = reference
        accelerator = self.accelerator
        if accelerator.scaler is not None:  # fp16: unscale now, as the step would (it then skips its own)
            with contextlib.suppress(RuntimeError):  # already unscaled by the loop's clipping
                accelerator.unscale_gradients()
        tolerance = EXACT if accelerator.mixed_precision == "no" else EXACT_MIXED_PRECISION
        micro_batches = self.tally.backwards or len(self.batches)  # no accelerator.backward: the batches given
        self._gradient = judge(live_gradients(self.model), reference["gradient"],
                               k=accelerator.gradient_accumulation_steps, micro_batches=micro_batches,
                               tolerance=tolerance, who="accelerate", applied_scale=unclipped(self.tally))
        reference["gradient"] = None
        self._seconds += time.perf_counter() - started

    def __exit__(self, *exc):
        for restore in self._restore:
            restore()
        self._restore = []
        self._stack.close()
        if exc[0] is not None or self._gradient is None:
            return False
        accelerator = self.accelerator
        k = accelerator.gradient_accumulation_steps
        micro_batches = self.tally.backwards or len(self.batches)
        gradient = self._gradient
        expected = _expected_scheduler_steps(self.lr_scheduler, accelerator.num_processes)
        self.report = verdict(gradient, self.tally, k=k, micro_batches=micro_batches,
                              expected_scheduler_steps=expected, clipping=False, who="accelerate",
                              mode=self._reference["mode"], reference_seconds=self._reference["seconds"],
                              seconds=self._seconds)
        self.report["num_processes"] = accelerator.num_processes
        if accelerator.is_main_process:
            _publish(self.report, self.json_path)
        return False


def _expected_scheduler_steps(lr_scheduler, num_processes: int) -> int:
    """A prepared scheduler steps the torch one once per process per optimizer step unless batches are split
    (Accelerate's design: schedules sized in per-process steps); an unprepared one, once."""
    from accelerate.scheduler import AcceleratedScheduler

    if isinstance(lr_scheduler, AcceleratedScheduler) and lr_scheduler.step_with_optimizer \
            and not lr_scheduler.split_batches:
        return num_processes
    return 1


def audit_accelerate(accelerator, model, optimizer, batches, loss_fn=None, lr_scheduler=None,
                     json_path=None) -> AccelerateAudit:
    """``with audit_accelerate(accelerator, model, optimizer, batches, loss_fn, lr_scheduler) as audit:`` around
    the first window of your ``accelerator.accumulate`` loop; ``audit.report`` after it."""
    return AccelerateAudit(accelerator, model, optimizer, batches, loss_fn, lr_scheduler, json_path)


# ---- a stock Trainer, for the command line ------------------------------------------------------------------

def audit_stock_trainer(config, steps: int = 1, window_timer=None, confinement=None, audited: bool = True) -> dict:
    """The audit of a stock ``transformers.Trainer`` (its defaults, no ``compute_loss_func``) on ``config``'s
    model and data: ``steps`` optimizer steps of micro-batch m and k, the first audited. ``window_timer``: a
    TrainerCallback added beside the audit (the benchmark's clock). ``confinement``: where local paths may lie
    (``job.prepare``'s). ``audited=False``: the same run without the audit (the benchmark's baseline); returns
    ``{}`` then."""
    import tempfile
    import threading

    from transformers import PrinterCallback, Trainer, TrainingArguments

    from gradacc.config import field_label
    from gradacc.errors import GradaccError
    from gradacc.training.backends.trainer_loop import _Samples
    from gradacc.training.engine import quiet_libraries
    from gradacc.training.job import prepare
    from gradacc.training.options import RunOptions

    m, k = config.micro_batch_size, config.grad_accum_steps
    if not isinstance(k, bool) and isinstance(k, int) and k < 2:
        raise GradaccError(f"{field_label('grad_accum_steps')} must be at least 2 for an audit of accumulation "
                           f"(k micro-batches per optimizer step); got {k}.", "grad_accum_steps")
    # Full windows on every rank (under accelerate launch / torchrun each takes its share of the examples).
    config = config.replace(backend="trainer", train_samples=m * k * steps * config.num_processes, epochs=1, max_steps=steps,
                            eval_samples=8, instrument=False).validate()
    quiet_libraries()
    job = prepare(config, lambda event: None, threading.Event(), RunOptions(confinement=confinement))
    audit = accumulation_audit_class()()
    with tempfile.TemporaryDirectory(prefix="gradacc-audit-") as output_dir:
        args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=m, gradient_accumulation_steps=k,
                                 max_steps=steps, learning_rate=config.learning_rate, seed=config.seed,
                                 report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                                 use_cpu=job.device.type == "cpu")
        callbacks = ([audit] if audited else []) + ([window_timer] if window_timer else [])
        trainer = Trainer(model=job.model, args=args, train_dataset=_Samples(job.train_examples),
                          data_collator=job.collate, callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)
        quiet = logging.getLogger("gradacc.audit")
        quiet.disabled = True  # the command prints the verdict itself
        try:
            trainer.train()
        finally:
            quiet.disabled = False
    if not audited:
        return {}
    if audit.report is None:
        raise GradaccError("The audit saw no optimizer step: the data has fewer examples than one micro-batch.",
                           "micro_batch_size")
    return {**audit.report, "model": config.model, "dataset": config.dataset, "micro_batch_size": m}
