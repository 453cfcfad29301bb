"""One gradient against another, tensor by tensor: what the equivalence check and the audit both measure.

In the training layer because the audit (training.audit) judges a run while it trains; analysis.equivalence
reads the same sums.
"""

from __future__ import annotations

import math

from gradacc.errors import GradaccError
from gradacc.training.tolerances import REUSE_EXPECTED


# Elements summed at a time: 256 KB of float32, so r − s·g is written to a small reused buffer and read back from
# the cache, with g and r still there for their dots. A whole-tensor temporary (88 MB on all-MiniLM-L6-v2) costs
# fresh pages on every call, more than the dots themselves (BENCHMARKS.md, audit, has the before and after).
CHUNK = 1 << 16


def gradient_sums(gradient: dict, reference: dict, gradient_scale: float = 1.0) -> dict:
    """Sums over all parameters of g = ``gradient`` × ``gradient_scale`` and r = ``reference``, taken piece by
    piece (no copy of a whole gradient): ‖g − r‖², ‖r‖², g·r and ‖g‖², each piece's in float32, added in float64."""
    import torch  # here: the app and `gradacc --help` import this module before torch loads

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


# Values per block of the scale's standard error, and how many pieces (CHUNK values each) at least give their blocks
# to it: enough blocks to measure the noise well (16k on a large model), while the scale itself uses every value.
BLOCK = 256
SAMPLED_PIECES = 64


def _pieces(gradient: dict, reference: dict):
    """(g piece, r piece) pairs over every parameter, in float32, at most CHUNK values each; a parameter missing on
    one side counts as zeros there."""
    import torch  # here: the app and `gradacc --help` import this module before torch loads

    for name in sorted(set(gradient) | set(reference)):
        r, g = reference.get(name), gradient.get(name)
        r = torch.zeros_like(g) if r is None else r
        g = torch.zeros_like(r) if g is None else g
        for start in range(0, max(r.numel(), 1), CHUNK):
            yield g[start:start + CHUNK].float(), r[start:start + CHUNK].float()


def projection(gradient: dict, reference: dict, gradient_scale: float = 1.0, expected=()) -> dict:
    """g = ``gradient`` × ``gradient_scale`` projected on r = ``reference``: the scale s = g·r / r·r, what no scale
    explains (residual ‖g − s·r‖ / ‖r‖), the relative error ‖g − r‖ / ‖r‖, and the standard error of s measured
    from the residual itself: s is the weighted mean of the blocks' own scales s_b = g_b·r_b / r_b·r_b (blocks of
    ``BLOCK`` values, weights r_b·r_b), and se = √(Σ (g_b·r_b − s·r_b·r_b)²) / Σ r_b·r_b: 0 when g is exactly a
    scale of r, and as large as the rounding noise (bf16's, fp16's) makes the blocks disagree.

    One pass over both gradients when s is near 1 or near one of the ``expected`` scales e, whose ‖g − e·r‖ the pass
    takes too (then ‖g − s·r‖² = ‖g − e·r‖² − (s − e)²·‖r‖², the two parts orthogonal); a second when it is not,
    which measures ‖g − s·r‖ itself: derived from a far e, (s − e)²·‖r‖² would drown it. The blocks come from every piece of a small model and from an even sample of
    ``SAMPLED_PIECES``-odd pieces of a large one (se ∝ 1/√(sampled fraction), corrected for)."""
    import torch  # here: the app and `gradacc --help` import this module before torch loads

    pieces = list(_pieces(gradient, reference))
    stride = max(1, len(pieces) // SAMPLED_PIECES)
    expected = sorted({float(e) for e in expected} - {1.0})
    dots, squares, sums, apart = [], [], [], {e: [] for e in expected}
    c = gradient_scale
    buffers = {}  # one reused buffer per dtype and device: no fresh pages per piece (see CHUNK)

    def buffer_for(r):
        key = (r.dtype, r.device)
        if key not in buffers:
            buffers[key] = torch.empty(CHUNK, dtype=r.dtype, device=r.device)
        return buffers[key][:r.numel()]

    for index, (g, r) in enumerate(pieces):
        buffer, n = buffer_for(r), g.numel()
        if index % stride == 0:  # this piece's blocks measure the scale's noise
            whole = n - n % BLOCK
            for blocks, other in ((dots, g), (squares, r)):
                product = torch.mul(other, r, out=buffer)
                blocks.append(product[:whole].view(-1, BLOCK).sum(dim=1).double())
                if whole < n:  # the piece's tail is a block of its own
                    blocks.append(product[whole:].sum().double().reshape(1))
        difference = torch.add(r, g, alpha=-c, out=buffer)
        sums.append(torch.stack([torch.dot(g, r), torch.dot(r, r), torch.dot(difference, difference)]).double())
        for e in expected:  # ‖g·c − e·r‖² = c²·‖g − (e / c)·r‖², in the cache still
            distance = torch.add(g, r, alpha=-e / c, out=buffer)
            apart[e].append(torch.dot(distance, distance).double())
    dot, reference_sq, difference = (float(x) for x in torch.stack(sums).sum(dim=0))
    dot *= c
    if reference_sq == 0:
        raise GradaccError("The reference gradient is zero: nothing to compare the step's gradient with.", "backend")
    scale = dot / reference_sq
    near = [(1.0, difference)] + [(e, float(torch.stack(apart[e]).sum()) * c * c) for e in expected]
    e, distance = min(near, key=lambda pair: abs(scale - pair[0]))
    if abs(scale - e) <= REUSE_EXPECTED * max(1.0, e):
        residual_sq = max(0.0, distance - (scale - e) ** 2 * reference_sq)
    else:
        residual_sq = 0.0
        for g, r in _pieces(gradient, reference):
            apart = torch.add(g, r, alpha=-scale / c, out=buffer_for(r))  # (g·c − s·r) ÷ c
            residual_sq += float(torch.dot(apart, apart)) * c * c
    block_dots, block_squares = torch.cat(dots) * c, torch.cat(squares)
    sampled = float(block_squares.sum()) / reference_sq  # the sampled blocks' share of ‖r‖²
    se = float(torch.sqrt(((block_dots - scale * block_squares) ** 2).sum())) / reference_sq / math.sqrt(sampled) \
        if sampled > 0 else 0.0
    return {"scale": scale, "residual": math.sqrt(residual_sq / reference_sq),
            "rel_error": math.sqrt(difference / reference_sq), "se": se}
