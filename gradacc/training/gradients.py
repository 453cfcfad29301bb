"""One gradient against another, tensor by tensor: what the equivalence check and the audit both measure.

In the training layer because the audit (training.audit) judges a run while it trains; analysis.equivalence
reads the same sums.
"""

from __future__ import annotations

from gradacc.errors import GradaccError


def gradient_sums(gradient: dict, reference: dict, gradient_scale: float = 1.0) -> dict:
    """Sums over all parameters of g = ``gradient`` × ``gradient_scale`` and r = ``reference``, taken tensor by
    tensor (no copy of a whole gradient: on a 20M-parameter model concatenating costs a good part of a
    window's backward): ‖g − r‖², ‖r‖², g·r and ‖g‖², in float64."""
    import torch

    if set(gradient) != set(reference):
        raise GradaccError("The accumulated and full-batch gradients cover different parameters.", "backend")
    parts = []
    for name in sorted(reference):
        g, r = gradient[name], reference[name]
        difference = torch.add(r, g, alpha=-gradient_scale)  # r − s·g: one pass, one temporary
        parts.append(torch.stack([torch.dot(difference, difference), torch.dot(r, r), torch.dot(g, r),
                                  torch.dot(g, g)]).double())
    difference, reference_sq, dot, own = (float(x) for x in torch.stack(parts).sum(dim=0))
    return {"difference": difference, "reference": reference_sq, "dot": dot * gradient_scale,
            "own": own * gradient_scale ** 2}
