"""The Equivalence page's logic: run checks off the page's thread, one at a time, and say what they mean.

A check trains a few one-step runs (seconds; Trainer's setup makes it tens of seconds), so the page
submits it here and polls. One worker thread for the whole server: visitors' checks queue instead of
competing for the CPU, and a finished check is remembered, so the same settings answer at once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time

from gradacc.serving import warmup
from gradacc.config import RunConfig, field_label
from gradacc.analysis.equivalence import rows as report_rows  # light: torch is imported only inside check()
from gradacc.errors import GradaccError
from gradacc.serving.manager import one_line_error

# Largest window (m × k) the page accepts: the check builds the whole window as one batch too.
MAX_WINDOW = 256
EXACT_LOOKS_LIKE = 1e-5  # float32 rounding of a sum of micro-batch gradients stays well below this
KEEP_RESULTS = 32
CASE_NAMES = {"equal_windows": "equal windows", "short_last_window": "short last window",
              "token_level": "token-level loss"}


def check_config(backend: str, micro_batch_size, grad_accum_steps) -> RunConfig:
    """The config a check runs, validated; GradaccError names the field at fault."""
    config = RunConfig(backend=backend, micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                       max_seq_length=32).validate()
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
        return error.message if isinstance(error, GradaccError) else one_line_error(error)


class CheckRunner:
    """One worker thread; checks run in the order submitted; results kept by their settings."""

    def __init__(self, check_fn=None):
        self._check_fn = check_fn
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradacc-check")
        self._lock = threading.Lock()
        self._checks: collections.OrderedDict[tuple, Check] = collections.OrderedDict()

    def submit(self, config: RunConfig) -> Check:
        key = _key(config)
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
            return self._checks.get(_key(config))

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
        from gradacc.analysis.equivalence import check  # lazy: imports torch

        return check(config)


def _key(config: RunConfig) -> tuple:
    return config.backend, config.model, config.micro_batch_size, config.grad_accum_steps, config.max_seq_length


# ---- what the numbers mean ------------------------------------------------------------------------

def rows(report: dict) -> list[dict]:
    """(case, normalization, rel_error) rows for the chart, with readable case names."""
    return [{**row, "case": CASE_NAMES.get(row["case"], row["case"])} for row in report_rows(report)]


def table(report: dict) -> list[dict]:
    """One row per case: items per micro-batch and each normalisation's relative error."""
    out = []
    for case, result in report["cases"].items():
        row = {"case": CASE_NAMES.get(case, case),
               "items per micro-batch": ", ".join(str(i) for i in result.get("micro_batch_items", [])),
               "naive": result.get("naive_rel_error"), "exact": result.get("exact_rel_error")}
        if "library_default_rel_error" in result:
            row["Trainer library default"] = result["library_default_rel_error"]
        out.append(row)
    return out


def explanation(report: dict) -> list[str]:
    """Plain sentences: exact matches the full batch; where naive is off and by how much; Trainer's default."""
    cases = report["cases"]
    k = report["grad_accum_steps"]
    sentences = []
    worst_exact = max(result["exact_rel_error"] for result in cases.values())
    if worst_exact <= EXACT_LOOKS_LIKE:
        sentences.append(f"Exact normalisation: every relative error is at most {worst_exact:.1e}, float32 rounding. "
                         "Accumulating these micro-batches gives the full-batch gradient.")
    else:
        sentences.append(f"Exact normalisation is off by up to {worst_exact:.1e}: more than rounding. "
                         "Something in this backend changes the gradient.")
    naive_off = {case: result["naive_rel_error"] for case, result in cases.items()
                 if result["naive_rel_error"] > EXACT_LOOKS_LIKE}
    equal = cases.get("equal_windows")
    if equal is not None and equal["naive_rel_error"] <= EXACT_LOOKS_LIKE:
        sentences.append("Naive (each micro-batch mean ÷ k) is right only when every window holds m × k examples "
                         "of equal weight.")
    if naive_off:
        parts = [f"{error:.0%} off with a {CASE_NAMES.get(case, case)}" for case, error in naive_off.items()]
        sentences.append("Naive is " + " and ".join(parts) + ": the epoch's short last window and token-level "
                         "losses give micro-batches unequal weight, which ÷ k ignores.")
    if equal is not None and "library_default_rel_error" in equal:
        error = equal["library_default_rel_error"]
        if error > EXACT_LOOKS_LIKE:
            sentences.append(f"Trainer's library default (no compute_loss_func) is {error:.0%} off even with equal "
                             f"windows: about {1 + error:.1f}× the full-batch gradient with k = {k}. In transformers 5 "
                             "Trainer skips its own ÷ k for models whose forward takes **kwargs (BERT does); gradacc "
                             "passes a compute_loss_func that fixes it.")
        else:
            sentences.append("Trainer's library default matches the full-batch gradient with equal windows here.")
    return sentences
