"""gradacc.training.audit.grpo: each loss type's documented window objective against a tiny example computed another
way — plain Python floats and loops over two micro-batches of two sequences with uneven masks, written from the
formulas in GRPOConfig.loss_type's help, not from the module."""

import math

import pytest
import torch

from gradacc.training.audit import grpo

L_MAX = 4
# Two micro-batches (the window, k = 2) of two sequences each; masks of 3, 1 | 2, 4 tokens.
MASKS = [[[1, 1, 1, 0], [1, 0, 0, 0]], [[1, 1, 0, 0], [1, 1, 1, 1]]]
ADVANTAGES = [[0.5, -1.0], [2.0, -0.25]]
LOGPS = [[[-1.0, -0.5, -2.0, -3.0], [-0.2, -0.7, -1.1, -0.9]], [[-0.4, -1.3, -0.6, -0.1], [-0.8, -0.3, -1.5, -2.2]]]
# Old log-probs: ratios exp(logp − old) off 1 in both directions, so the clip acts on some tokens.
OLD_SHIFT = [[[0.3, -0.1, 0.05, 0.0], [-0.4, 0.0, 0.0, 0.0]], [[0.0, 0.25, 0.0, 0.0], [-0.3, 0.1, 0.02, -0.6]]]
REF_SHIFT = [[[0.1, -0.2, 0.3, 0.0], [0.2, 0.0, 0.0, 0.0]], [[-0.1, 0.05, 0.0, 0.0], [0.4, -0.3, 0.1, 0.2]]]
SETTINGS = grpo.Settings(max_completion_length=L_MAX, epsilon_low=0.2, epsilon_high=0.28)


def window(off_policy: bool, beta: bool = False):
    batches, leaves = [], []
    for b in range(2):
        logps = torch.tensor(LOGPS[b], dtype=torch.float64, requires_grad=True)
        leaves.append(logps)
        old = torch.tensor(LOGPS[b], dtype=torch.float64) - torch.tensor(OLD_SHIFT[b], dtype=torch.float64)
        ref = torch.tensor(LOGPS[b], dtype=torch.float64) + torch.tensor(REF_SHIFT[b], dtype=torch.float64)
        batches.append(grpo.MicroBatch(logps=logps, mask=torch.tensor(MASKS[b]),
                                       advantages=torch.tensor(ADVANTAGES[b], dtype=torch.float64),
                                       old_logps=old if off_policy else None, ref_logps=ref if beta else None))
    return batches, leaves


def tokens():
    """(micro-batch, sequence, position, logp, old logp, ref logp, advantage) of every token that counts."""
    for b in range(2):
        for i in range(2):
            for t in range(L_MAX):
                if MASKS[b][i][t]:
                    lp = LOGPS[b][i][t]
                    yield b, i, t, lp, lp - OLD_SHIFT[b][i][t], lp + REF_SHIFT[b][i][t], ADVANTAGES[b][i]


def clipped(lp, old, a, eps_low=0.2, eps_high=0.28):
    r = math.exp(lp - old)
    return -min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a)


def by_hand(loss_type, beta=0.0, bias_correction=True):
    """The documented aggregate over the window, in floats."""
    per = {}
    for b, i, t, lp, old, ref, a in tokens():
        loss = clipped(lp, old, a)
        if beta:
            loss += beta * (math.exp(ref - lp) - (ref - lp) - 1) * (math.exp(lp - old) if bias_correction else 1.0)
        per.setdefault((b, i), []).append(loss)
    if loss_type == "grpo":  # mean of sequence means, over all 4 sequences
        return sum(sum(v) / len(v) for v in per.values()) / 4
    if loss_type == "bnpo":  # each micro-batch's token mean, then the mean of the two
        return sum(sum(sum(per[(b, i)]) for i in range(2)) / sum(len(per[(b, i)]) for i in range(2))
                   for b in range(2)) / 2
    if loss_type == "dr_grpo":  # all tokens ÷ (4 sequences × max_completion_length)
        return sum(sum(v) for v in per.values()) / (4 * L_MAX)
    if loss_type == "dapo":  # all tokens ÷ the window's 10 tokens
        return sum(sum(v) for v in per.values()) / 10
    raise AssertionError(loss_type)


@pytest.mark.parametrize("beta, bias_correction", [(0.0, True), (0.04, True), (0.04, False)])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_each_aggregate_is_the_documented_one_off_policy_with_clipping_and_kl(loss_type, beta, bias_correction):
    settings = grpo.Settings(max_completion_length=L_MAX, epsilon_low=0.2, epsilon_high=0.28, beta=beta,
                             bias_correction_kl=bias_correction)
    batches, _ = window(off_policy=True, beta=bool(beta))
    value = grpo.window_objective(loss_type, batches, settings)
    assert float(value.detach()) == pytest.approx(by_hand(loss_type, beta, bias_correction), rel=1e-12)
    # the clip acted on some token (else this example would not test it)
    assert any(abs(clipped(lp, old, a) + math.exp(lp - old) * a) > 1e-9 for *_, lp, old, _, a in tokens())


def test_on_policy_gradients_per_token_are_the_normalisers():
    """On-policy (r = 1, no clip), d objective / d log π of a counted token is −A ÷ the loss type's normaliser: the
    sequence's length × the window's 4 sequences (grpo), the micro-batch's tokens × k = 2 (bnpo), 4 × max length
    (dr_grpo), the window's 10 tokens (dapo, cispo before its weight min(1, ε_high)), 4 (luspo: r per sequence).
    Tokens outside the mask get none."""
    lengths = {(b, i): sum(MASKS[b][i]) for b in range(2) for i in range(2)}
    batch_tokens = [sum(lengths[(b, i)] for i in range(2)) for b in range(2)]
    normaliser = {"grpo": lambda b, i: lengths[(b, i)] * 4, "bnpo": lambda b, i: batch_tokens[b] * 2,
                  "dr_grpo": lambda b, i: 4 * L_MAX, "dapo": lambda b, i: 10, "vespo": lambda b, i: 10,
                  "cispo": lambda b, i: 10 / min(1.0, 0.28), "luspo": lambda b, i: 4,
                  "sapo": lambda b, i: lengths[(b, i)] * 4}
    for loss_type, divide in normaliser.items():
        settings = grpo.Settings(max_completion_length=L_MAX, epsilon_high=0.28,
                                 importance_sampling_level="sequence" if loss_type == "luspo" else "token")
        batches, leaves = window(off_policy=False)
        grads = torch.autograd.grad(grpo.window_objective(loss_type, batches, settings), leaves)
        for b in range(2):
            for i in range(2):
                for t in range(L_MAX):
                    expected = -ADVANTAGES[b][i] / divide(b, i) if MASKS[b][i][t] else 0.0
                    assert float(grads[b][i][t]) == pytest.approx(expected, rel=1e-12, abs=1e-15), \
                        (loss_type, b, i, t)


def test_an_unknown_loss_type_is_refused_naming_the_known_ones():
    batches, _ = window(off_policy=False)
    with pytest.raises(ValueError, match="known: grpo, bnpo"):
        grpo.window_objective("ppo", batches, SETTINGS)


def test_completion_logps_reads_the_logits_before_each_completion_token():
    logits = torch.randn(1, 5, 7, dtype=torch.float64)
    completion = torch.tensor([[3, 6]])
    got = grpo.completion_logps(logits, completion, temperature=0.5)
    expected = [float((logits[0, p] / 0.5).log_softmax(-1)[c]) for p, c in ((2, 3), (3, 6))]
    assert got[0].tolist() == pytest.approx(expected, rel=1e-12)
