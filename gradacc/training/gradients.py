"""One gradient against another, tensor by tensor: what the equivalence check and the audit both measure.

In the training layer because the audit (training.audit) judges a run while it trains; analysis.equivalence
reads the same sums.
"""

from __future__ import annotations

from gradacc.errors import GradaccError


# Elements summed at a time: 256 KB of float32, so r − s·g is written to a small reused buffer and read back from
# the cache, with g and r still there for their dots. A whole-tensor temporary (88 MB on all-MiniLM-L6-v2) costs
# fresh pages on every call, more than the dots themselves (BENCHMARKS.md, audit, has the before and after).
CHUNK = 1 << 16


def gradient_sums(gradient: dict, reference: dict, gradient_scale: float = 1.0) -> dict:
    """Sums over all parameters of g = ``gradient`` × ``gradient_scale`` and r = ``reference``, taken piece by
    piece (no copy of a whole gradient): ‖g − r‖², ‖r‖², g·r and ‖g‖², each piece's in float32, added in float64."""
    import torch

    if set(gradient) != set(reference):
        raise GradaccError("The accumulated and full-batch gradients cover different parameters.", "backend")
    parts, scratch = [], None
    for name in sorted(reference):
        g, r = gradient[name], reference[name]
        on_cpu = r.device.type == "cpu"  # on a GPU one kernel a tensor: the caching allocator makes temporaries cheap
        step = CHUNK if on_cpu else max(r.numel(), 1)
        for start in range(0, max(r.numel(), 1), step):
            g_part, r_part = g[start:start + step], r[start:start + step]
            out = None
            if on_cpu:
                if scratch is None or scratch.dtype != r_part.dtype:
                    scratch = torch.empty(CHUNK, dtype=r_part.dtype)
                out = scratch[:r_part.numel()]
            difference = torch.add(r_part, g_part, alpha=-gradient_scale, out=out)  # r − s·g
            parts.append(torch.stack([torch.dot(difference, difference), torch.dot(r_part, r_part),
                                      torch.dot(g_part, r_part), torch.dot(g_part, g_part)]).double())
    difference, reference_sq, dot, own = (float(x) for x in torch.stack(parts).sum(dim=0))
    return {"difference": difference, "reference": reference_sq, "dot": dot * gradient_scale,
            "own": own * gradient_scale ** 2}
