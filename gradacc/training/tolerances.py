"""Every tolerance the audit and the gradient comparison judge by, in one place, each with where its value comes from.

The audit projects the step's gradient g on the reference r: s = g·r / r·r, residual = ‖g − s·r‖ / ‖r‖, and the
standard error of s from the residual itself (gradacc.training.gradients.projection).
"""

from __future__ import annotations

# |s − 1| within Z standard errors of s counts as 1: a normal-tail bound (4σ: about 6e-5 two-sided), chosen so a
# correct run is not flagged by chance and a 1 % error, tens of σ away, is.
Z = 4.0
# |s − 1| always taken as exact: fp32 recomputation order (~1e-7), bf16/fp16 replays of a correct run measured within
# 6e-5 of 1 and the bias of bf16 against fp32 within 1.2e-3 (docs/audit.md); a 1 % error stays well outside.
FLOOR = {"fp32": 1e-4, "bf16": 2e-3, "fp16": 2e-3}
# Residual taken as rounding noise: fp32 replays agree to ~1e-7; bf16 replays of correct runs measured at most 0.0047
# (4× that is the ceiling). Above it the step is no scale of the reference.
NOISE = {"fp32": 1e-3, "bf16": 2e-2, "fp16": 2e-2}
# The model's own loss against the hand-made one (which kind of loss it is): fp32 agrees to ~1e-6 relative; bf16's
# logits round at 2^-8 ≈ 4e-3, so 2e-2 leaves room for a sum over a micro-batch.
AGREE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
# The loss Trainer logs against the window's mean loss: logged in float32 after a float64 sum here; 1e-3 (fp32) is
# 10× the loss's own rounding over a window, 2e-2 the bf16 figure above.
LOGGED = {"fp32": 1e-3, "bf16": 2e-2, "fp16": 2e-2}
# An overriding compute_loss's returned loss against the replayed model loss, micro-batch by micro-batch: the replay is
# bit-identical, so only the float32 sum's order differs (~1e-6); 1e-3 and 3e-2 (bf16) leave a wide margin and still
# part any other objective (a ratio that moves by more than that between micro-batches).
OWN_LOSS = {"fp32": 1e-3, "bf16": 3e-2, "fp16": 3e-2}
# The projection reuses ‖g − e·r‖² (computed in its one pass for each scale e a cause would give) for the residual when
# s lies within this of e: ‖g − s·r‖² = ‖g − e·r‖² − (s − e)²·‖r‖² exactly, and within 1 % the subtraction cancels
# little. Chosen, not measured: beyond it a second pass computes the residual directly.
REUSE_EXPECTED = 0.01
