"""Training runs as the suites need them: the engine with a chosen sink, and a fixed-length collator."""

from __future__ import annotations

import time

from transformers import DataCollatorWithPadding

from gradacc import events
from gradacc.config import RunConfig
from gradacc.errors import RunFailed
from gradacc.training.run.engine import train as engine_train
from gradacc.training.sources import models


class AppSink:
    """What the app does with each event: keep it in memory for the live page and serialise it for the
    run store (minus the SQLite write, which is the store's cost, not the engine's).

    ``cpu_times``: process CPU seconds at each step event. On a busy machine wall time mostly measures
    the other processes; CPU time measures the work."""

    def __init__(self):
        self.events: list[dict] = []
        self.lines: list[str] = []
        self.cpu_times: list[float] = []

    def __call__(self, event: dict) -> None:
        if event["event"] == events.STEP:
            self.cpu_times.append(time.process_time())
        self.events.append(event)
        self.lines.append(events.to_json(event))

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]


def train(config: RunConfig, sink, **job_options) -> dict:
    """engine.train, but a run that does not complete is an error here (a benchmark of a failed run is
    no benchmark)."""
    ended = engine_train(config, sink, **job_options)
    if ended["status"] != events.COMPLETED:
        raise RunFailed(f"{config.backend} m={config.micro_batch_size} k={config.grad_accum_steps}: "
                        f"{ended['status']}: {ended['reason']}")
    return ended


def fixed_length_collator(model: str, length: int):
    """Pad every micro-batch to ``length`` tokens. The default collator pads to the longest text of each
    micro-batch, so micro-batches of different m would differ in length too and activation ratios would
    mix m with sequence length."""
    if model != models.TINY_BERT:
        raise ValueError("the memory suite measures the built-in tiny-bert")
    return DataCollatorWithPadding(models.tiny_bert_tokenizer(), padding="max_length", max_length=length,
                                   return_tensors="pt")
