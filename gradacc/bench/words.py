"""The tiny word-level vocabulary the GRPO bench's model learns, and the audit's tests' tiny models too: 60 words
``w0`` … ``w59`` after [PAD], [UNK], [BOS], [EOS], split on whitespace. Built in milliseconds, nothing downloaded."""

from __future__ import annotations

from tokenizers import Tokenizer, models as token_models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

VOCAB = 64
WORDS = [f"w{i}" for i in range(VOCAB - 4)]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2, "[EOS]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(token_models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]")
