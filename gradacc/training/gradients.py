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


# Values per block of the scale's standard error: enough blocks on a tiny model, few enough to be cheap.
BLOCK = 256


def _pieces(gradient: dict, reference: dict):
    """(g piece, r piece) pairs over every parameter, in float32, at most CHUNK values each; a parameter missing on
    one side counts as zeros there."""
    import torch

    for name in sorted(set(gradient) | set(reference)):
        r, g = reference.get(name), gradient.get(name)
        r = torch.zeros_like(g) if r is None else r
        g = torch.zeros_like(r) if g is None else g
        for start in range(0, max(r.numel(), 1), CHUNK):
            yield g[start:start + CHUNK].float(), r[start:start + CHUNK].float()


def projection(gradient: dict, reference: dict, gradient_scale: float = 1.0, candidates=(1.0,)) -> dict:
    """g = ``gradient`` × ``gradient_scale`` projected on r = ``reference``: the scale s = g·r / r·r, what no scale
    explains (residual ‖g − s·r‖ / ‖r‖), the relative error ‖g − r‖ / ‖r‖, and the standard error of s measured
    from the residual itself: s is the weighted mean of the blocks' own scales s_b = g_b·r_b / r_b·r_b (blocks of
    ``BLOCK`` values, weights r_b·r_b), and se = √(Σ (g_b·r_b − s·r_b·r_b)²) / Σ r_b·r_b: 0 when g is exactly a
    scale of r, and as large as the rounding noise (bf16's, fp16's) makes the blocks disagree.

    One pass over both gradients. The residual comes from ‖g − c·r‖² − (s − c)²·‖r‖² (g − c·r is (g − s·r) plus
    (s − c)·r, the two orthogonal) for the ``candidates`` scale c nearest s, each taken in the same pass (1, and the
    scales the caller expects: k, 1/k, ...); when s is near none of them, a second pass measures ‖g − s·r‖ itself,
    since a far c's (s − c)²·‖r‖² would drown it."""
    import math

    import torch

    candidates = sorted({1.0, *(float(c) for c in candidates)})
    dots, squares, differences = [], [], {c: [] for c in candidates}
    scratch = {}  # one reused buffer per dtype and device: no fresh pages per piece (see CHUNK)
    for g, r in _pieces(gradient, reference):
        n = g.numel()
        key = (r.dtype, r.device)
        if key not in scratch:
            scratch[key] = torch.empty(CHUNK, dtype=r.dtype, device=r.device)
        buffer = scratch[key][:n]
        whole = n - n % BLOCK
        for pieces, other in ((dots, g), (squares, r)):
            product = torch.mul(other, r, out=buffer)
            pieces.append(product[:whole].view(-1, BLOCK).sum(dim=1, dtype=torch.float64))
            if whole < n:  # the piece's tail is a block of its own
                pieces.append(product[whole:].sum(dtype=torch.float64).reshape(1))
        for c in candidates:  # ‖g × gradient_scale − c·r‖² = gradient_scale² ‖g − (c / gradient_scale)·r‖²
            difference = torch.add(g, r, alpha=-c / gradient_scale, out=buffer)
            differences[c].append(torch.dot(difference, difference).double())
    block_dots, block_squares = torch.cat(dots) * gradient_scale, torch.cat(squares)
    reference_sq, dot = float(block_squares.sum()), float(block_dots.sum())
    if reference_sq == 0:
        raise GradaccError("The reference gradient is zero: nothing to compare the step's gradient with.", "backend")
    scale = dot / reference_sq
    distance = {c: float(torch.stack(parts).sum()) * gradient_scale ** 2 for c, parts in differences.items()}
    nearest = min(candidates, key=lambda c: abs(scale - c))
    if abs(scale - nearest) <= 0.01 * max(1.0, abs(nearest)):
        residual_sq = max(0.0, distance[nearest] - (scale - nearest) ** 2 * reference_sq)
    else:
        residual_sq = float(sum(torch.dot(d, d).double() for d in
                                (torch.add(r * scale, g, alpha=-gradient_scale) for g, r in _pieces(gradient, reference))))
    se = float(torch.sqrt(((block_dots - scale * block_squares) ** 2).sum())) / reference_sq
    return {"scale": scale, "residual": math.sqrt(residual_sq / reference_sq),
            "rel_error": math.sqrt(distance[1.0] / reference_sq), "se": se}
