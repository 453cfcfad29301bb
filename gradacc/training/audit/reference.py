"""The reference: the gradient the audited step should apply, recomputed on the window's own micro-batches at the
same weights, each micro-batch replayed from the random state the run used for it (CPU and CUDA generators), so
dropout masks match whatever draws them (``nn.Dropout``, functional dropout in attention, SDPA's ``dropout_p``).
Each replay's output must equal the recorded one bit for bit (its fingerprint), or the audit says so instead of
judging. The gradient lands in the parameters' ``.grad`` (no copy); ``set_aside`` puts the run's gradients,
buffers and random states back afterwards, so the run goes on bit-identical to a run without the audit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from gradacc.training.audit import losses, router
from gradacc.training.audit.capture import MicroBatch, RandomState, Recorder, detached
from gradacc.training.compat import transformers as compat_transformers
from gradacc.training.compat import trl
from gradacc.training.tolerances import AGREE



class NotReplayable(Exception):
    """The window cannot be replayed or its loss not recomputed: the reason, in the user's words."""


@dataclass(frozen=True)
class Reference:
    """What one replay of the window gave (its gradient is in ``.grad`` meanwhile)."""

    kind: str
    items: tuple            # per micro-batch (this process)
    summed_loss: float      # the window's loss summed over its items (this process)
    losses: tuple = ()      # per micro-batch, its loss summed over its items (this process)


@contextlib.contextmanager
def set_aside(module, extra_state=None):
    """The run's gradients and buffers (BatchNorm statistics) put aside and back, its random states restored, and
    ``extra_state`` (an object whose ``__dict__`` entries a replay may change, e.g. TRL's metrics) copied back."""
    params = [p for p in module.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    rng = RandomState.take()
    kept = trl.kept_state(extra_state)
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
        trl.put_back(extra_state, kept)


@contextlib.contextmanager
def as_recorded(forward_autocast):
    """Autocast exactly as the recorded forward ran under it (on, with its dtype, or off)."""
    with contextlib.ExitStack() as stack:
        for device, enabled, dtype in forward_autocast:
            stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled))
        yield


class Replayer:
    """Replays micro-batches through ``module`` under ``rule`` (losses.LossRule): ``count`` their items first (from
    their labels, without running the model), then ``replay`` them into ``.grad``."""

    def __init__(self, module, recorder: Recorder, rule: losses.LossRule, precision: str, trainer=None):
        self.module, self.recorder, self.rule, self.trainer = module, recorder, rule, trainer
        self.tolerance = AGREE[precision]
        self.kind = rule.kind
        # With a compute_loss_func and label smoothing configured: per micro-batch, does its mean equal the smoothed
        # loss computed here? (Trainer calls compute_loss_func instead of its label smoother.)
        self.smoothing_kept: list[bool] = []
        # An MoE model whose forward adds its router loss: its settings (compat.transformers.RouterSettings), and
        # what the last replay gave of it: Σ over micro-batches of ∇(router loss), each micro-batch's expert_sums.
        self.router = compat_transformers.router_loss_settings(losses.base_model(module))
        self.router_gradient: dict = {}
        self.router_sums: list = []
        self.router_dropped: list[bool] = []  # per micro-batch: a compute_loss_func's loss holds no router term
        self._aux = None

    def count(self, micro_batches: list[MicroBatch]) -> list[int]:
        """Each micro-batch's items: as its loss counts them (the kind's rule), or its rows for a trainer's own loss;
        None for the user's ``loss_fn``, which gives them as it is replayed."""
        if self.kind == losses.USER_LOSS:
            return None
        if self.kind in (losses.TRAINER_LOSS, losses.DPO):  # rows, or pairs of rows
            return [self._user_count(m) // self.rule.rows_per_item for m in micro_batches]
        labels, shift = _labels(micro_batches[0])
        if labels is None:
            raise NotReplayable("the batch holds no labels, so the loss cannot be recomputed from the model's output: "
                                "pass loss_fn=lambda model, batch: (its loss summed over the batch's items, the "
                                "items) to the audit")
        counting = losses.model_kind(self.module, labels)
        if counting is None:  # a model of the user's own: its kind from its own loss, on the first micro-batch
            with torch.no_grad():
                output = self._forward(1, micro_batches[0])
                self._aux = self._router_loss(micro_batches[0], output)  # in its loss beside the kind's
            counting = self._find_kind(micro_batches[0], output)
            self._aux = None
        return [losses.items(counting, *_labels(m)) for m in micro_batches]

    def replay(self, micro_batches: list[MicroBatch], divisors: list[float], with_router: bool = True,
               router_weight: float | None = None) -> Reference:
        """Back-propagate each micro-batch's loss summed over its items ÷ its divisor (the window's items: the
        reference; its items × the micro-batches: their means counted equally) into ``.grad``. An MoE model's router
        loss, computed here: with ``router_weight``, added to it at that weight, one backward for both (the right
        objective's gradient); otherwise apart (``router_gradient``: its own backward through the same forward), or
        not at all (``with_router`` False). ``router_sums`` keeps each micro-batch's expert sums either way."""
        items, summed_losses = [], []
        self.router_gradient, self.router_sums = {}, []
        for index, (micro_batch, divisor) in enumerate(zip(micro_batches, divisors), start=1):
            summed, count = self._one(index, micro_batch)
            aux, self._aux = self._aux, None
            loss = summed / divisor
            if aux is not None and router_weight is not None:
                loss = loss + router_weight * aux
            apart = aux is not None and with_router and router_weight is None
            loss.backward(retain_graph=apart)
            if apart:
                self._router_backward(aux)
            items.append(count)
            summed_losses.append(float(summed.detach()))
        return Reference(self.kind, tuple(items), sum(summed_losses), tuple(summed_losses))

    def router_apart(self, both: dict, weight: float) -> None:
        """``router_gradient`` (Σ over micro-batches of ∇ router loss) from ``both``, the gradient of a replay at
        ``router_weight``, less the main loss's now in ``.grad`` (a replay without it): a forward and one backward
        instead of a forward and two."""
        main = {name: p.grad.detach().reshape(-1) for name, p in self.module.named_parameters() if p.grad is not None}
        self.router_gradient = {name: (g - main[name]) / weight if name in main else g / weight
                                for name, g in both.items()}

    def _router_backward(self, aux) -> None:
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad(aux, [p for _, p in named], allow_unused=True)
        for (name, _), grad in zip(named, grads):
            if grad is not None:
                flat = grad.detach().reshape(-1)
                self.router_gradient[name] = self.router_gradient[name] + flat if name in self.router_gradient \
                    else flat

    def _router_loss(self, micro_batch: MicroBatch, output, given_labels: bool = True):
        """The micro-batch's router loss, computed here, when the model's forward added one to its loss (it does
        when given labels, with router logits on: not when Trainer popped them for a compute_loss_func); None
        otherwise; ``given_labels`` False: a compute_loss_func adds it. It must equal the model's own ``aux_loss``."""
        logits = getattr(output, "router_logits", None)
        if self.router is None or not logits or given_labels and micro_batch.trained.kwargs.get("labels") is None:
            return None
        sums = router.expert_sums(logits, self.router.per_token, micro_batch.trained.kwargs.get("attention_mask"))
        aux = router.load_balancing(sums)
        own = getattr(output, "aux_loss", None)
        own = own.detach() if torch.is_tensor(own) else None
        value = float(aux.detach())
        if own is not None and abs(float(own) - value) > self.tolerance * max(1.0, abs(value)):
            raise NotReplayable(f"the model's router loss (aux_loss {float(own):.6g}) is not the load-balancing loss "
                                f"the audit computes from its router logits ({value:.6g}), so the router term "
                                "cannot be told apart from the main loss")
        self.router_sums.append(sums.detach())
        return aux

    def _one(self, index: int, micro_batch: MicroBatch) -> tuple[torch.Tensor, int]:
        if self.kind == losses.TRAINER_LOSS:
            return self._trainer_loss(index, micro_batch)
        if self.kind == losses.DPO:
            return self._dpo_loss(index, micro_batch)
        forward = micro_batch.trained
        labels, shift = _labels(micro_batch)
        if self.kind == losses.USER_LOSS:
            batch = micro_batch.inputs or forward.kwargs or forward.args
            result = self._run(index, micro_batch, forward.rng, forward.autocast,
                               lambda: self.rule.loss_fn(self.module, detached(batch)), first_only=True)
            if isinstance(result, (tuple, list)):  # (the loss summed over the batch's items, its items)
                summed, count = result
                return summed, float(count)
            count = self._user_count(micro_batch)  # one tensor: the mean over the batch's rows
            return result * count, count
        output = self._forward(index, micro_batch)
        self._aux = self._router_loss(micro_batch, output)
        if self.kind is None:
            self.kind = self._find_kind(micro_batch, output)
        if self.rule.compute_loss_func is not None:
            count = losses.items(self.kind, labels, shift)
            mean = self.rule.compute_loss_func(output, labels, num_items_in_batch=count)
            if self.rule.label_smoothing:
                with torch.no_grad():
                    smoothed, _ = losses.summed(self.kind, output, labels, shift, self.rule.label_smoothing)
                self.smoothing_kept.append(abs(float(mean) * count - float(smoothed))
                                           <= self.tolerance * max(1.0, abs(float(smoothed))))
            if self.router is not None and getattr(output, "router_logits", None):
                # Trainer popped the labels, so the model added no router loss: does the function add it?
                with torch.no_grad():
                    plain, _ = losses.summed(self.kind, output, labels, shift, self.rule.label_smoothing)
                dropped = abs(float(mean) * count - float(plain)) <= self.tolerance * max(1.0, abs(float(plain)))
                self.router_dropped.append(dropped)
                if not dropped:  # it adds a router term: judged as the model's own, apart from the main loss
                    self._aux = self._router_loss(micro_batch, output, given_labels=False)
                    return losses.summed(self.kind, output, labels, shift, self.rule.label_smoothing)
            return mean * count, count
        return losses.summed(self.kind, output, labels, shift, self.rule.label_smoothing)

    def _forward(self, index: int, micro_batch: MicroBatch):
        forward = micro_batch.trained
        return self._run(index, micro_batch, forward.rng, forward.autocast,
                         lambda: self.module(*forward.args, **forward.kwargs), first_only=True)

    def _find_kind(self, micro_batch: MicroBatch, output) -> str:
        labels, shift = _labels(micro_batch)
        # the router term the model's .loss holds beside the kind's loss
        router_part = self.router.forward_coefficient * float(self._aux.detach()) if self._aux is not None else 0.0
        kind = losses.find_kind(self.module, output, labels, shift,
                                micro_batch.trained.kwargs.get("num_items_in_batch"), self.tolerance, router_part)
        if kind is None:
            raise NotReplayable(f"the loss of {type(losses.base_model(self.module)).__name__} is none the audit "
                                "computes by hand: pass loss_fn=lambda model, batch: (its loss summed over the "
                                "batch's items, the items) to the audit")
        return kind

    def _user_count(self, micro_batch: MicroBatch) -> int:
        labels, shift = _labels(micro_batch) if micro_batch.trained is not None else (
            (micro_batch.inputs or {}).get("labels"), None)
        kind = losses.model_kind(self.module, labels) if labels is not None else None
        if kind is not None and self.kind == losses.USER_LOSS:
            return losses.items(kind, labels, shift)
        forward = micro_batch.trained
        return _rows(micro_batch.inputs or forward.kwargs or dict(enumerate(forward.args)))

    def _dpo_loss(self, index: int, micro_batch: MicroBatch):
        """DPO's loss computed here: the policy's forward replayed (its output checked), each sequence's log-prob
        summed over its completion, the frozen reference's log-probs (precomputed in the batch, or the reference
        model's forward, which draws no randomness in eval mode), and the objective of the trainer's DPOConfig."""
        forward = micro_batch.trained
        output = self._forward(index, micro_batch)
        chosen, rejected = output.log_probs.float().sum(dim=1).chunk(2)  # fused head: 0 where not a completion
        inputs = micro_batch.inputs or {}
        if "ref_chosen_logps" in inputs:
            ref_chosen, ref_rejected = inputs["ref_chosen_logps"].float(), inputs["ref_rejected_logps"].float()
        else:
            kwargs = {k: v for k, v in forward.kwargs.items() if k != "output_router_logits"}
            with torch.no_grad(), as_recorded(forward.autocast):
                reference = trl.dpo_reference_model(self.trainer)(*forward.args, **kwargs)
            ref_chosen, ref_rejected = reference.log_probs.float().sum(dim=1).chunk(2)
        return self.rule.dpo.summed(chosen, rejected, ref_chosen, ref_rejected), int(chosen.numel())

    def _trainer_loss(self, index: int, micro_batch: MicroBatch):
        """A trainer whose loss is its own (no labels in the batch: TRL's DPO): its compute_loss, replayed whole from
        the random state it started from, is the micro-batch's mean; its items are the batch's rows."""
        trainer, inputs = self.trainer, micro_batch.inputs
        mean = self._run(index, micro_batch, micro_batch.rng, (),
                         lambda: _call_compute_loss(trainer, self.module, detached(inputs)))
        count = _rows(inputs) // self.rule.rows_per_item
        return mean * count, count

    def _run(self, index, micro_batch, rng, autocast, call, first_only=False):
        """``call()`` from ``rng`` under ``autocast``, its forwards' outputs checked against the recorded ones."""
        recorded = [f.output for f in micro_batch.forwards if f.output is not None]
        if first_only:
            recorded = [micro_batch.trained.output]
        rng.put_back_torch()
        self.recorder.replayed = []
        try:
            with as_recorded(autocast), torch.enable_grad():
                result = call()
        finally:
            replayed, self.recorder.replayed = self.recorder.replayed, None
        replayed = replayed[:len(recorded)] if first_only else replayed
        if len(replayed) != len(recorded) or not all(
                r is None or r.matches(p) for r, p in zip(recorded, replayed)):
            raise NotReplayable(f"the model's randomness could not be replayed: micro-batch {index} gave other outputs "
                                "from the same random state (a generator of its own, or a non-deterministic kernel), "
                                "so there is no reference to compare with")
        return result


def _labels(micro_batch: MicroBatch):
    """(labels, shift_labels) of a micro-batch: what its forward was given, else what Trainer's compute_loss was
    (it pops the labels for a compute_loss_func)."""
    forward, inputs = micro_batch.trained, micro_batch.inputs or {}
    kwargs = forward.kwargs if forward is not None else {}
    return kwargs.get("labels", inputs.get("labels")), kwargs.get("shift_labels", inputs.get("shift_labels"))


def _call_compute_loss(trainer, module, inputs):
    with trainer.compute_loss_context_manager():
        return trainer.compute_loss(module, inputs)


def _rows(batch: dict) -> int:
    first = next((v for v in batch.values() if torch.is_tensor(v) and v.dim() > 0), None)
    if first is None:
        raise NotReplayable("the batch holds no tensor to count its rows by: pass loss_fn to the audit")
    return int(first.shape[0])

