"""Deployment limits, read from the environment once per request: what a visitor may ask of this server.

    GRADACC_MAX_EPOCHS          most epochs a run may train (unset: no limit beyond the config's own)
    GRADACC_MAX_TRAIN_SAMPLES   most training examples a run may use; also caps eval examples
    GRADACC_MAX_RUN_SECONDS     wall-clock limit of a run, after which it is stopped (default 600; 0: none)
    GRADACC_MAX_CONCURRENT_RUNS runs that train at once; the others wait in a queue (default 1)
    GRADACC_MAX_UPLOAD_MB       largest data file a visitor may upload (default 5)
    GRADACC_ALLOW_HUB           0/false/no: refuse hub model and dataset ids (default: allowed)
    GRADACC_MAX_RUN_MEMORY_MB   most memory one run may need (measured before it starts; unset: no limit)

The app and the CLI both call ``Limits.from_env().check(config)``; a bad value raises ``GradaccError``
naming the field, like ``RunConfig.check``. The run manager takes its slots and run-time limit from here,
and a bad environment value is refused with one sentence naming the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gradacc import env, paths
from gradacc.choices import BUILTIN_DATASETS, BUILTIN_MODELS
from gradacc.config import RunConfig
from gradacc.labels import field_label
from gradacc.errors import GradaccError
from gradacc.training.sources.hub import hub_allowed  # light: os and socket only

DEFAULT_MAX_RUN_SECONDS = 600.0
DEFAULT_MAX_CONCURRENT_RUNS = 1
DEFAULT_MAX_UPLOAD_MB = 5.0


@dataclass(frozen=True)
class Limits:
    max_epochs: int | None = None
    max_train_samples: int | None = None
    # None: no time limit.
    max_run_seconds: float | None = DEFAULT_MAX_RUN_SECONDS
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB
    allow_hub: bool = True
    max_concurrent_runs: int = DEFAULT_MAX_CONCURRENT_RUNS
    # A run measured to need more is refused before it starts (gradacc.training.memory.budget); None: no limit.
    max_run_memory_mb: float | None = None

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "Limits":
        variables = os.environ if environ is None else environ
        run_seconds = env.number(variables, "GRADACC_MAX_RUN_SECONDS", DEFAULT_MAX_RUN_SECONDS, allow_zero=True)
        return cls(max_epochs=env.whole_number(variables, "GRADACC_MAX_EPOCHS"),
                   max_train_samples=env.whole_number(variables, "GRADACC_MAX_TRAIN_SAMPLES"),
                   max_run_seconds=run_seconds or None,
                   max_upload_mb=env.number(variables, "GRADACC_MAX_UPLOAD_MB", DEFAULT_MAX_UPLOAD_MB),
                   allow_hub=hub_allowed(variables),
                   max_concurrent_runs=env.whole_number(variables, "GRADACC_MAX_CONCURRENT_RUNS")
                   or DEFAULT_MAX_CONCURRENT_RUNS,
                   max_run_memory_mb=env.number(variables, env.MAX_RUN_MEMORY_MB, 0.0) or None)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1_000_000)

    def errors(self, config: RunConfig) -> dict[str, str]:
        """Every limit ``config`` breaks, as {field: one sentence} (``config``: checked, or its values that passed
        the check: ``epochs`` filled in)."""
        found = {}
        if self.max_epochs is not None and config.epochs > self.max_epochs:
            found["epochs"] = (f"{field_label('epochs')} must be at most {self.max_epochs} on this deployment; "
                               f"got {config.epochs}.")
        if self.max_train_samples is not None:
            for name in ("train_samples", "eval_samples"):
                value = getattr(config, name)
                if value is None or value > self.max_train_samples:
                    found[name] = (f"{field_label(name)} must be at most {self.max_train_samples:,} on this "
                                   f"deployment; got {'all of them' if value is None else value}.")
        if not self.allow_hub:
            if is_hub_model(config.model):
                found["model"] = (f"{field_label('model')} must be a built-in model ({', '.join(BUILTIN_MODELS)}): "
                                  f"hub ids are disabled on this deployment; got {config.model!r}.")
            if is_hub_dataset(config.dataset):
                found["dataset"] = (f"{field_label('dataset')} must be a built-in dataset or an uploaded file: hub "
                                    f"ids are disabled on this deployment; got {config.dataset!r}.")
        return found

    def check(self, config: RunConfig) -> RunConfig:
        """Raise GradaccError for the first limit ``config`` breaks; return ``config``."""
        for field, message in self.errors(config).items():
            raise GradaccError(message, field)
        return config

    def describe(self) -> list[str]:
        """Short phrases for the page: what this deployment allows."""
        return [
            f"at most {self.max_epochs} epoch(s)" if self.max_epochs else "no epoch limit",
            f"at most {self.max_train_samples:,} training samples" if self.max_train_samples else "no sample limit",
            f"runs stop after {self.max_run_seconds:g} s" if self.max_run_seconds else "no time limit",
            f"uploads up to {self.max_upload_mb:g} MB",
            "hub ids allowed" if self.allow_hub else "hub ids disabled",
            f"runs up to {self.max_run_memory_mb:,.0f} MB of memory" if self.max_run_memory_mb
            else "no memory limit per run",
        ]


def is_hub_model(name: str) -> bool:
    name = (name or "").strip()
    return bool(name) and name not in BUILTIN_MODELS and not paths.model_is_local(name)


def is_hub_dataset(name: str) -> bool:
    name = (name or "").strip()
    return bool(name) and name not in BUILTIN_DATASETS and not paths.dataset_is_local(name)
