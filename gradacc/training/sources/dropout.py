"""The run's dropout, applied to any transformers model, and a test of whether it took.

Families name their dropout differently (BERT ``hidden_dropout_prob``, GPT-2 ``resid_pdrop``, DistilBERT
``dropout`` and ``seq_classif_dropout``, Llama ``attention_dropout``...), and some heads build ``nn.Dropout``
with a fixed ``p``. So the run's dropout goes to every config attribute whose name says dropout, before the
model is built (``set_in_config``), and to every torch Dropout module and every float attribute of a module
named like one, after (``set_in_modules``). What draws randomness another way cannot be set, so it is found:
``variation`` runs one micro-batch twice in training mode and measures how far the outputs differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradacc.training import process_state

# A config or module attribute whose (lower-case) name holds one of these is a dropout probability.
WORDS = ("dropout", "pdrop")
# Two passes of a deterministic model agree to the bit on one device; anything beyond float noise of this size
# relative to the output's scale is randomness.
TOLERANCE = 1e-6


def _is_probability(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


def _names_dropout(name: str) -> bool:
    return any(word in name.lower() for word in WORDS)


def set_in_config(model_config, dropout: float, prefix: str = "") -> list[str]:
    """Set every attribute of a transformers config (and of its sub-configs) that names a dropout probability.

    ``None`` values are left alone: they mean "use another dropout setting", which is set too.
    Returns the names set (a sub-config's as ``text_config.attention_dropout``).
    """
    names = []
    for name, value in list(vars(model_config).items()):
        if name.startswith("_"):
            continue
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config (text_config, ...)
            names += set_in_config(value, dropout, f"{prefix}{name}.")
        elif _names_dropout(name) and _is_probability(value):
            setattr(model_config, name, float(dropout))
            names.append(prefix + name)
    return names


def set_in_modules(model, dropout: float) -> int:
    """Set ``p`` of every torch Dropout module, and every float attribute named like a dropout of every module
    (attention layers keep ``attention_dropout`` as a float for ``scaled_dot_product_attention``).

    Returns how many Dropout modules were set.
    """
    # here: the app and `gradacc --help` import this module before torch loads
    from torch.nn.modules.dropout import _DropoutNd

    modules = 0
    for module in model.modules():
        if isinstance(module, _DropoutNd):
            module.p = float(dropout)
            modules += 1
            continue
        for name, value in list(vars(module).items()):
            if not name.startswith("_") and _names_dropout(name) and isinstance(value, float) and _is_probability(value):
                setattr(module, name, float(dropout))
    return modules


@dataclass(frozen=True)
class Variation:
    """How far two training-mode passes of one micro-batch differ: ``max_difference`` of the outputs (logits),
    ``scale`` their largest magnitude."""

    max_difference: float
    scale: float

    @property
    def varies(self) -> bool:
        return self.max_difference > TOLERANCE * max(1.0, self.scale)


def variation(model, batch: dict, device, autocast) -> Variation:
    """Run ``batch`` through ``model`` twice in training mode, without gradients, and compare the outputs.

    The random stream the run's dropout draws from, the model's buffers (batch-norm statistics) and its mode
    are as they were afterwards: the run trains exactly as it would have without this test.
    """
    import torch  # here: the app and `gradacc --help` import this module before torch loads

    was_training = model.training
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    model.train()
    try:
        # Forked, then put back as it was: not while another thread seeds a model's init.
        gpus = [device.index or 0] if device.type == "cuda" else []
        with process_state.guard(generator=True), torch.random.fork_rng(devices=gpus), torch.no_grad():
            first, second = (_output(model, batch, autocast) for _ in range(2))
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
    return Variation(max_difference=float((first - second).abs().max()) if first.numel() else 0.0,
                     scale=float(first.abs().max()) if first.numel() else 0.0)


def _output(model, batch: dict, autocast):
    with autocast():
        outputs = model(**batch)
    logits = outputs.logits if hasattr(outputs, "logits") else outputs[0]
    return logits.detach().float()


def note(model_name: str, dropout: float, found: Variation) -> str | None:
    """What to tell the person when the run's dropout did not take; None when it did, as far as one can see."""
    if dropout == 0 and found.varies:
        return (f"Dropout 0 could not be applied to model {model_name}: its output still differs between two passes "
                f"in training mode (max difference {found.max_difference:.1e}); something in it draws randomness "
                "another way.")
    if dropout > 0 and found.max_difference == 0:
        return (f"Dropout {dropout:g} could not be applied to model {model_name}: its output is the same on every "
                "pass in training mode (it has no dropout gradacc can set).")
    return None


def refusal(model_name: str, found: Variation) -> str:
    """The equivalence check's one-line reason to refuse a model whose output is random at dropout 0."""
    return (f"Model {model_name}: the model's output is not deterministic with dropout 0 (max difference "
            f"{found.max_difference:.1e}); the gradient comparison would be meaningless.")
