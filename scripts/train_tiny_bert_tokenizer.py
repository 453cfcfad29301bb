"""Retrain tiny-bert's WordPiece tokenizer from the built-in corpus into the folder gradacc ships.

    python scripts/train_tiny_bert_tokenizer.py

Each training gives a different vocabulary (tokenizers#1794), so the tokenizer is trained once and shipped:
retrain it only when the corpus changes, then re-measure the F1 figures the tests and docs quote.
"""

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gradacc.training.sources import builtin_data  # noqa: E402
from gradacc.training.sources.models import TINY_BERT_TOKENIZER  # noqa: E402


def train_tiny_bert_tokenizer(folder: Path) -> None:
    """Train tiny-bert's WordPiece tokenizer on the built-in corpus into ``folder`` (a different vocabulary
    each time: see TINY_BERT_TOKENIZER)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(builtin_data.tokenizer_corpus(),
                                  trainers.WordPieceTrainer(vocab_size=2000, special_tokens=specials,
                                                           show_progress=False))
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tokenizer.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]", model_max_length=512)
    fast.save_pretrained(str(folder))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        trained = Path(scratch) / "tokenizer"
        train_tiny_bert_tokenizer(trained)
        shutil.rmtree(TINY_BERT_TOKENIZER, ignore_errors=True)
        shutil.copytree(trained, TINY_BERT_TOKENIZER)
    print(f"wrote {TINY_BERT_TOKENIZER}")
