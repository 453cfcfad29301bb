"""``gradacc audit -- python train.py ARGS``: the user's script runs unchanged, and the audit attaches itself to every
``Trainer`` it builds (TRL's trainers too: they call ``Trainer.__init__``), to every Accelerate loop it prepares, to
every Lightning ``Trainer`` it builds (``lightning`` or ``pytorch_lightning``: an ``AuditCallback`` in its callbacks),
and to every plain PyTorch loop: an optimizer no framework owns, stepping the parameters of one module.

The command puts ``site/`` first on the script's PYTHONPATH and names a folder in ``GRADACC_AUDIT_DIR``; Python
then imports ``site/sitecustomize.py`` at start-up, which calls ``install()``: a finder on ``sys.meta_path`` that,
when (and only if) the script imports ``transformers.trainer`` or ``accelerate.accelerator``, patches
``Trainer.__init__`` (``audit_trainer(self)``), ``Accelerator.prepare`` (``audit_accelerate`` once a model and its
optimizer are prepared, except for a Trainer's own accelerator) and ``torch.optim.Optimizer.__init__``
(``audit_loop`` on the smallest module holding all the optimizer's parameters; not for an optimizer built inside
``Trainer.train``, and withdrawn when Accelerate prepares it or a Trainer is given it). Each verdict is written to
that folder as one JSON file, which the command reads back and prints; a plain loop that never stepped leaves a
"not judged" one. Lightning's trainer module: its ``Trainer.__init__`` (an ``AuditCallback`` added to ``callbacks``)
and ``Trainer.fit`` (the optimizers ``configure_optimizers`` builds are Lightning's). Child processes (``torchrun``,
``accelerate launch``, Lightning's DDP) inherit it all.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.abc
import importlib.util
import itertools
import logging
import os
import sys
import threading

ENV = "GRADACC_AUDIT_DIR"
_count = itertools.count()
_framework = threading.local()  # .depth > 0 inside a framework's train(): the optimizers it builds are its own


def verdict_path(kind: str) -> str:
    return os.path.join(os.environ[ENV], f"verdict-{os.getpid()}-{next(_count)}-{kind}.json")


@contextlib.contextmanager
def framework_owned():
    """Optimizers built inside are a framework's (its own audit watches them), not a plain loop's."""
    _framework.depth = getattr(_framework, "depth", 0) + 1
    try:
        yield
    finally:
        _framework.depth -= 1


def withdraw_loop_audit(optimizer) -> None:
    """A framework took over ``optimizer`` (and audits it its own way): its plain-loop audit ends, unsaid."""
    audit = vars(optimizer).get("_gradacc_loop_audit") if hasattr(optimizer, "__dict__") else None
    if audit is not None:
        audit.cancel()


def patch_trainer(module) -> None:
    trainer_class = module.Trainer
    original = trainer_class.__init__
    train = trainer_class.train

    def train_owned(self, *args, **kwargs):
        with framework_owned():
            return train(self, *args, **kwargs)

    trainer_class.train = train_owned

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if getattr(self, "_gradacc_audit", None) is not None:  # a subclass's __init__ around super().__init__
            return
        if getattr(self, "optimizer", None) is not None:  # Trainer(optimizers=(optimizer, ...)): the Trainer's now
            withdraw_loop_audit(self.optimizer)
        accelerator = getattr(self, "accelerator", None)
        if accelerator is not None:  # it prepares the model in train(): not a loop of the user's own
            accelerator._gradacc_trainer_owned = True
        from gradacc.audit import audit_trainer  # here: it imports transformers, and this module loads at start-up

        self._gradacc_audit = audit_trainer(self, json_path=verdict_path(f"trainer-{type(self).__name__}"))

    trainer_class.__init__ = __init__


def patch_accelerator(module) -> None:
    accelerator_class = module.Accelerator
    prepare = accelerator_class.prepare

    def prepared(self, *args, **kwargs):
        result = prepare(self, *args, **kwargs)
        if getattr(self, "_gradacc_trainer_owned", False) or getattr(self, "_gradacc_audit", None) is not None:
            return result
        # here: sitecustomize imports this module at the start of every audited script, before it imports anything
        import torch
        from accelerate.optimizer import AcceleratedOptimizer

        items = result if isinstance(result, tuple) else (result,)
        for prepared_optimizer in (x for x in items if isinstance(x, AcceleratedOptimizer)):
            withdraw_loop_audit(prepared_optimizer.optimizer)
        model = next((x for x in items if isinstance(x, torch.nn.Module)), None)
        optimizer = next((x for x in items if isinstance(x, AcceleratedOptimizer)), None)
        if model is not None and optimizer is not None:
            from gradacc.audit import audit_accelerate  # here, as audit_trainer above

            self._gradacc_audit = audit_accelerate(self, model, optimizer, json_path=verdict_path("accelerate"))
            atexit.register(self._gradacc_audit.finish)  # a loop of one window: its scheduler steps counted to the end
        return result

    accelerator_class.prepare = prepared


def patch_lightning(module) -> None:
    """Lightning's ``Trainer`` (``lightning.pytorch`` or ``pytorch_lightning``): an ``AuditCallback`` added to the
    callbacks it is built with, unless the script gave one; the optimizers ``fit`` builds are no plain loop's."""
    trainer_class = module.Trainer
    original = trainer_class.__init__
    fit = trainer_class.fit

    def fit_owned(self, *args, **kwargs):  # configure_optimizers runs inside: its optimizers are Lightning's
        with framework_owned():
            return fit(self, *args, **kwargs)

    trainer_class.fit = fit_owned

    def __init__(self, *args, **kwargs):
        # here: it imports lightning, and this module loads at start-up
        from gradacc.training.audit.lightning_audit import AuditCallback

        given = kwargs.get("callbacks")
        callbacks = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
        if not any(isinstance(c, AuditCallback) for c in callbacks):
            callbacks.append(AuditCallback(json_path=verdict_path("lightning")))
        original(self, *args, **{**kwargs, "callbacks": callbacks})

    trainer_class.__init__ = __init__


def owning_module(optimizer):
    """The smallest module holding every parameter ``optimizer`` steps (the model a plain loop calls); None when no
    module holds them all. Looked up once per optimizer, among the live objects."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not wanted:
        return None
    import torch  # here: this module loads at start-up, before the script imports torch

    best, best_size = None, None
    for candidate in gc.get_objects():
        if not issubclass(type(candidate), torch.nn.Module):  # type(), not isinstance: no deprecated proxy wakes up
            continue
        owned = {id(p) for p in candidate.parameters()}
        if wanted <= owned and (best_size is None or len(owned) < best_size):
            best, best_size = candidate, len(owned)
    return best


def patch_optimizer(module) -> None:
    optimizer_class = module.Optimizer
    original = optimizer_class.__init__

    def __init__(self, params, *args, **kwargs):
        original(self, params, *args, **kwargs)
        if getattr(_framework, "depth", 0) or "_gradacc_loop_audit" in vars(self):
            return
        model = owning_module(self)
        if model is None:
            return
        from gradacc.training.audit.loop_audit import audit_loop  # here: it imports torch, which is importing now

        audit = audit_loop(model, self, json_path=verdict_path("loop"))
        self._gradacc_loop_audit = audit
        atexit.register(audit.finish)  # scheduler steps counted to the end; a loop that never stepped says so

    optimizer_class.__init__ = __init__


PATCHES = {"transformers.trainer": patch_trainer, "accelerate.accelerator": patch_accelerator,
           "torch.optim.optimizer": patch_optimizer, "lightning.pytorch.trainer.trainer": patch_lightning,
           "pytorch_lightning.trainer.trainer": patch_lightning}


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules to patch as Python would, and patches each right after it executes."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, PATCHES[name])
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


def install() -> None:
    """Patch what the script will import (nothing heavy is imported here), and keep the verdict lines to the
    command, which prints them once."""
    if not os.environ.get(ENV) or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    logging.getLogger("gradacc.audit").disabled = True
    sys.meta_path.insert(0, _Finder())
