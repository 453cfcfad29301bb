"""A tiny GPT as nanoGPT's model.py writes it: ``model(idx, targets) -> (logits, loss)``, the loss computed inside
the forward (cross-entropy, targets -1 ignored), dropout on. Its data: token sequences of uneven lengths padded with
targets -1, so micro-batches hold unequal numbers of tokens. And the ``loss_fn`` gradacc's audit needs for it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, EMBD = 32, 16, 16


class GPT(nn.Module):
    def __init__(self, dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBD)
        self.wpe = nn.Embedding(BLOCK, EMBD)
        self.drop = nn.Dropout(dropout)
        self.block = nn.TransformerEncoderLayer(EMBD, nhead=2, dim_feedforward=4 * EMBD, dropout=dropout,
                                                batch_first=True, norm_first=True)
        self.ln_f = nn.LayerNorm(EMBD)
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(t)))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        x = self.ln_f(self.block(x, src_mask=mask, is_causal=True))
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def nano_data(count=32, seed=0):
    """(x, y) pairs: y is x shifted by one; sequences of 3 to 15 tokens."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        length = 3 + (i * 7) % 13
        tokens = torch.randint(0, VOCAB, (length + 1,), generator=generator)
        out.append((tokens[:-1], tokens[1:]))
    return out


def nano_collate(pairs):
    """Padded to the longest: inputs with 0, targets with -1 (ignored by the loss)."""
    t = max(len(x) for x, _ in pairs)
    x = torch.zeros(len(pairs), t, dtype=torch.long)
    y = torch.full((len(pairs), t), -1, dtype=torch.long)
    for row, (xi, yi) in enumerate(pairs):
        x[row, :len(xi)], y[row, :len(yi)] = xi, yi
    return x, y


def loss_fn(model, batch):
    """gradacc's audit: (the micro-batch's loss summed over its tokens, its tokens); ``batch`` is (x, y)."""
    x, y = batch
    logits, _ = model(x, y)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum"), int((y != -1).sum())
