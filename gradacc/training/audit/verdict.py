"""The verdict, a typed immutable value: the step's gradient projected on the reference (its scale, what no scale
explains, the scale's measured noise), the one cause that explains it in its own words, the fix for this model and
this way of training, and the other checks of the window (clipping, scheduler, zero_grad, logged loss, syncs).

The scale is judged on its own: exact when |s − 1| is within Z standard errors of s (measured from the residual:
bf16's and fp16's rounding noise is measured on the run, not assumed) or within the precision's floor; a plain
scale is then named by what it equals (k, 1/k, j/k, the items counted ÷ the items there are). What no scale
explains is judged by the precision's noise ceiling; above it, the micro-batches' weights are fitted.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from gradacc.training.audit.vocabulary import Cause, CheckName, Integration, LossKind, words
from gradacc.training.tolerances import FLOOR, NOISE, Z

logger = logging.getLogger("gradacc.audit")

# The causes by their short names (gradacc.training.audit.vocabulary.Cause; tests and benchmarks compare them).
EXACT, K_TIMES, DIVIDED_TWICE, SHORT_WINDOW = Cause.EXACT, Cause.K_TIMES, Cause.DIVIDED_TWICE, Cause.SHORT_WINDOW
MISCOUNTED, WEIGHTED, CLIPPED, ZEROED = Cause.MISCOUNTED, Cause.WEIGHTED, Cause.CLIPPED, Cause.ZEROED
SCALED, OTHER_LOSS, NOT_JUDGED = Cause.SCALED, Cause.OTHER_LOSS, Cause.NOT_JUDGED
BY_DESIGN, GENERATION_COUNT = Cause.BY_DESIGN, Cause.GENERATION_COUNT
# Causes that are no problem of the run: the gradient is what its documented objective gives.
NOT_A_PROBLEM = (EXACT, NOT_JUDGED, BY_DESIGN)
ROUTER_CAUSES = (Cause.ROUTER_K_TIMES, Cause.ROUTER_SCALED, Cause.ROUTER_OTHER)


@dataclass(frozen=True)
class Fit:
    """The step's gradient g against a reference r: g ≈ scale·r, the residual ‖g − s·r‖ / ‖r‖, the standard error
    of the scale, and the relative error ‖g − r‖ / ‖r‖."""

    scale: float
    residual: float
    se: float
    rel_error: float
    precision: str

    @property
    def tolerance(self) -> float:
        return max(Z * self.se, FLOOR[self.precision])

    @property
    def plain_scale(self) -> bool:
        return self.residual <= NOISE[self.precision]

    def near(self, value: float) -> bool:
        return abs(self.scale - value) <= self.tolerance * max(1.0, value)


@dataclass(frozen=True)
class RouterFit:
    """An MoE model's router (load-balancing) loss term in the step, judged apart from the main loss: on the router
    weights, the step's gradient less the main loss's part (``main_scale`` × its reference) against ``coefficient`` ×
    the gradient of the window's micro-batches' mean router loss."""

    coefficient: float        # the config's router_aux_loss_coef: the objective's
    forward_coefficient: float  # the model's own attribute: what each forward adds (the fix divides it)
    # The router term's scale (1: the micro-batches' mean) and what no scale explains; for a right step, found in one
    # replay of both terms together, the step against their sum on the router weights (1: both right).
    fit: Fit
    main_scale: float         # the main loss's scale in the two-term fit over the whole gradient
    cause: Cause              # EXACT or one of ROUTER_CAUSES
    meaning: str
    fix: str | None
    off_on_router_weights: float  # ‖g − reference‖ / ‖reference‖ on the router weights (both terms)
    micro_batch_mean: float   # the micro-batches' router losses, averaged (all processes)
    window_loss: float        # the router loss of the window's tokens taken as one batch (all processes)


@dataclass(frozen=True)
class Check:
    """One more thing the window did: ``ok`` None when there was nothing to judge."""

    name: CheckName
    ok: bool | None
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class Verdict:
    who: Integration
    kind: LossKind | None          # the model's loss kind
    k: int                         # the configured accumulation steps
    micro_batches: int             # in the audited window (this process)
    num_processes: int
    precision: str
    gradient: Cause
    meaning: str
    fix: str | None = None
    fit: Fit | None = None
    weighted_fit: Fit | None = None  # against "each micro-batch's mean counted equally", when it was fitted
    items: tuple = ()              # per micro-batch, this process
    micro_batch_losses: tuple = ()  # per micro-batch, its loss summed over its items in the replay (this process)
    reference: str = ""            # the user's own loss code it was judged against ("" when computed from the logits)
    window_items: float | None = None
    counted_items: float | None = None
    window_loss: float | None = None  # the window's mean loss over its items (all processes)
    clips: tuple = ()
    checks: tuple = ()
    replay: str = ""
    reference_seconds: float = 0.0
    audit_seconds: float = 0.0
    model: str = ""
    router: RouterFit | None = None  # an MoE model's router loss term, when its forward adds one

    @property
    def judged(self) -> bool:
        return self.gradient != NOT_JUDGED

    @property
    def problems(self) -> tuple:
        gradient = () if self.gradient in NOT_A_PROBLEM else (f"gradient {words(self.gradient)}",)
        return gradient + tuple(check.detail for check in self.checks if check.ok is False)

    @property
    def ok(self) -> bool:
        """Judged, and nothing found wrong."""
        return self.judged and not self.problems

    @property
    def line(self) -> str:
        return summary_line(self)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(ok=self.ok, judged=self.judged, problems=list(self.problems), line=self.line,
                   gradient_words=words(self.gradient))
        return out

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)


def summary_line(verdict: Verdict) -> str:
    where = f"gradacc audit ({verdict.who}{', ' + verdict.model if verdict.model else ''})"
    if not verdict.judged:
        return f"{where}: not judged — {verdict.meaning}"
    against = f"; judged against {verdict.reference}" if verdict.reference else ""
    if verdict.ok:
        fit = verdict.fit
        return (f"{where}: {words(verdict.gradient)} — {verdict.meaning} (scale {fit.scale:.5g} ± {fit.se:.1g}, "
                f"relative error {fit.rel_error:.1e}, k={verdict.k}, {verdict.precision}{against})")
    parts = []
    if verdict.gradient != EXACT:
        parts.append(f"gradient {words(verdict.gradient)}: {verdict.meaning}" + (f". Fix: {verdict.fix}"
                                                                                 if verdict.fix else ""))
    for check in verdict.checks:
        if check.ok is False:
            parts.append(check.detail + (f". Fix: {check.fix}" if check.fix else ""))
    return f"{where}: " + "; ".join(parts) + against


def publish(verdict: Verdict, json_path=None) -> None:
    """The verdict's line to the log, and the whole verdict to ``json_path`` (one JSON object)."""
    logger.warning(verdict.line)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as file:
            json.dump(verdict.as_dict(), file, default=str)


def scheduler_check(steps: int, fix: str, expected: int = 1) -> Check:
    """The learning-rate scheduler's steps in the window against the ``expected`` per optimizer step (1; one per
    process for a scheduler Accelerate prepared); ``fix``: in the integration's own terms."""
    if not steps:
        return Check(CheckName.SCHEDULER, None, "no learning-rate scheduler stepped in the window")
    if steps == expected:
        return Check(CheckName.SCHEDULER, True, "the scheduler stepped once per optimizer step" if steps == 1 else
                     f"the scheduler stepped {steps}× per optimizer step, as it should")
    said = f" (expected {expected})" if expected != 1 else ""
    return Check(CheckName.SCHEDULER, False, f"the scheduler stepped {steps}× per optimizer step{said}: the schedule "
                 f"runs {steps / expected:g}× too fast", fix)


def clip_check(clips: tuple, micro_batches: int, who: Integration) -> Check:
    """Clipping, as what it did: the norm before and after each call, and after which micro-batch it ran."""
    if not clips:
        return Check(CheckName.CLIPPING, None, "no clipping in the window")
    said = ", ".join(f"after micro-batch {c.after_micro_batch}: {c.norm_before:.3g} → {c.norm_after:.3g}"
                     for c in clips)
    early = [c for c in clips if c.after_micro_batch < micro_batches]
    if not early:
        return Check(CheckName.CLIPPING, True, f"clipped once, after the window ({said})")
    fix = {Integration.TRAINER: "let Trainer clip once per window (TrainingArguments(max_grad_norm=...)), not "
                                "training_step",
           Integration.LOOP: "clip once per window: after the window's last backward, right before "
                             "optimizer.step()"}.get(
        who, "clip only when accelerator.sync_gradients, right before optimizer.step()")
    return Check(CheckName.CLIPPING, False, f"clipping ran inside the window ({said})", fix)

