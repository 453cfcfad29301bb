"""training/gradients.py: the sums the equivalence check and the audit compare gradients with."""

import torch

from gradacc.training.gradients import CHUNK, gradient_sums


def test_sums_taken_piece_by_piece_equal_the_whole_tensors_in_float64():
    torch.manual_seed(0)
    # Larger than a piece and not a whole number of pieces, one piece exactly, a scalar, an empty tensor.
    sizes = {"embedding": 3 * CHUNK + 17, "dense": CHUNK, "bias": 1, "empty": 0}
    gradient = {name: torch.randn(n) for name, n in sizes.items()}
    reference = {name: g * 1.5 + 1e-3 * torch.randn_like(g) for name, g in gradient.items()}
    scale = 0.75

    g = torch.cat([gradient[n] for n in sizes]).double() * scale
    r = torch.cat([reference[n] for n in sizes]).double()
    expected = {"difference": float((g - r) @ (g - r)), "reference": float(r @ r), "dot": float(g @ r),
                "own": float(g @ g)}
    sums = gradient_sums(gradient, reference, gradient_scale=scale)
    assert sums.keys() == expected.keys()
    for name, value in expected.items():
        assert abs(sums[name] - value) <= 1e-5 * abs(value), (name, sums[name], value)
