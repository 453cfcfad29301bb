"""The one event stream every backend emits: plain JSON-ready dicts.

``run_started`` → ``step`` per optimizer step → ``eval`` per epoch → ``run_ended``. The app, the run
store, the CLI and the benchmarks all read these and nothing else, so a backend can change freely.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Callable

EventSink = Callable[[dict], None]

RUN_STARTED, STEP, EVAL, RUN_ENDED = "run_started", "step", "eval", "run_ended"
COMPLETED, STOPPED, FAILED, INTERRUPTED = "completed", "stopped", "failed", "interrupted"


def _event(kind: str, **fields) -> dict:
    return {"event": kind, "time": time.time(), **fields}


def run_started(*, config: dict, effective_batch: int, total_steps: int, steps_per_epoch: int,
                train_examples: int, eval_examples: int, static_memory: dict, device: str) -> dict:
    return _event(RUN_STARTED, config=config, backend=config["backend"], effective_batch=effective_batch,
                  total_steps=total_steps, steps_per_epoch=steps_per_epoch, train_examples=train_examples,
                  eval_examples=eval_examples, static_memory=static_memory, device=device)


def step(*, step: int, epoch: int, samples_seen: int, tokens_seen: int, micro_batches: int, loss: float,
         grad_norm: float | None, lr: float, elapsed_s: float, memory: dict, sync_rounds: int | None = None,
         pitfall: dict | None = None) -> dict:
    """``sync_rounds``: DDP gradient all-reduces (one per bucket) in this window; None on one process.
    ``pitfall``: in a run with pitfalls, what the right loop would have done at this step (training.pitfalls):
    planned_lr, grad_norm_stepped, grad_norm_right and grad_cosine, examples_stepped, examples_seen and examples_trained
    (all steps so far), loss_right; absent otherwise."""
    return _event(STEP, step=step, epoch=epoch, samples_seen=samples_seen, tokens_seen=tokens_seen,
                  micro_batches=micro_batches, loss=loss, grad_norm=grad_norm, lr=lr, elapsed_s=elapsed_s,
                  samples_per_s=samples_seen / elapsed_s if elapsed_s > 0 else 0.0, sync_rounds=sync_rounds,
                  **memory) | ({"pitfall": pitfall} if pitfall is not None else {})


# Every eval event has all of these; a task fills what it has (classification: accuracy and F1, and the F1 of
# always predicting the most frequent label; causal-lm: perplexity and next-token accuracy; contrastive: MRR@10 and
# recall@1 of each held-out query among all held-out positives), the others are None.
EVAL_METRICS = ("eval_loss", "eval_accuracy", "eval_f1", "majority_f1", "eval_perplexity", "eval_next_token_accuracy",
                "eval_mrr_at_10", "eval_recall_at_1")


def eval_(*, epoch: int, step: int, eval_loss: float, eval_accuracy: float | None = None,
          eval_f1: float | None = None, majority_f1: float | None = None, eval_perplexity: float | None = None,
          eval_next_token_accuracy: float | None = None, eval_mrr_at_10: float | None = None,
          eval_recall_at_1: float | None = None) -> dict:
    """``majority_f1``: F1 of always predicting the eval set's most frequent label (the floor to beat)."""
    return _event(EVAL, epoch=epoch, step=step, eval_loss=eval_loss, eval_accuracy=eval_accuracy, eval_f1=eval_f1,
                  majority_f1=majority_f1, eval_perplexity=eval_perplexity,
                  eval_next_token_accuracy=eval_next_token_accuracy, eval_mrr_at_10=eval_mrr_at_10,
                  eval_recall_at_1=eval_recall_at_1)


def run_ended(*, status: str, reason: str | None, steps: int, wall_s: float, field: str | None = None,
              warnings: list[str] | None = None, out_of_memory: dict | None = None) -> dict:
    """``field`` names the setting at fault when the run failed on bad input (None for a fault in training).
    ``warnings``: one line per sign that a run went badly (empty when all is well; see analysis.health).
    ``out_of_memory``: a run past its memory cap — the figures, and ``fit``: the m and k that keep its effective
    batch within the cap (None when even m=1 does not fit)."""
    event = _event(RUN_ENDED, status=status, reason=reason, steps=steps, wall_s=wall_s, field=field,
                   warnings=list(warnings or []))
    return event | {"out_of_memory": out_of_memory} if out_of_memory is not None else event


def new_run_id() -> str:
    """Sortable by start time and unique: 20250101-120000-1a2b3c (a folder name, a tracker's run name)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def to_json(event: dict) -> str:
    return json.dumps(event, default=str)


class Recorder:
    """An event sink that keeps every event in order (tests, benchmarks, the equivalence check)."""

    def __init__(self):
        self.events: list[dict] = []

    def __call__(self, event: dict) -> None:
        self.events.append(event)

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    @property
    def ended(self) -> dict | None:
        ended = self.of(RUN_ENDED)
        return ended[-1] if ended else None


def read_events(path: str | Path) -> list[dict]:
    """Events from a ``--metrics-out`` JSONL file (GradaccError with the file's name when unreadable)."""
    from gradacc.errors import GradaccError

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise GradaccError(f"Could not read {str(path)!r}: {getattr(error, 'strerror', None) or error}.") from None
    found = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                event = json.loads(line)
            except ValueError:
                raise GradaccError(f"{Path(path).name!r} line {number} is not JSON; pass a file written by "
                                   "--metrics-out.") from None
            if isinstance(event, dict) and "event" in event:
                found.append(event)
    if not any(e["event"] == STEP for e in found):
        raise GradaccError(f"{Path(path).name!r} has no training steps; pass a file written by --metrics-out.")
    return found
