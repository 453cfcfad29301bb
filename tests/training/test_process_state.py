"""The one guard on what threads of one process share (gradacc.training.process_state): it nests on a thread, makes
other threads wait, refuses the order that can deadlock, and an audit-like block leaves the generators as it found
them."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import torch

from gradacc.training import process_state
from gradacc.training.process_state import LockOrderError, guard

WAIT_S = 60  # only against a hang: every wait below ends on an outcome


def test_guards_nest_on_one_thread_as_a_run_holds_accelerate_and_its_trainer_build_takes_both():
    with guard(accelerate=True):
        with guard(accelerate=True, generator=True):
            with guard(generator=True):
                pass
    with guard(generator=True):  # released in full: taken again at once
        pass


def test_holding_the_generator_alone_then_asking_for_accelerate_is_refused_not_a_deadlock():
    with guard(generator=True):
        with pytest.raises(LockOrderError):
            with guard(accelerate=True):
                pass
    with guard(accelerate=True, generator=True):  # the refusal left nothing held
        pass


def test_another_thread_waits_for_what_is_held_and_goes_on_when_it_is_released():
    entered, release = threading.Event(), threading.Event()

    def holder():
        with guard(accelerate=True):
            entered.set()
            release.wait(WAIT_S)

    def waiter(got: threading.Event):
        with guard(accelerate=True, generator=True):
            got.set()

    first = threading.Thread(target=holder)
    first.start()
    assert entered.wait(WAIT_S)
    got = threading.Event()
    second = threading.Thread(target=waiter, args=(got,), name="waiter")
    second.start()
    with guard(generator=True):  # what the holder does not hold stays free
        pass
    deadline = time.monotonic() + WAIT_S
    while process_state.waiting() != ["waiter"]:  # it says who waits (the Audit page's "waiting for a run")
        assert time.monotonic() < deadline, process_state.waiting()
        time.sleep(0.01)
    assert not got.is_set()
    release.set()
    assert got.wait(WAIT_S)
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert process_state.waiting() == []


def test_a_run_thread_and_an_audit_thread_in_opposite_nestings_both_finish():
    """A run holds Accelerate's state and takes the generator for its Trainer build; an audit takes both at once;
    a model build takes the generator alone. Many times over, on three threads: none waits for ever."""
    rounds = 200

    def run():
        for _ in range(rounds):
            with guard(accelerate=True):
                with guard(generator=True):
                    pass

    def audit():
        for _ in range(rounds):
            with guard(accelerate=True, generator=True):
                pass

    def build():
        for _ in range(rounds):
            with guard(generator=True):
                pass

    threads = [threading.Thread(target=target, daemon=True) for target in (run, audit, build)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(thread.is_alive() for thread in threads)


def test_generators_kept_puts_pythons_numpys_and_torchs_back_as_they_were():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = random.random(), float(np.random.rand()), float(torch.rand(()))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with guard(generator=True), process_state.generators_kept():
        random.seed(2), np.random.seed(2), torch.manual_seed(2)  # what Trainer's set_seed does
        torch.rand(5)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected


def test_runs_train_side_by_side_and_an_audit_trains_when_none_does_before_runs_that_come_after_it():
    """A run's steps draw dropout masks; an audit replays its window from the generator's state."""
    from gradacc.training.process_state import ALONE, SIDE_BY_SIDE

    order, first_in, release = [], threading.Event(), threading.Event()

    def run(name: str, entered: threading.Event | None = None):
        with guard(training=SIDE_BY_SIDE):
            order.append(name)
            if entered is not None:
                entered.set()
                release.wait(WAIT_S)

    def audit():
        with guard(accelerate=True, training=ALONE, generator=True):
            order.append("audit")

    first = threading.Thread(target=run, args=("run 1", first_in))
    first.start()
    assert first_in.wait(WAIT_S)
    run("run 2")  # beside run 1, at once
    auditor = threading.Thread(target=audit, name="auditor")
    auditor.start()
    wait_until_waiting("auditor")
    later = threading.Thread(target=run, args=("run 3",), name="later run")
    later.start()
    wait_until_waiting("later run")  # behind the audit, though run 1 still trains
    release.set()
    for thread in (first, auditor, later):
        thread.join(WAIT_S)
    assert order == ["run 1", "run 2", "audit", "run 3"]


def test_a_run_cannot_turn_into_an_audit_nor_take_accelerate_after_its_training():
    from gradacc.training.process_state import ALONE, SIDE_BY_SIDE

    with guard(training=SIDE_BY_SIDE):
        with pytest.raises(LockOrderError):
            with guard(training=ALONE):
                pass
        with pytest.raises(LockOrderError):
            with guard(accelerate=True):
                pass
        with guard(training=SIDE_BY_SIDE, generator=True):  # nested, and what comes after it: as a Trainer build
            pass


def wait_until_waiting(name: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while name not in process_state.waiting():
        assert time.monotonic() < deadline, process_state.waiting()
        time.sleep(0.01)


def test_gradcache_setting_the_generators_state_back_waits_for_a_model_build_on_another_thread():
    from gradacc.training.contrastive import MeasuredGradCache

    embedded = []

    class GradCache:  # the library's embed_minibatch: with random_state it sets the process's generator state
        def embed_minibatch(self, sentence_feature, begin, end, with_grad, copy_random_state, random_state=None):
            embedded.append(random_state)

    loss = type("Measured", (MeasuredGradCache, GradCache), {})()
    building, built = threading.Event(), threading.Event()

    def build():  # a model's seeded init, as sources.models takes it
        with guard(generator=True):
            building.set()
            built.wait(WAIT_S)

    builder = threading.Thread(target=build)
    builder.start()
    assert building.wait(WAIT_S)
    backward = threading.Thread(target=loss.embed_minibatch, args=({}, 0, 4, True, False, "state"), name="gradcache")
    backward.start()
    deadline = time.monotonic() + WAIT_S
    while process_state.waiting() != ["gradcache"]:
        assert time.monotonic() < deadline, process_state.waiting()
        time.sleep(0.01)
    assert embedded == []  # the re-embedding waits for the build
    built.set()
    backward.join(WAIT_S)
    builder.join(WAIT_S)
    assert embedded == ["state"]
    loss.embed_minibatch({}, 0, 4, False, False)  # an embedding that leaves the generator alone takes no guard
    assert embedded == ["state", None]


@pytest.mark.parametrize("backend", ["pytorch", "accelerate", "trainer"])
def test_a_run_at_dropout_0_draws_nothing_from_the_process_generator_once_its_model_is_built(backend, one_torch_thread):
    """A draw there lands between another thread's manual_seed and its model's init: a gradient check beside a
    demo's runs got another LayerNorm init (its error 0.85 where 1e-7 is the truth). The DataLoaders drew a base
    seed at every pass, epochs and evaluation included."""
    from gradacc.config import RunConfig
    from gradacc.events import Recorder
    from gradacc.training.run.engine import train

    states = []
    config = RunConfig(model="bow-layernorm", backend=backend, dropout=0.0, micro_batch_size=4, grad_accum_steps=4,
                       train_samples=64, eval_samples=16, epochs=2)
    ended = train(config, Recorder(), before_optimizer_step=lambda model: states.append(torch.get_rng_state()))
    assert ended["status"] == "completed", ended
    assert len(states) == 8  # two epochs of 4 steps, each pass and evaluation drawing if it draws
    assert all(torch.equal(states[0], state) for state in states + [torch.get_rng_state()])
