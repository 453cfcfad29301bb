"""The one guard on training state that a process shares between threads: torch's default generator and 🤗
Accelerate's singletons.

The app trains several visitors' runs, their gradient checks and the Audit page's stock Trainer on threads of one
server process. Two things there belong to the process, not to a thread:

- **torch's default generator.** A model's random init (``torch.manual_seed`` then draws), Trainer's ``set_seed``,
  the audit's replays (which put the generator's state back) and the probes that fork it all reseed or draw from it.
  Interleaved, they gave a run another init (4 of 30 builds beside a second thread building models).
- **Accelerate's state** (``AcceleratorState``, ``PartialState``, ``GradientState``): every ``Accelerator``, and so
  every Trainer, reads and writes the same accumulation counters and distributed type. A Trainer built beside a
  running Accelerate loop resets the loop's window count mid-run.

Whatever builds a model, a Trainer or an Accelerator, or trains with one, says which it needs:
``with process_state.guard(accelerate=True, generator=True):``. Guards nest on one thread (a run holds Accelerate's
state while its Trainer build takes the generator too). Two locks, taken in one order: Accelerate's state, then the
generator. A thread holding only the generator that asks for Accelerate's state would take them the other way round,
and with a run thread waiting the opposite way both would wait for ever: that is refused at once.

Not guarded yet: a run's training draws its dropout masks from the same generator, and GradCache (the contrastive
task) puts the generator's state back in its backward pass, without taking the generator: only Accelerate's state is
held for a whole training (runs on the plain PyTorch loop hold nothing and train side by side). So concurrent runs
with dropout interleave their masks, and a model built beside a training run can still get another init (8 of 20
tiny-bert builds beside a plain PyTorch run with dropout 0.1, measured on 7 December 2026).
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
_held = threading.local()  # how deep this thread holds each: the order check needs it, RLock does not tell
# The names of the threads blocked taking the guard now: a page says its audit waits for a run, not that it trains.
_waiting: dict[int, str] = {}


class LockOrderError(RuntimeError):
    """A thread holding the generator asked for Accelerate's state: the order that can deadlock."""


@contextlib.contextmanager
def guard(*, accelerate: bool = False, generator: bool = False) -> Iterator[None]:
    """Hold what the block needs of the process's training state, Accelerate's state before the generator."""
    if accelerate and _depth("generator") and not _depth("accelerate"):
        raise LockOrderError("Accelerate's state is taken before torch's generator, never while holding it alone: "
                             "take both in one process_state.guard(accelerate=True, generator=True)")
    with contextlib.ExitStack() as held:
        for name, lock, wanted in (("accelerate", _ACCELERATE, accelerate), ("generator", _GENERATOR, generator)):
            if wanted:
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


def waiting() -> list[str]:
    """The names of the threads waiting for their turn now."""
    return list(_waiting.values())


def _acquire(lock) -> None:
    if lock.acquire(blocking=False):
        return
    me = threading.current_thread()
    _waiting[me.ident] = me.name
    try:
        lock.acquire()
    finally:
        del _waiting[me.ident]


def _depth(name: str) -> int:
    return getattr(_held, name, 0)


def _enter(name: str) -> None:
    setattr(_held, name, _depth(name) + 1)


def _leave(name: str) -> None:
    setattr(_held, name, _depth(name) - 1)
