"""Import the training libraries once, in a background thread, so pages paint before torch is loaded.

One rule comes with it. CPython 3.11 keeps the ``ast`` module's recursion counter per interpreter, not
per thread: an ``ast.parse`` in one thread while torch's import runs ``ast.parse`` in another can fail that
import with "SystemError: AST constructor recursion depth mismatch" (seen here during warm-up), and torch
can then never be imported again in the process ("function 'conv1d' already has a docstring"): every run
would fail until a restart. So while the libraries import, nothing else in the process builds an AST:

- gradacc's own parsing goes through ``parse`` here, which waits for the imports;
- runs, equivalence checks and the planner's measurement call ``wait_until_warm`` before they import;
- Streamlit's magic, which parses each page script, is off in ``.streamlit/config.toml``.

Once torch is imported, the warm-up also sets how many threads it computes with (``GRADACC_TORCH_THREADS``,
default 1): the server's cores are shared with the web server, the live page and whatever else runs there,
and torch's default of one thread per core then oversubscribes them (see BENCHMARKS.md,
section "Why one thread"). It does so only for the torch it imported itself: a process that had torch before the warm-up started
(the test suite, which pins its own count) chose its threads already, and a background thread changing them
at a moment that depends on import time would make the same run compute with other floats.
"""

from __future__ import annotations

import ast
import importlib
import logging
import os
import sys
import threading

from gradacc.errors import one_line
from gradacc.env import whole_number

log = logging.getLogger(__name__)

# (module, names to touch): transformers imports Trainer lazily, so it has to be asked for.
IMPORTS: list[tuple[str, tuple[str, ...]]] = [
    ("torch", ()),
    ("transformers", ("Trainer", "TrainingArguments")),
    ("accelerate", ()),
    ("gradacc.training.run.engine", ()),
    ("gradacc.training.backends.metrics", ()),  # scikit-learn: ~1.6 s the first eval would otherwise pay
]

_state_lock = threading.Lock()
_importing = threading.Lock()  # held by the warm-up thread for as long as it imports
_done = threading.Event()
_state = "cold"
_failure: str | None = None
_thread: threading.Thread | None = None
_import = importlib.import_module  # the tests put a slow or failing import here
_torch_was_imported = False  # torch was there before start(): its thread count is the process's own choice
DEFAULT_TORCH_THREADS = 1


def start() -> None:
    """Start the imports in a daemon thread; calling it again does nothing."""
    global _state, _thread, _torch_was_imported
    with _state_lock:
        if _state != "cold":
            return
        _state = "warming"
        _torch_was_imported = "torch" in sys.modules
        _importing.acquire()  # before the thread starts: a parse right after start() must wait
        _thread = threading.Thread(target=_import_all, name="gradacc-warm-up", daemon=True)
    _thread.start()


def state() -> str:
    """'cold' (never started), 'warming', 'warm', or 'failed' (an import raised: see ``failure``)."""
    return _state


def failure() -> str | None:
    """What went wrong, in one line, when ``state()`` is 'failed': the first import error, or a bad
    GRADACC_TORCH_THREADS (which the app refuses at start-up, before the warm-up)."""
    return _failure


def wait_until_warm(timeout: float | None = None) -> bool:
    """Block while the libraries import; True once they are done (or failed), or when warm-up never started
    (the CLI, the tests); False when ``timeout`` ran out first."""
    if _state == "cold":
        return True
    return _done.wait(timeout)


def parse(source: str) -> ast.Module:
    """``ast.parse``, but never while the warm-up imports (see the module docstring)."""
    if threading.current_thread() is _thread:  # a module the warm-up imports parses: it is the only parser
        return ast.parse(source)
    with _importing:
        return ast.parse(source)


def torch_threads() -> int:
    """Threads torch computes with in the app: ``GRADACC_TORCH_THREADS``, else 1."""
    return whole_number(os.environ, "GRADACC_TORCH_THREADS") or DEFAULT_TORCH_THREADS


def _import_all() -> None:
    global _state, _failure
    try:
        imported = {}
        for module_name, names in IMPORTS:
            try:
                imported[module_name] = module = _import(module_name)
                for name in names:
                    getattr(module, name)
            except Exception as error:  # a run started later reports its own error; say it on the page too
                log.warning("warm-up could not import %s", module_name, exc_info=True)
                if _failure is None:
                    _failure = f"{module_name}: {one_line(error)}"
        if "torch" in imported and not _torch_was_imported:
            try:
                imported["torch"].set_num_threads(torch_threads())
            except Exception as error:  # a bad GRADACC_TORCH_THREADS: said on the page like an import error
                _failure = _failure or str(getattr(error, "message", error))
    finally:
        with _state_lock:
            _state = "failed" if _failure else "warm"
        _done.set()  # first: whatever happens next, nobody may wait for the warm-up forever
        _importing.release()
