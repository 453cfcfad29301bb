"""One GRPO loss type's gradient scale moving with k, measured: TRL's ``GRPOTrainer`` at a fixed
``steps_per_generation``, for each k, trains one generation's worth of optimizer steps (steps_per_generation ÷ k) on
the bench's tiny Qwen2 with a toy reward; each step's gradient is projected on the gradient of its window's
documented objective (``gradacc bench grpo``'s float64 replay), and gradacc's audit gives its verdict on the first
step. For ``dapo`` (TRL's default) every step is 1.000× only at k = steps_per_generation: TRL divides each window by
the generation batch's token count × k / steps_per_generation, and the windows of a generation hold uneven tokens.

The Equivalence page shows it (``gradacc.app.equivalence_view.grpo_*``), on the server's own queue of checks.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class GRPOCase:
    """What one check trains: each k at one steps_per_generation (a multiple of every k)."""

    loss_type: str = "dapo"
    steps_per_generation: int = 4
    ks: tuple = (1, 2, 4)


def key(case: GRPOCase) -> tuple:
    return (case.loss_type, case.steps_per_generation, case.ks)


def check(case: GRPOCase, one_run: Callable[..., list[dict]]) -> dict:
    """Per k, each optimizer step of one generation: its scale against the window's documented objective (scale,
    residual, window and generation tokens), and the audit's verdict on the first step. ``one_run``: ``gradacc bench
    grpo``'s run of a real GRPOTrainer (given by the caller: the bench is a layer above this one)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="gradacc-grpo-scale-") as output_dir:
        for k in case.ks:
            steps = case.steps_per_generation // k
            for row in one_run(case.loss_type, k, case.steps_per_generation, steps, output_dir):
                rows.append({name: row.get(name) for name in ("k", "step", "scale", "residual", "window_tokens",
                                                              "generation_batch_tokens", "audit")})
    return {"loss_type": case.loss_type, "steps_per_generation": case.steps_per_generation, "ks": list(case.ks),
            "rows": rows}


def headline(report: dict) -> str:
    """What the check shows, in one sentence, every number in it measured."""
    spg, loss_type = report["steps_per_generation"], report["loss_type"]
    parts = []
    for k in report["ks"]:
        scales = [r["scale"] for r in report["rows"] if r["k"] == k and r["scale"] is not None]
        said = ", ".join(f"{s:.3f}×" for s in scales)
        parts.append(f"k = {k}: {said}")
    exact = [k for k in report["ks"] if all(abs(r["scale"] - 1) < 1e-4 for r in report["rows"]
                                            if r["k"] == k and r["scale"] is not None)]
    where = (f"exact only at k = {', '.join(map(str, exact))}" if exact else "exact at no k")
    return (f"{loss_type} at steps_per_generation = {spg}, each step's gradient ÷ its window's documented objective's "
            f"({'; '.join(parts)}): {where}. Each step is divided by the generation batch's token count × "
            f"k / {spg}, the window's own count only when k = steps_per_generation; the fix is "
            "steps_per_generation = gradient_accumulation_steps.")


def table(report: dict) -> list[dict]:
    return [{"k": r["k"], "step": r["step"], "scale": r["scale"], "residual": r["residual"],
             "window tokens": r["window_tokens"], "generation tokens": ",".join(map(str, r["generation_batch_tokens"])),
             "audit (first step)": (r["audit"] or {}).get("cause", "")} for r in report["rows"]]
