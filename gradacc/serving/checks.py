"""Equivalence checks off the page's thread, one at a time, for every visitor of the server.

A check trains a few one-step runs (seconds; Trainer's setup makes it tens of seconds), so the page
submits it here and polls. One worker thread for the whole server: visitors' checks queue instead of
competing for the CPU, and a finished check is remembered, so the same settings answer at once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time

from gradacc.analysis import equivalence
from gradacc.config import RunConfig, ValidConfig
from gradacc.labels import field_label
from gradacc.errors import GradaccError, one_line
from gradacc.serving import warmup

# Largest window (m × k) the page accepts: the check builds the whole window as one batch too.
MAX_WINDOW = 256
KEEP_RESULTS = 32


def check_config(backend: str, micro_batch_size, grad_accum_steps) -> ValidConfig:
    """The config a check runs, checked; GradaccError (ConfigErrors: every one) names the fields at fault."""
    config = RunConfig(backend=backend, micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                       max_seq_length=32).check()
    if config.micro_batch_size * config.grad_accum_steps > MAX_WINDOW:
        raise GradaccError(f"{field_label('grad_accum_steps')} must keep m × k at most {MAX_WINDOW} here (the check "
                           f"also runs the whole window as one batch); got {config.micro_batch_size} × "
                           f"{config.grad_accum_steps} = {config.micro_batch_size * config.grad_accum_steps}.",
                           "grad_accum_steps")
    return config


class Check:
    """One submitted check: poll ``done``; then read ``report`` or ``error``."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future
        self.submitted = time.monotonic()

    @property
    def done(self) -> bool:
        return self._future.done()

    @property
    def running(self) -> bool:
        return self._future.running()

    @property
    def report(self) -> dict | None:
        return self._future.result() if self.done and self._future.exception() is None else None

    @property
    def error(self) -> str | None:
        if not self.done:
            return None
        error = self._future.exception()
        if error is None:
            return None
        return error.message if isinstance(error, GradaccError) else one_line(error)


class CheckRunner:
    """One worker thread; checks run in the order submitted; results kept by their settings."""

    def __init__(self, check_fn=None, key=None, thread_name: str = "gradacc-check"):
        """``check_fn(config)``: what a check runs (default: the equivalence check); ``key(config)``: the settings a
        result is remembered by (default: the equivalence check's); ``thread_name``: its worker's name's start."""
        self._check_fn = check_fn
        self._key = key or _key
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._lock = threading.Lock()
        self._checks: collections.OrderedDict[tuple, Check] = collections.OrderedDict()

    def submit(self, config: RunConfig) -> Check:
        key = self._key(config)
        with self._lock:
            known = self._checks.get(key)
            if known is not None and not known.error:  # same settings, same answer (it is deterministic)
                return known
            check = Check(self._executor.submit(self._run, config))
            self._checks[key] = check
            while len(self._checks) > KEEP_RESULTS:
                self._checks.popitem(last=False)
            return check

    def get(self, config: RunConfig) -> Check | None:
        with self._lock:
            return self._checks.get(self._key(config))

    def waiting_before(self, check: Check) -> int:
        """Checks submitted earlier that have not finished (0: this one is next or running)."""
        with self._lock:
            return sum(1 for other in self._checks.values()
                       if other is not check and not other.done and other.submitted < check.submitted)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _run(self, config: RunConfig) -> dict:
        if self._check_fn is not None:
            return self._check_fn(config)
        warmup.wait_until_warm()  # no import of torch beside the warm-up's (see gradacc.serving.warmup)
        return equivalence.check(config)


def coupled_check_configs(which: str | None = None) -> list[ValidConfig]:
    """The checks of "When accumulation is not a big batch", by set (``CHECK_SETS``; None: every one):
    "in-batch-negatives" (all-MiniLM-L6-v2, effective batch 64 three ways) and "norms" (BatchNorm against LayerNorm,
    effective batch 16 split into m = 2 … 16)."""
    sets = {"in-batch-negatives": [RunConfig(task="contrastive", model="all-MiniLM-L6-v2", dataset="builtin-pairs",
                                             micro_batch_size=16, grad_accum_steps=4, max_seq_length=32).check()],
            # Dropout 0, as the batchnorm demo's runs: the story is the norms', and a check's dropout masks drawn
            # beside a run's seeded model build (the generator is the process's) gave the demo's LayerNorm control
            # pair two inits ("differ by 6%", 2 of 5 browser runs).
            "norms": [RunConfig(model=model, micro_batch_size=4, grad_accum_steps=4, max_seq_length=32,
                                dropout=0.0).check() for model in ("bow-batchnorm", "bow-layernorm")]}
    return [config for name in CHECK_SETS if which in (None, name) for config in sets[name]]


# The sets of gradient checks a demo can show beside its runs (``Scenario.checks``).
CHECK_SETS = ("in-batch-negatives", "norms")


def _key(config: RunConfig) -> tuple:
    return (config.backend, config.model, config.task, config.micro_batch_size, config.grad_accum_steps,
            config.max_seq_length)
