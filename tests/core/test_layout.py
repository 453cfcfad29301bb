"""The package's layers, as rules that fail when broken (the layout itself is in README's "Where the code is"):

- only app.py, pages/ and gradacc/app/ import streamlit;
- gradacc/training/ and gradacc/analysis/ import nothing from gradacc.serving, gradacc.app or gradacc.bench;
- importing gradacc's shared modules, gradacc.serving or gradacc.app does not import torch (pages paint before
  the seconds-long torch import; the serving layer hands training to a thread that imports it).

Imports are read with ``ast``, inside functions too: a lazy import is still a dependency.
"""

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

import gradacc

PACKAGE = ROOT / "gradacc"
# Where streamlit may be imported: the app's entry point, its pages and the package's Streamlit glue.
STREAMLIT_ALLOWED = [ROOT / "app.py", ROOT / "pages", PACKAGE / "app"]


def sources(*folders: Path) -> list[Path]:
    return sorted(path for folder in folders for path in ([folder] if folder.is_file() else folder.rglob("*.py")))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every module ``path`` (or ``source``, as if it lived there) imports, from any scope; relative imports
    resolved to absolute names."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source, filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from gradacc import serving`
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def is_allowed_streamlit_user(path: Path) -> bool:
    return any(path == allowed or allowed in path.parents for allowed in STREAMLIT_ALLOWED)


def test_the_rules_read_imports_in_every_form():
    """The reader the rules rely on: plain, from, relative and function-level imports all count."""
    source = ("import streamlit as st\nfrom ..serving import manager\nfrom . import engine\n"
              "def later():\n    from gradacc.bench import runs\n")
    found = imported_modules(PACKAGE / "training" / "probe.py", source)  # a module that would live in training/
    assert found == {"streamlit", "gradacc.serving", "gradacc.serving.manager", "gradacc.training",
                     "gradacc.training.engine", "gradacc.bench", "gradacc.bench.runs"}


def test_only_the_app_its_pages_and_gradacc_app_import_streamlit():
    offenders = [str(path.relative_to(ROOT)) for path in sources(PACKAGE, ROOT / "app.py", ROOT / "pages")
                 if any(within(name, "streamlit") for name in imported_modules(path))
                 and not is_allowed_streamlit_user(path)]
    assert offenders == []
    # The rule has something to hold: the glue does import it.
    assert any(within(name, "streamlit") for name in imported_modules(PACKAGE / "app" / "inputs.py"))


@pytest.mark.parametrize("forbidden", ["gradacc.serving", "gradacc.app", "gradacc.bench"])
@pytest.mark.parametrize("layer, more_than", [("training", 10), ("analysis", 5)])
def test_training_and_analysis_import_nothing_from_the_layers_above_them(layer, more_than, forbidden):
    modules = sources(PACKAGE / layer)
    assert len(modules) > more_than, f"gradacc/{layer}/ was not found where the layout puts it"
    offenders = {str(path.relative_to(ROOT)): sorted(name for name in imported_modules(path) if within(name, forbidden))
                 for path in modules}
    assert {path: names for path, names in offenders.items() if names} == {}


def light_modules() -> list[str]:
    """gradacc's shared modules, and every module of gradacc.serving and gradacc.app."""
    shared = [f"gradacc.{m.name}" for m in pkgutil.iter_modules(gradacc.__path__) if not m.ispkg]
    layers = [m.name for package in ("serving", "app")
              for m in pkgutil.walk_packages([str(PACKAGE / package)], prefix=f"gradacc.{package}.")]
    return sorted(set(shared) - {"gradacc.__main__"}) + ["gradacc.serving", "gradacc.app"] + sorted(layers)


def test_importing_the_shared_modules_serving_and_app_does_not_import_torch():
    modules = light_modules()
    assert {"gradacc.config", "gradacc.serving.manager", "gradacc.serving.store", "gradacc.app.inputs"} <= \
        set(modules)
    script = ("import importlib, json, sys\n"
              f"for name in {modules!r}:\n"
              "    importlib.import_module(name)\n"
              "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'accelerate', 'datasets') "
              "if m in sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
