"""Imported by Python at start-up in a script run by ``gradacc audit -- ...`` (this folder is first on its
PYTHONPATH): attach gradacc's audit (gradacc.training.audit.autoattach), then run the sitecustomize this one shadows,
if there is one (the system's or the environment's own)."""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    from gradacc.training.audit.autoattach import install

    install()
finally:
    _run_shadowed()
