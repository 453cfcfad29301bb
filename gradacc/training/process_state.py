"""The one guard on training state that a process shares between threads: torch's default generator and 🤗
Accelerate's singletons.

The app trains several visitors' runs, their gradient checks and the Audit page's stock Trainer on threads of one
server process. Three things there belong to the process, not to a thread:

- **torch's default generator.** A model's random init (``torch.manual_seed`` then draws), Trainer's ``set_seed``,
  the audit's replays (which put the generator's state back) and the probes that fork it all reseed or draw from it.
  Interleaved, they gave a run another init (4 of 30 builds beside a second thread building models).
- **Accelerate's state** (``AcceleratorState``, ``PartialState``, ``GradientState``): every ``Accelerator``, and so
  every Trainer, reads and writes the same accumulation counters and distributed type. A Trainer built beside a
  running Accelerate loop resets the loop's window count mid-run.
- **the draws of training.** A run's steps draw dropout masks from that generator without holding it (runs train
  side by side); the audit replays its window from the generator's state, and a run drawing meanwhile made it say
  "not judged" (3 of 6 audits beside a plain PyTorch run with dropout 0.1).

Whatever builds a model, a Trainer or an Accelerator, or trains, says what it needs:
``with process_state.guard(accelerate=True, training=ALONE, generator=True):``. Guards nest on one thread (a run
holds Accelerate's state while its Trainer build takes the generator too). They are taken in one order (``ORDER``):
a thread asking for a part that comes before one it holds alone would take them the other way round, and with
another thread waiting the opposite way both would wait for ever: that is refused at once.

GradCache (the contrastive task) copies the generator's state and sets it back in its backward pass: it holds the
generator meanwhile (``contrastive.MeasuredGradCache``).

A run's DataLoaders draw from a generator of their own (``own_generator``). Not guarded yet: concurrent runs with
dropout interleave their masks, and a model built beside a training run can
still get another init (8
of 20 tiny-bert builds beside a plain PyTorch run with dropout 0.1, measured on 7 December 2026): builds hold the
generator, but a run's steps only share the training part, so that runs and builds do not wait for each other.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator

# Held for a run's whole Accelerate or Trainer training, and for an audit's Trainer build and step.
_ACCELERATE = threading.RLock()
# Held for a seeded build or a fork of the generator (seconds at most), and for an audit's Trainer build and step.
_GENERATOR = threading.RLock()
# What a thread may hold, in the one order it takes them.
ORDER = ("accelerate", "training", "generator")
# How a block trains (``guard(training=...)``): a run's steps draw dropout masks beside other runs'; an audit replays
# its window from the generator's state, so no run may draw meanwhile.
SIDE_BY_SIDE, ALONE = "side by side", "alone"
_held = threading.local()  # how deep this thread holds each: the order check needs it, RLock does not tell
# The names of the threads blocked taking the guard now: a page says its audit waits for a run, not that it trains.
_waiting: dict[int, str] = {}


class LockOrderError(RuntimeError):
    """A thread asked for a part of the guard that comes before one it holds: the order that can deadlock."""


class _Training:
    """Runs train side by side; a block that trains alone waits until none trains, and runs that would start
    meanwhile wait for it (so a queue of runs does not keep an audit waiting for ever)."""

    def __init__(self):
        self._changed = threading.Condition()
        self._side_by_side = 0
        self._alone = False
        self._alone_waiting = 0

    def acquire(self, how: str) -> None:
        with self._changed:
            if how == ALONE:
                self._alone_waiting += 1
                try:
                    _wait_for(self._changed, lambda: not self._alone and not self._side_by_side)
                finally:
                    self._alone_waiting -= 1
                self._alone = True
            else:
                _wait_for(self._changed, lambda: not self._alone and not self._alone_waiting)
                self._side_by_side += 1

    def release(self, how: str) -> None:
        with self._changed:
            if how == ALONE:
                self._alone = False
            else:
                self._side_by_side -= 1
            self._changed.notify_all()


_TRAINING = _Training()


@contextlib.contextmanager
def guard(*, accelerate: bool = False, training: str | None = None, generator: bool = False) -> Iterator[None]:
    """Hold what the block needs of the process's training state, in ``ORDER``: Accelerate's state, training
    (``SIDE_BY_SIDE`` for a run's steps, ``ALONE`` for an audit's), then the generator. What this thread holds
    already is held again at no cost, except that a block training side by side cannot become one training alone."""
    if training not in (None, SIDE_BY_SIDE, ALONE):
        raise ValueError(f"training is {SIDE_BY_SIDE!r}, {ALONE!r} or None, not {training!r}")
    wanted = {"accelerate": accelerate, "training": training is not None, "generator": generator}
    for position, name in enumerate(ORDER):
        later = [other for other in ORDER[position + 1:] if _depth(other)]
        if wanted[name] and not _depth(name) and later:
            raise LockOrderError(f"{name} is taken before {', '.join(later)}, never while holding only those: take "
                                 "them in one process_state.guard(...)")
    if training == ALONE and _depth("training") and getattr(_held, "training_how", None) != ALONE:
        raise LockOrderError("a block training side by side cannot start training alone")
    with contextlib.ExitStack() as held:
        for name in ORDER:
            if not wanted[name]:
                continue
            if name == "training":
                if not _depth(name):  # the first hold on this thread says how; nested ones hold it again
                    _TRAINING.acquire(training)
                    _held.training_how = training
                    held.callback(_TRAINING.release, training)
            else:
                lock = _ACCELERATE if name == "accelerate" else _GENERATOR
                _acquire(lock)
                held.callback(lock.release)
            _enter(name)
            held.callback(_leave, name)
        yield


@contextlib.contextmanager
def generators_kept() -> Iterator[None]:
    """The process's random generators (Python's, NumPy's, torch's on the CPU and each GPU) as they were when the
    block began, once it ends: for a block that seeds or draws but is not a run (the audit). Within
    ``guard(generator=True)``, so no seeded build beside it is undone."""
    # here: the app imports this module (through the model sources) before torch and NumPy load
    import numpy as np
    import torch

    python, numpy = random.getstate(), np.random.get_state()
    gpus = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=gpus):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def own_generator(seed: int):
    """A generator of a run's own for its DataLoaders: every ``iter(loader)`` draws a base seed, from the process's
    generator unless the loader has one, and a run at dropout 0 drew nothing else. Drawn beside a gradient check's
    seeded build, that seed gave the check's model another init: a LayerNorm gradient 85% off where 1e-7 is the truth."""
    import torch  # here: the app imports this module before torch loads

    return torch.Generator().manual_seed(seed)


def waiting() -> list[str]:
    """The names of the threads waiting for their turn now."""
    return list(_waiting.values())


def _acquire(lock) -> None:
    if lock.acquire(blocking=False):
        return
    with _named_waiting():
        lock.acquire()


def _wait_for(condition: threading.Condition, ready) -> None:
    if ready():
        return
    with _named_waiting():
        condition.wait_for(ready)


@contextlib.contextmanager
def _named_waiting() -> Iterator[None]:
    me = threading.current_thread()
    _waiting[me.ident] = me.name
    try:
        yield
    finally:
        del _waiting[me.ident]


def _depth(name: str) -> int:
    return getattr(_held, name, 0)


def _enter(name: str) -> None:
    setattr(_held, name, _depth(name) + 1)


def _leave(name: str) -> None:
    setattr(_held, name, _depth(name) - 1)
