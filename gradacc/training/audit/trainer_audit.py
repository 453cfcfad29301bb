"""The audit of a user's own ``Trainer`` (TRL's SFTTrainer and DPOTrainer included): ``AccumulationAudit``, a
callback bound to its trainer, that watches the run's first window (k = 1 too) and judges its gradient right before
the optimizer step. ``audit_trainer(trainer)`` builds and adds it in one line.

The window is watched through the trainer instance: each ``compute_loss`` call is a micro-batch (its inputs, labels
included, before Trainer pops them for a ``compute_loss_func``; the random state it starts from; the
``num_items_in_batch`` Trainer counted), the model's forwards are recorded by hooks, ``training_step``'s returns
are what Trainer logs. All of it is put back after the first optimizer step.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
from transformers import TrainerCallback

from gradacc.training import distributed
from gradacc.training.audit import grpo_audit, losses
from gradacc.training.audit.capture import MicroBatch, Patches, RandomState, Recorder, WindowLog, detached
from gradacc.training.audit.measure import Setup, measure
from gradacc.training.audit.verdict import EXACT, NOT_JUDGED, Check, Verdict, publish, scheduler_check
from gradacc.training.audit.vocabulary import CheckName, Integration
from gradacc.training.compat import transformers as compat_transformers
from gradacc.training.compat import trl
from gradacc.training.tolerances import LOGGED

# Trainers whose objective is not a loss of the model's outputs against labels: reinforcement learning's surrogates,
# normalised their own way over generation batches. Not judged against a loss they do not train on.
# (GRPOTrainer is judged against its loss_type's documented objective: gradacc.training.audit.grpo_audit.)
RL_TRAINERS = {"RLOOTrainer": "a REINFORCE leave-one-out surrogate over sampled completions",
               "PPOTrainer": "a clipped policy-gradient surrogate with a value head",
               "OnlineDPOTrainer": "DPO on completions sampled during training"}
# The modules whose compute_loss and training_step are the frameworks' own (not a user's override).
FRAMEWORKS = ("transformers.", "trl.", "peft.")


def _trainers_own_rule(trainer, inputs: dict) -> losses.LossRule:
    """A trainer whose batches hold no labels: DPO's loss computed by the audit where it knows the objective and
    the reference's log-probs (precomputed, or a reference model); else the trainer's compute_loss, replayed."""
    if trl.trl_class(trainer, ("DPOTrainer",)) is None:
        return losses.LossRule(losses.TRAINER_LOSS)
    objective = losses.DPOObjective.of(trainer.args)
    has_reference = "ref_chosen_logps" in inputs or trl.dpo_reference_model(trainer) is not None
    if objective is None or not has_reference or trl.adds_router_loss(trainer):  # a router loss: not computed here
        return losses.LossRule(losses.TRAINER_LOSS, rows_per_item=2)
    return losses.LossRule(losses.DPO, dpo=objective, rows_per_item=2)


def user_override(trainer) -> str | None:
    """"YourTrainer.compute_loss" (or training_step) when a class of the user's own overrides it; else None."""
    for name in ("compute_loss", "training_step"):
        owner = next((c for c in type(trainer).__mro__ if name in vars(c)), None)
        if owner is not None and not owner.__module__.startswith(FRAMEWORKS):
            return f"{owner.__name__}.{name}"
    return None


def objective_unknown(trainer) -> str | None:
    """Why the trainer's objective is none the audit computes (an RL trainer's), in one sentence; None otherwise."""
    name = trl.trl_class(trainer, RL_TRAINERS)
    if name is None:
        return None
    return (f"the loss is not the model's own: {name} trains on {RL_TRAINERS[name]}, which the audit does not "
            "compute; give it your objective per batch, audit_trainer(trainer, loss_fn=lambda model, batch: (summed "
            "loss, items))")


class _Window:
    """One trainer's first window, watched: micro-batches, forwards, clipping, scheduler, logged loss."""

    def __init__(self, trainer, loss_fn):
        self.trainer = trainer
        self.loss_fn = loss_fn
        self.micro_batches: list[MicroBatch] = []
        self.logged_loss = 0.0
        self.verdict: Verdict | None = None
        self.recorder = Recorder(trainer.model)
        self.recorder.recording = True
        self.log = WindowLog(lambda: len(self.micro_batches), trainer.optimizer, trainer.model)
        self.patches = Patches()
        self._depth = 0

    def start(self) -> None:
        self.log.attach()
        self.patches.method(self.trainer, "compute_loss", self._compute_loss)
        self.patches.method(self.trainer, "training_step", self._training_step)

    def _compute_loss(self, original, model, inputs, *args, **kwargs):
        self._depth += 1
        watching = self._depth == 1 and self.recorder.recording and torch.is_grad_enabled() and model.training
        if watching:
            counted = compat_transformers.num_items_in_batch(args, kwargs)
            micro_batch = MicroBatch(inputs=detached(dict(inputs)), rng=RandomState.take(),
                                     counted_items=None if counted is None else float(counted))
            first = len(self.recorder.forwards)
        result = None
        try:
            result = original(model, inputs, *args, **kwargs)
            return result
        finally:
            self._depth -= 1
            if watching:
                micro_batch.forwards = self.recorder.forwards[first:]
                loss = result[0] if isinstance(result, tuple) else result
                micro_batch.returned = float(loss.detach().float().mean()) if torch.is_tensor(loss) else None
                self.micro_batches.append(micro_batch)

    def _training_step(self, original, *args, **kwargs):
        loss = original(*args, **kwargs)
        if self.recorder.recording:
            self.logged_loss += float(loss)
        return loss

    def measure(self) -> None:
        """Right before the optimizer step: the gradient Trainer is about to apply, judged."""
        self.recorder.recording = False
        trainer, args = self.trainer, self.trainer.args
        accelerator = trainer.accelerator
        if accelerator.scaler is not None and not self.log.clips:  # fp16: unscaled as the step will (it skips then)
            with contextlib.suppress(RuntimeError):
                accelerator.unscale_gradients()
        first_inputs = self.micro_batches[0].inputs if self.micro_batches else {}
        smoothing = float(getattr(args, "label_smoothing_factor", 0.0) or 0.0)
        override = user_override(trainer)
        unknown = objective_unknown(trainer)
        if self.loss_fn is None and trl.trl_class(trainer, ("GRPOTrainer",)):
            self.verdict = grpo_audit.judge(trainer, self.micro_batches, tuple(self.log.clips), _precision(args))
            return
        if self.loss_fn is None and unknown:
            self.verdict = self._not_judged(unknown)
            return
        if self.loss_fn is not None:
            rule, custom = losses.LossRule(losses.USER_LOSS, loss_fn=self.loss_fn), "loss_fn"
        elif "labels" not in first_inputs:
            rule, custom = _trainers_own_rule(trainer, first_inputs), override or "compute_loss"
        elif override and override.endswith(".compute_loss"):  # judged against the model's own loss, from its
            rule, custom = losses.LossRule(None, label_smoothing=smoothing), override  # logits: is it that loss?
        elif trainer.compute_loss_func is not None:
            rule, custom = losses.LossRule(None, compute_loss_func=trainer.compute_loss_func,
                                           label_smoothing=smoothing), "compute_loss_func"
        else:  # Trainer's own loss, its label smoothing included
            rule, custom = losses.LossRule(None, label_smoothing=smoothing), None
        wrapped = trainer.model_wrapped
        setup = Setup(who=Integration.TRAINER, module=trainer.model, recorder=self.recorder,
                      k=args.gradient_accumulation_steps, num_processes=args.world_size, precision=_precision(args),
                      rule=rule, custom_loss=custom, trainer=trainer,
                      no_sync=wrapped.no_sync if wrapped is not trainer.model and hasattr(wrapped, "no_sync")
                      else contextlib.nullcontext, model_name=losses.model_name(trainer.model), override=override)
        counted = next((m.counted_items for m in self.micro_batches if m.counted_items is not None), None)
        self.verdict = measure(setup, self.micro_batches, self.log, counted_items=counted)

    def _not_judged(self, meaning: str) -> Verdict:
        args = self.trainer.args
        return Verdict(who=Integration.TRAINER, kind=None, k=args.gradient_accumulation_steps,
                       micro_batches=len(self.micro_batches), num_processes=args.world_size,
                       precision=_precision(args), gradient=NOT_JUDGED,
                       meaning=meaning, model=losses.model_name(self.trainer.model))

    def finish(self, state) -> Verdict | None:
        self.log.detach()
        self.patches.undo()
        self.recorder.remove()
        verdict = self.verdict
        if verdict is None:
            return None
        checks = [scheduler_check(self.log.scheduler_steps,
                                  "let Trainer step it (once per optimizer step), not training_step or compute_loss")]
        if verdict.window_loss:
            # Trainer logs the mean over processes of what each added up.
            logged = distributed.sum_over_ranks([self.logged_loss], self.trainer.args.device)[0] \
                / max(1, self.trainer.args.world_size)
            checks.append(_logged_loss_check(logged, verdict, user_override(self.trainer)))
        verdict = replace(verdict, checks=verdict.checks + tuple(checks))
        state.log_history.append({"gradacc_audit": verdict.as_dict(), "step": state.global_step})
        return verdict


def _precision(args) -> str:
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def _logged_loss_check(logged: float, verdict: Verdict, override: str | None) -> Check:
    """The loss Trainer logs for the window against the window's mean loss; when it is off by the gradient's own
    scale, one cause explains both."""
    router = verdict.router  # an MoE model logs its router loss term too: coef × each micro-batch's
    expected = verdict.window_loss + (router.coefficient * router.micro_batch_mean if router else 0.0)
    ratio = logged / expected
    detail = (f"the logged loss is {ratio:.4g}× the window's mean loss{' with its router term' if router else ''} "
              f"({logged:.4g} vs {expected:.4g})")
    tolerance = LOGGED[verdict.precision]
    if abs(ratio - 1) <= tolerance:
        return Check(CheckName.LOGGED_LOSS, True, detail)
    if router is not None and router.cause != EXACT and abs(
            logged - verdict.window_loss - router.fit.scale * router.coefficient * router.micro_batch_mean) \
            <= tolerance * abs(logged):
        return Check(CheckName.LOGGED_LOSS, False, detail + ", by the router loss term's own cause")
    if verdict.fit is not None and abs(ratio - verdict.fit.scale) <= tolerance * max(1.0, ratio):
        return Check(CheckName.LOGGED_LOSS, False, detail + ", by the gradient's own cause")
    return Check(CheckName.LOGGED_LOSS, False, detail, f"return from {override or 'training_step'} the loss on the "
                 "scale it "
                 "is back-propagated (Trainer logs the sum of what training_step returns over the window)")


class AccumulationAudit(TrainerCallback):
    """A ``TrainerCallback`` bound to ``trainer`` that audits its run's first optimizer step: ``verdict`` (a
    ``gradacc.audit.Verdict``) after it, also logged, in ``trainer.state.log_history`` (``{"gradacc_audit": ...}``)
    and, with ``json_path``, in a JSON file. ``audit_trainer(trainer)`` adds one.

    ``loss_fn(model, batch)``: the mean loss over a batch's items, for a trainer whose loss the audit cannot
    compute from the model's output (default: the model's own kind of loss, from its logits and labels).
    """

    def __init__(self, trainer=None, *, loss_fn=None, json_path=None):
        if trainer is None:  # callbacks=[AccumulationAudit()], as callbacks are usually added: it needs the trainer
            raise TypeError("AccumulationAudit needs its trainer, which a callback list cannot give it: build the "
                            "Trainer, then audit = gradacc.audit.audit_trainer(trainer)")
        self.trainer = trainer
        self.loss_fn = loss_fn
        self.json_path = json_path
        self.verdict: Verdict | None = None
        self._window: _Window | None = None
        self._done = False

    def on_train_begin(self, args, state, control, **kwargs):
        self._window, self._done, self.verdict = None, False, None  # once per run, also when train() runs again

    def on_step_begin(self, args, state, control, **kwargs):
        if not self._done and self._window is None:
            self._window = _Window(self.trainer, self.loss_fn)
            self._window.start()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._window is not None and self._window.verdict is None:
            self._window.measure()

    def on_step_end(self, args, state, control, **kwargs):
        self._end(state)

    def on_train_end(self, args, state, control, **kwargs):
        self._end(state)  # stopped inside the first window

    def _end(self, state) -> None:
        if self._window is None:
            return
        self.verdict = self._window.finish(state)
        self._window, self._done = None, True
        if self.verdict is not None and state.is_world_process_zero:  # one line for the run, not one per rank
            publish(self.verdict, self.json_path)


def audit_trainer(trainer, *, loss_fn=None, json_path=None) -> AccumulationAudit:
    """``audit = audit_trainer(trainer)`` before ``trainer.train()``; ``audit.verdict`` after its first step."""
    audit = AccumulationAudit(trainer, loss_fn=loss_fn, json_path=json_path)
    trainer.add_callback(audit)
    return audit
