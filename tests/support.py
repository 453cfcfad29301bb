"""Helpers every kind of test uses: one polling helper, one free-port helper, one real Streamlit server (those
three live in scripts/browsing/app_server.py, which the scripts share: tests may import scripts, never the
other way round).

Fixtures live in conftest.py (tests/ and tests/browser/); this module holds the plain functions and classes
they and the tests call. It imports neither torch nor streamlit.
"""

from __future__ import annotations

import base64
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"  # gitignored: logs and screenshots of a test session, never the source tree
# "gw0", "gw1": the pytest-xdist worker this process is (pytest.ini runs two); "" when pytest runs in one process.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
# What a deployment may set; a test that does not set them itself must not inherit a developer's values
# (conftest clears them at start-up; the store and app_home fixtures again per test).
LIMIT_VARIABLES = ("GRADACC_MAX_EPOCHS", "GRADACC_MAX_TRAIN_SAMPLES", "GRADACC_MAX_RUN_SECONDS",
                   "GRADACC_MAX_RUN_MEMORY_MB", "GRADACC_MAX_UPLOAD_MB", "GRADACC_ALLOW_HUB",
                   "GRADACC_MAX_CONCURRENT_RUNS", "GRADACC_TORCH_THREADS")

sys.path.insert(0, str(ROOT / "scripts" / "browsing"))  # the app's server and the page helpers, shared with scripts/

from app_server import SERVER_START_TIMEOUT_S, StreamlitServer, free_port, wait_for  # noqa: E402,F401


def plotted(values) -> list:
    """A trace's x or y as the browser reads it from the figure's JSON: plotly sends a numpy array as a base64
    typed array ({"dtype": "f8", "bdata": ...}), where NaN is a gap (None here), and a list as a list."""
    if isinstance(values, dict) and "bdata" in values:
        import numpy as np

        decoded = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
        return [None if isinstance(v, float) and math.isnan(v) else v for v in decoded]
    return list(values or [])


def load_script(name: str):
    """A script of scripts/ as a module (its ``if __name__ == "__main__"`` part does not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"scripts_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded_run(m: int = 8, k: int = 4, steps: int = 6, seconds_per_step: float = 0.2, start: float = 1000.0,
                 **config_changes) -> list[dict]:
    """A run's events as the factories build them, with recorded times: run_started at ``start``, a step every
    ``seconds_per_step``, one eval and run_ended after the last step (for replays and exports, no training)."""
    from gradacc import events as ev
    from gradacc.config import RunConfig

    config = RunConfig(micro_batch_size=m, grad_accum_steps=k, **config_changes).check()
    batch = config.effective_batch
    found = [ev.run_started(config=config.to_dict(), effective_batch=batch, total_steps=steps, steps_per_epoch=steps,
                            train_examples=batch * steps, eval_examples=10, static_memory={"total": 1}, device="cpu")]
    for step in range(1, steps + 1):
        found.append(ev.step(step=step, epoch=1, samples_seen=step * batch, tokens_seen=0, micro_batches=k,
                             loss=0.7 / step, grad_norm=1.0, lr=1e-3, elapsed_s=step * seconds_per_step,
                             memory={"activation_bytes": 1000 * m, "rss_bytes": 1, "cuda_peak_bytes": None}))
    found.append(ev.eval_(epoch=1, step=steps, eval_loss=0.3, eval_accuracy=0.9, eval_f1=0.88))
    found.append(ev.run_ended(status="completed", reason=None, steps=steps, wall_s=steps * seconds_per_step))
    times = [start] + [start + step * seconds_per_step for step in range(1, steps + 1)] + \
        [start + steps * seconds_per_step] * 2
    return [event | {"time": time} for event, time in zip(found, times)]


# Real runs recorded with --metrics-out, for tests that need a real curve's figures (tests/analysis/runs/: how
# each was made is said where it is used).
REAL_RUNS = ROOT / "tests" / "analysis" / "runs"


def real_run_events(name: str) -> list[dict]:
    """The events of the recorded real run ``name`` (REAL_RUNS/name.jsonl.gz)."""
    import gzip
    import json

    with gzip.open(REAL_RUNS / f"{name}.jsonl.gz", "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def write_events(path, events: list[dict]) -> str:
    """A --metrics-out file of ``events``."""
    import json
    from pathlib import Path

    Path(path).write_text("".join(json.dumps(event) + "\n" for event in events))
    return str(path)


def tiny_sentence_encoder(folder: Path) -> Path:
    """A tiny random BERT encoder written by save_pretrained (safetensors) with tiny-bert's tokenizer, in ``folder``:
    sentence-transformers loads it with mean pooling, for the contrastive task in seconds."""
    import torch
    from transformers import BertConfig, BertModel

    from gradacc.training.sources.models import tiny_bert_tokenizer

    tokenizer = tiny_bert_tokenizer()
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, pad_token_id=tokenizer.pad_token_id)).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
