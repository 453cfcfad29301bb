"""The three ways people accumulate gradients; each trains a prepared ``Job`` and emits events."""

from __future__ import annotations

import importlib

MODULES = {"pytorch": "gradacc.training.backends.pytorch_loop", "accelerate": "gradacc.training.backends.accelerate_loop",
           "trainer": "gradacc.training.backends.trainer_loop"}

DESCRIPTIONS = {
    "pytorch": "Plain PyTorch loop: scale the loss, backward() each micro-batch, step every k.",
    "accelerate": "🤗 Accelerate: Accelerator(gradient_accumulation_steps=k) and accelerator.accumulate(model).",
    "trainer": "🤗 Transformers Trainer: TrainingArguments(gradient_accumulation_steps=k), evaluated each epoch.",
}


def train_function(backend: str):
    """The backend's ``train(job)``, imported only when used (accelerate and transformers import slowly)."""
    return importlib.import_module(MODULES[backend]).train
