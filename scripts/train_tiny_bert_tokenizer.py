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

from gradacc.training.sources.models import TINY_BERT_TOKENIZER, train_tiny_bert_tokenizer  # noqa: E402

with tempfile.TemporaryDirectory() as scratch:
    trained = Path(scratch) / "tokenizer"
    train_tiny_bert_tokenizer(trained)
    shutil.rmtree(TINY_BERT_TOKENIZER, ignore_errors=True)
    shutil.copytree(trained, TINY_BERT_TOKENIZER)
print(f"wrote {TINY_BERT_TOKENIZER}")
