"""The Audit page's stock-Trainer audits, off the page's thread: the same queue as the equivalence checks
(``checks.CheckRunner``: one worker thread for the server, finished answers remembered by their settings), running
``gradacc.analysis.stock_audit`` (what ``gradacc audit --model`` prints)."""

from __future__ import annotations

from gradacc.analysis.stock_audit import audit_stock_trainer  # light: torch loads when an audit runs
from gradacc.config import RunConfig, ValidConfig
from gradacc.errors import GradaccError
from gradacc.labels import field_label
from gradacc.serving import warmup
from gradacc.training import process_state  # light: threading only

# The audit queue's worker thread's name starts so: the page tells an audit waiting for its turn from one training.
THREAD_NAME = "gradacc-audit"

# Largest window (m × k) the page trains: one optimizer step, on this server's CPU.
MAX_WINDOW = 64
MAX_SEQ_LENGTH = 64


def audit_config(model: str, dataset: str, text_column: str | None, label_column: str | None, micro_batch_size,
                 grad_accum_steps) -> ValidConfig:
    """The config an audit runs, validated; GradaccError names the field at fault."""
    if not model:
        raise GradaccError("Pick a model, or give a hub id or a local model folder.", "model")
    config = RunConfig(model=model, dataset=dataset, text_column=text_column, label_column=label_column,
                       micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                       max_seq_length=MAX_SEQ_LENGTH).check()
    if config.micro_batch_size * config.grad_accum_steps > MAX_WINDOW:
        raise GradaccError(f"{field_label('grad_accum_steps')} must keep m × k at most {MAX_WINDOW} here (one "
                           f"optimizer step on this server's CPU); got {config.micro_batch_size} × "
                           f"{config.grad_accum_steps}.", "grad_accum_steps")
    return config


def stock_audit(config: RunConfig) -> dict:
    """The verdict on a stock Trainer's first step on the config's model, as a dict (``Verdict.as_dict``)."""
    warmup.wait_until_warm()  # no import of torch beside the warm-up's (see gradacc.serving.warmup)

    return audit_stock_trainer(config).as_dict()  # confinement None: the visitors' folders only


def waits_for_a_run() -> bool:
    """Whether an audit waits for its turn: a Trainer's audit shares Accelerate's state and torch's generator with the
    runs of this process, so it starts once no run is training."""
    return any(name.startswith(THREAD_NAME) for name in process_state.waiting())


def audit_key(config: RunConfig) -> tuple:
    return (config.model, config.dataset, config.text_column, config.label_column, config.task,
            config.micro_batch_size, config.grad_accum_steps, config.max_seq_length)
