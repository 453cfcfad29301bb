"""The background import of the training libraries, and the one rule that comes with it: no AST is built
while it imports (CPython 3.11 can fail torch's import for good; see gradacc/serving/warmup.py)."""

import importlib
import sys
import threading
import tomllib
import types

import pytest

from gradacc.serving import warmup
from support import ROOT


@pytest.fixture
def fresh_warmup(monkeypatch):
    """A warm-up that has never run, importing what each test says instead of torch."""
    # A real warm-up still importing (a page test's) would otherwise finish against this test's state.
    assert warmup.wait_until_warm(timeout=180), "the app's warm-up did not finish"
    monkeypatch.setattr(warmup, "_state", "cold")
    monkeypatch.setattr(warmup, "_failure", None)
    monkeypatch.setattr(warmup, "_done", threading.Event())
    monkeypatch.setattr(warmup, "_importing", threading.Lock())
    monkeypatch.setattr(warmup, "_thread", None)
    yield warmup
    # The test's warm-up thread must end before the real lock and event are put back, or it would release
    # the real lock (a real warm-up's, in a later test) and leave that warm-up unable to finish.
    if warmup._thread is not None:
        warmup._thread.join(10)
        assert not warmup._thread.is_alive(), "a test's warm-up thread is still running"


class WatchedLock:
    """A lock that says when someone has asked for it while it was held."""

    def __init__(self, lock):
        self.lock, self.waiting = lock, threading.Event()

    def acquire(self, *args, **kwargs):
        if self.lock.locked():
            self.waiting.set()
        return self.lock.acquire(*args, **kwargs)

    def release(self):
        self.lock.release()

    def locked(self):
        return self.lock.locked()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def slow_imports(monkeypatch, gate: threading.Event, fail: str | None = None):
    """import_module that holds until ``gate`` is set, and raises for the module named ``fail``."""
    real = importlib.import_module

    def import_module(name):
        gate.wait(10)
        if name == fail:
            raise ImportError(f"No module named {name!r}")
        return real(name)

    monkeypatch.setattr(warmup, "_import", import_module)


def test_start_is_idempotent_and_ends_warm(fresh_warmup, monkeypatch):
    monkeypatch.setattr(warmup, "IMPORTS", [("json", ("dumps",)), ("math", ())])
    gate = threading.Event()
    slow_imports(monkeypatch, gate)
    assert warmup.state() == "cold" and warmup.wait_until_warm(timeout=0)  # never started: nothing to wait for
    warmup.start()
    warmup.start()
    assert warmup.state() == "warming"
    assert not warmup.wait_until_warm(timeout=0)  # the gate is shut: not done, whatever the clock says
    gate.set()
    assert warmup.wait_until_warm(timeout=10)
    assert warmup.state() == "warm" and warmup.failure() is None


def test_parse_waits_for_the_imports(fresh_warmup, monkeypatch):
    monkeypatch.setattr(warmup, "IMPORTS", [("json", ())])
    gate = threading.Event()
    slow_imports(monkeypatch, gate)
    lock = WatchedLock(warmup._importing)
    monkeypatch.setattr(warmup, "_importing", lock)
    warmup.start()
    parsed = []
    parser = threading.Thread(target=lambda: parsed.append(warmup.parse("x = 1")))
    parser.start()
    assert lock.waiting.wait(10), "the parse never reached the import lock"
    assert parser.is_alive() and not parsed  # held while the imports run: the gate is still shut
    gate.set()
    parser.join(10)
    assert len(parsed) == 1 and warmup.state() == "warm"


def test_a_module_the_warm_up_imports_may_parse(fresh_warmup, monkeypatch):
    """The warm-up thread holds the parse lock: a parse inside its own imports must not wait on itself."""
    parsed = []
    monkeypatch.setattr(warmup, "IMPORTS", [("json", ())])
    monkeypatch.setattr(warmup, "_import", lambda name: parsed.append(warmup.parse("z = 3")))
    warmup.start()
    assert warmup.wait_until_warm(timeout=5), "the warm-up deadlocked on its own parse"
    assert len(parsed) == 1 and warmup.state() == "warm"


def test_a_failed_import_is_reported_and_ends_the_wait(fresh_warmup, monkeypatch):
    monkeypatch.setattr(warmup, "IMPORTS", [("json", ()), ("no_such_module_xyz", ()), ("math", ())])
    gate = threading.Event()
    gate.set()
    slow_imports(monkeypatch, gate, fail="no_such_module_xyz")
    warmup.start()
    assert warmup.wait_until_warm(timeout=10)
    assert warmup.state() == "failed"
    assert warmup.failure() == "no_such_module_xyz: ImportError: No module named 'no_such_module_xyz'"
    assert warmup.parse("y = 2").body  # parsing is free again


def test_a_run_waits_for_the_warm_up_and_can_be_stopped_meanwhile(fresh_warmup, monkeypatch, tmp_path):
    from gradacc.config import RunConfig
    from gradacc.serving.manager import RunManager
    from gradacc.serving.store import RunStore

    monkeypatch.setattr(warmup, "IMPORTS", [("json", ())])
    gate = threading.Event()
    slow_imports(monkeypatch, gate)
    trained = []

    def train(config, on_event, stop):
        trained.append(stop.is_set())
        return None

    manager = RunManager(RunStore(tmp_path / "runs.sqlite3"), train_fn=train, max_run_seconds=0)
    try:
        warmup.start()
        real_wait, asked = warmup.wait_until_warm, threading.Event()

        def watched_wait(timeout=None):
            asked.set()
            return real_wait(timeout)

        monkeypatch.setattr(warmup, "wait_until_warm", watched_wait)
        waiting = manager.submit(RunConfig(), owner="alice")
        assert asked.wait(10), "the run never asked whether the warm-up was done"
        assert trained == []  # not started while the libraries import (the gate is still shut)
        assert manager.stop(waiting, "alice")
        assert manager.wait(waiting, timeout=5)
        assert trained == [True]  # handed to the engine stopped, which ends it at once
        gate.set()
    finally:
        gate.set()
        assert manager.shutdown(timeout=5)


def test_streamlit_magic_is_off():
    """Magic ast.parses each page script in the script thread, beside the warm-up's imports."""
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["magicEnabled"] is False


class FakeTorch:
    def __init__(self):
        self.threads = None

    def set_num_threads(self, threads):
        self.threads = threads


def torch_not_yet_imported(monkeypatch):
    """The warm-up sees a process without torch, as the app's is when it starts."""
    monkeypatch.setattr(warmup, "sys", types.SimpleNamespace(modules={}))


@pytest.mark.parametrize("raw, threads", [(None, 1), ("3", 3)])
def test_the_warm_up_sets_torch_threads(fresh_warmup, monkeypatch, raw, threads):
    torch = FakeTorch()
    torch_not_yet_imported(monkeypatch)
    monkeypatch.setattr(warmup, "IMPORTS", [("torch", ())])
    monkeypatch.setattr(warmup, "_import", lambda name: torch)
    if raw is None:
        monkeypatch.delenv("GRADACC_TORCH_THREADS", raising=False)
    else:
        monkeypatch.setenv("GRADACC_TORCH_THREADS", raw)
    warmup.start()
    assert warmup.wait_until_warm(timeout=5)
    assert warmup.state() == "warm" and torch.threads == threads


def test_the_warm_up_leaves_the_threads_of_a_torch_imported_before_it(fresh_warmup, monkeypatch):
    """The suite pins torch's threads at session start; a page test's warm-up, finishing under some later test,
    must not change them (a recipe's F1 then depended on which test the warm-up finished under)."""
    import torch as real_torch

    torch = FakeTorch()
    monkeypatch.setattr(warmup, "IMPORTS", [("torch", ())])
    monkeypatch.setattr(warmup, "_import", lambda name: torch)
    monkeypatch.setenv("GRADACC_TORCH_THREADS", "3")
    assert "torch" in sys.modules and real_torch.get_num_threads() == 1  # the session's pin (conftest)
    warmup.start()
    assert warmup.wait_until_warm(timeout=5)
    assert warmup.state() == "warm" and torch.threads is None


def test_threads_started_after_a_real_warm_up_compute_with_the_suites_count(fresh_warmup, monkeypatch):
    """torch.set_num_threads from the warm-up thread sets the count every thread starts with afterwards (a
    run's thread, Trainer's), not the caller's: with OMP_NUM_THREADS=2 in the shell, a thread started after a page
    test's warm-up would compute with 1 thread and one started before with 2. Here the real torch, the real warm-up
    and a count it would set that differs from the suite's."""
    import torch

    monkeypatch.setattr(warmup, "IMPORTS", [("torch", ())])
    monkeypatch.setenv("GRADACC_TORCH_THREADS", "3")

    def in_new_thread() -> int:
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        thread.start()
        thread.join(10)
        return seen[0]

    try:
        warmup.start()
        assert warmup.wait_until_warm(timeout=30) and warmup.state() == "warm"
        assert in_new_thread() == torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(1)  # the warm-up may set another count: later tests get the suite's back


def test_a_bad_torch_threads_value_is_said_on_the_page(fresh_warmup, monkeypatch):
    torch_not_yet_imported(monkeypatch)
    monkeypatch.setattr(warmup, "IMPORTS", [("torch", ())])
    monkeypatch.setattr(warmup, "_import", lambda name: FakeTorch())
    monkeypatch.setenv("GRADACC_TORCH_THREADS", "0")
    warmup.start()
    assert warmup.wait_until_warm(timeout=5)
    assert warmup.state() == "failed"
    assert warmup.failure() == "GRADACC_TORCH_THREADS must be a whole number of at least 1; got '0'."
