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

logger = logging.getLogger("gradacc.audit")

Z = 4.0
# |s − 1| always taken as exact: fp32 recomputation order (~1e-7), bf16/fp16 replays of a correct run measured within
# 6e-5 of 1 and the bias of bf16 against fp32 within 1.2e-3 (docs/audit.md); a 1 % error stays well outside.
FLOOR = {"fp32": 1e-4, "bf16": 2e-3, "fp16": 2e-3}
# Residual ‖g − s·r‖ / ‖r‖ taken as rounding noise: fp32 replays agree to ~1e-7; bf16 replays of correct runs
# measured at most 0.0047 (4× that is the ceiling). Above it the step is no scale of the reference.
NOISE = {"fp32": 1e-3, "bf16": 2e-2, "fp16": 2e-2}

EXACT = "exact"
K_TIMES = "k× too large"
DIVIDED_TWICE = "k× too small"
SHORT_WINDOW = "short window ÷ configured k"
MISCOUNTED = "items miscounted"
WEIGHTED = "weighted by micro-batch, not by item"
CLIPPED = "changed by clipping"
ZEROED = "zeroed inside the window"
SCALED = "scaled"
OTHER_LOSS = "not the window's mean loss"
NOT_JUDGED = "not judged"


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
class Check:
    """One more thing the window did: ``ok`` None when there was nothing to judge."""

    name: str
    ok: bool | None
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class Verdict:
    who: str                       # "trainer", "accelerate" or "loop"
    kind: str | None               # the model's loss kind (losses.KINDS)
    k: int                         # the configured accumulation steps
    micro_batches: int             # in the audited window (this process)
    num_processes: int
    precision: str
    gradient: str                  # the cause, one of the names above
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

    @property
    def judged(self) -> bool:
        return self.gradient != NOT_JUDGED

    @property
    def problems(self) -> tuple:
        gradient = () if self.gradient in (EXACT, NOT_JUDGED) else (f"gradient {self.gradient}",)
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
        out.update(ok=self.ok, judged=self.judged, problems=list(self.problems), line=self.line)
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
        return (f"{where}: exact — {verdict.meaning} (scale {fit.scale:.5g} ± {fit.se:.1g}, relative error "
                f"{fit.rel_error:.1e}, k={verdict.k}, {verdict.precision}{against})")
    parts = []
    if verdict.gradient != EXACT:
        parts.append(f"gradient {verdict.gradient}: {verdict.meaning}" + (f". Fix: {verdict.fix}" if verdict.fix
                                                                          else ""))
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


def clip_check(clips: tuple, micro_batches: int, who: str) -> Check:
    """Clipping, as what it did: the norm before and after each call, and after which micro-batch it ran."""
    if not clips:
        return Check("clipping", None, "no clipping in the window")
    said = ", ".join(f"after micro-batch {c.after_micro_batch}: {c.norm_before:.3g} → {c.norm_after:.3g}"
                     for c in clips)
    early = [c for c in clips if c.after_micro_batch < micro_batches]
    if not early:
        return Check("clipping", True, f"clipped once, after the window ({said})")
    fix = {"trainer": "let Trainer clip once per window (TrainingArguments(max_grad_norm=...)), not training_step",
           "loop": "clip once per window: after the window's last backward, right before optimizer.step()"}.get(
        who, "clip only when accelerator.sync_gradients, right before optimizer.step()")
    return Check("clipping", False, f"clipping ran inside the window ({said})", fix)

