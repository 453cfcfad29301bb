"""The contrastive task: a sentence-transformers model learns (query, positive) pairs with in-batch negatives.

``MultipleNegativesRankingLoss`` scores each query against every positive of its batch: the other positives are
its negatives. A micro-batch of 16 gives each query 15 negatives, a batch of 64 gives 63, so accumulating four
micro-batches of 16 is a different loss from one batch of 64, whatever the weights (sentence-transformers
#2916, #1752). ``CachedMultipleNegativesRankingLoss`` (GradCache) computes the batch-64 loss with the memory
of a mini-batch: embed every mini-batch without a graph, take the loss and its gradient with respect to the
embeddings over the whole batch, then re-embed each mini-batch with a graph during ``backward()`` and push the
cached gradient through it.

``ContrastiveModel`` wraps the SentenceTransformer and its loss in one module whose ``forward`` takes a
micro-batch (the collator's flat ``query_*``/``positive_*`` tensors) and returns ``.loss``, so the plain loop,
Accelerate and Trainer train it like any model. Its parameter names are the encoder's.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn
from transformers.modeling_outputs import ModelOutput

from gradacc.errors import GradaccError, one_line
from gradacc.training import process_state

# sentence-transformers is imported inside the two functions that use it: every run imports this module
# (backends/evaluation.py), only contrastive runs need it, and it takes 0.2-0.5 s to import after the loops'
# own imports (python -X importtime, 3 tries, 2 busy cores).

SIDES = ("query", "positive")
# sentence-transformers' default scale (1 / temperature) for cosine similarities.
SCALE = 20.0
RETRIEVAL_AT = 10


def load_sentence_transformer(source: str, shown_name: str, dropout: float, device: str = "cpu"):
    """A SentenceTransformer from a folder: its own modules (modules.json), or a transformers encoder with mean
    pooling (what sentence-transformers builds from a plain model). Safetensors only, no remote code."""
    from sentence_transformers import SentenceTransformer  # here: contrastive runs only (note below the imports)

    dropouts = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    try:
        with _quiet_sentence_transformers():
            return SentenceTransformer(source, device=device, trust_remote_code=False, local_files_only=True,
                                       config_kwargs=dropouts, model_kwargs={"use_safetensors": True})
    except Exception as error:  # sentence-transformers raises many types; the person needs one sentence
        raise GradaccError(f"Could not load model {shown_name!r} as a sentence-transformers model: "
                           f"{one_line(error, with_type=False)}", "model") from None


@contextlib.contextmanager
def _quiet_sentence_transformers():
    """A plain encoder folder makes sentence-transformers log that it adds mean pooling: expected here."""
    logger = logging.getLogger("sentence_transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class MeasuredGradCache:
    """Mixed into CachedMultipleNegativesRankingLoss: measures the activations of the mini-batches GradCache
    re-embeds with a graph during ``backward()`` (the forward pass it is called in embeds without one).

    The meter then holds the largest such mini-batch: what GradCache keeps for backward at any one time.
    """

    meter = None
    measuring = False
    _largest = 0

    def start(self, meter, measuring: bool) -> None:
        self.meter, self.measuring, self._largest = meter, measuring, 0

    def embed_minibatch(self, sentence_feature, begin, end, with_grad, copy_random_state, random_state=None):
        # GradCache copies the process's generator state at the first embedding and sets it back for the re-embedding
        # in backward(): a model built on another thread meanwhile would draw from a state set under it.
        touches_generator = copy_random_state or random_state is not None
        with process_state.guard(generator=True) if touches_generator else contextlib.nullcontext():
            if not (with_grad and self.measuring and self.meter is not None):
                return super().embed_minibatch(sentence_feature, begin, end, with_grad, copy_random_state,
                                               random_state)
            with self.meter.measure():
                result = super().embed_minibatch(sentence_feature, begin, end, with_grad, copy_random_state,
                                                 random_state)
        self._largest = max(self._largest, self.meter.bytes)
        self.meter.bytes = self._largest
        return result


def make_loss(encoder, gradcache_mini_batch: int | None):
    """MultipleNegativesRankingLoss, or its GradCache version with mini-batches of ``gradcache_mini_batch``."""
    # here: contrastive runs only (note below the imports)
    from sentence_transformers.sentence_transformer.losses import (CachedMultipleNegativesRankingLoss,
                                                                   MultipleNegativesRankingLoss)

    if gradcache_mini_batch is None:
        return MultipleNegativesRankingLoss(encoder, scale=SCALE)
    measured = type("MeasuredCachedMultipleNegativesRankingLoss", (MeasuredGradCache, CachedMultipleNegativesRankingLoss),
                    {})
    return measured(encoder, scale=SCALE, mini_batch_size=gradcache_mini_batch)


class ContrastiveModel(nn.Module):
    """A SentenceTransformer and its in-batch-negatives loss, as one model with ``forward(...) → .loss``."""

    supports_gradient_checkpointing = False

    def __init__(self, encoder, loss):
        super().__init__()
        self.encoder = encoder  # registered first: parameters are named by the encoder's path, once
        self.loss_function = loss
        self.meter = None

    def attach_meter(self, meter) -> None:
        """GradCache's activations come during backward: the loss measures them with the run's meter."""
        self.meter = meter

    def forward(self, query_input_ids, query_attention_mask, positive_input_ids, positive_attention_mask):
        features = [{"input_ids": query_input_ids, "attention_mask": query_attention_mask},
                    {"input_ids": positive_input_ids, "attention_mask": positive_attention_mask}]
        if isinstance(self.loss_function, MeasuredGradCache):
            self.loss_function.start(self.meter, bool(self.meter is not None and self.meter.active))
        return ModelOutput(loss=self.loss_function(features, None))

    def embed(self, input_ids, attention_mask) -> torch.Tensor:
        return self.encoder({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]


def tokenize_pairs(tokenizer, pairs: list[dict], max_length: int):
    """Each pair as an example of both sides' tokens (truncated to max_length); returns (examples, n_truncated)."""
    examples = [{} for _ in pairs]
    truncated = 0
    for side in SIDES:
        texts = [pair[side] for pair in pairs]
        full = tokenizer(texts, truncation=False)["input_ids"]
        truncated += sum(len(ids) > max_length for ids in full)
        encoded = tokenizer(texts, truncation=True, max_length=max_length)
        for example, ids, mask in zip(examples, encoded["input_ids"], encoded["attention_mask"]):
            example[f"{side}_input_ids"], example[f"{side}_attention_mask"] = ids, mask
    return examples, truncated


def pair_collator(tokenizer):
    """Pads each side of a micro-batch to its own longest text: flat ``query_*``/``positive_*`` tensors."""

    def collate(examples: list[dict]) -> dict:
        batch = {}
        for side in SIDES:
            padded = tokenizer.pad([{"input_ids": e[f"{side}_input_ids"], "attention_mask": e[f"{side}_attention_mask"]}
                                    for e in examples], return_tensors="pt")
            batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"] = padded["input_ids"], padded["attention_mask"]
        return batch

    return collate


@torch.no_grad()
def retrieval_metrics(model: ContrastiveModel, examples: list[dict], collate, device, batch_size: int = 64) -> dict:
    """Every held-out query ranks every held-out positive by cosine similarity: MRR@10, recall@1, and the
    contrastive loss over the whole set (each query against all positives)."""
    was_training = model.training
    model.eval()
    embedded = {side: [] for side in SIDES}
    for start in range(0, len(examples), batch_size):
        batch = {key: value.to(device) for key, value in collate(examples[start:start + batch_size]).items()}
        for side in SIDES:
            embedded[side].append(model.embed(batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"]).float())
    model.train(was_training)
    queries = nn.functional.normalize(torch.cat(embedded["query"]), dim=-1)
    positives = nn.functional.normalize(torch.cat(embedded["positive"]), dim=-1)
    scores = queries @ positives.T
    target = torch.arange(len(examples), device=scores.device)
    # Rank of the right positive: 1 + how many score higher than it.
    ranks = (scores > scores[target, target].unsqueeze(1)).sum(1) + 1
    reciprocal = torch.where(ranks <= RETRIEVAL_AT, 1.0 / ranks.float(), torch.zeros_like(ranks, dtype=torch.float))
    loss = nn.functional.cross_entropy(scores * SCALE, target)
    return {"eval_loss": float(loss), "eval_mrr_at_10": float(reciprocal.mean()),
            "eval_recall_at_1": float((ranks == 1).float().mean())}
