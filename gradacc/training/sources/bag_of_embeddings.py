"""bow-batchnorm and bow-layernorm: a small classifier whose one difference is the normalisation layer.

Mean of the word embeddings (padding masked out) → Linear → BatchNorm1d or LayerNorm → ReLU → Linear.
BatchNorm normalises each feature with the mean and variance *of the micro-batch* in training, so every
example's output depends on the others in its micro-batch: the gradient of k micro-batches of m is not the
gradient of one batch of m·k (Lightning #17446). LayerNorm normalises each example over its own features:
accumulation is exactly the big batch. Both use tiny-bert's tokenizer and train on builtin-sentiment.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from gradacc.errors import GradaccError

NORMS = {"bow-batchnorm": "batchnorm", "bow-layernorm": "layernorm"}
EMBEDDING_SIZE = 64
HIDDEN_SIZE = 64


class BagOfEmbeddingsClassifier(nn.Module):
    """``forward(input_ids, attention_mask, labels)`` → ``SequenceClassifierOutput`` like a transformers model,
    so every backend trains it unchanged (no ``**kwargs``: Trainer treats it as a model that does not count
    ``num_items_in_batch`` itself)."""

    supports_gradient_checkpointing = False

    def __init__(self, vocab_size: int, num_labels: int, norm: str, dropout: float, pad_token_id: int):
        super().__init__()
        self.norm_kind = norm
        self.embeddings = nn.Embedding(vocab_size, EMBEDDING_SIZE, padding_idx=pad_token_id)
        self.hidden = nn.Linear(EMBEDDING_SIZE, HIDDEN_SIZE)
        self.norm = nn.BatchNorm1d(HIDDEN_SIZE) if norm == "batchnorm" else nn.LayerNorm(HIDDEN_SIZE)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(HIDDEN_SIZE, num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if self.training and self.norm_kind == "batchnorm" and input_ids.shape[0] < 2:
            raise GradaccError("Micro-batch size must be at least 2 for bow-batchnorm: BatchNorm needs two examples "
                               "to compute statistics in training.", "micro_batch_size")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        mask = mask.unsqueeze(-1).to(self.embeddings.weight.dtype)
        pooled = (self.embeddings(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        logits = self.classifier(self.dropout(torch.relu(self.norm(self.hidden(pooled)))))
        loss = None if labels is None else nn.functional.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


def bag_of_embeddings(name: str, tokenizer, num_labels: int, seed: int, dropout: float) -> BagOfEmbeddingsClassifier:
    """The named classifier, randomly initialised from the seed (milliseconds)."""
    torch.manual_seed(seed)
    return BagOfEmbeddingsClassifier(len(tokenizer), num_labels, NORMS[name], dropout, tokenizer.pad_token_id)
