"""The package's layers, as rules that fail when broken (the layout itself is in README's "Where the code is"):

- only app.py, pages/ and gradacc/app/ import streamlit;
- the ground floor (gradacc's shared vocabulary: units, events, errors, paths, env, choices, recipes, config,
  steps, labels) imports no layer, only itself; gradacc/export/ (the trackers, fed by the event stream) imports only the ground floor;
- gradacc/training/ imports nothing from analysis, serving, app, bench or the CLI; gradacc/analysis/ nothing
  from serving, app, bench or the CLI (arrows run down: app → serving → analysis → training → ground);
- no import cycle anywhere in gradacc/, lazy or not (a module inside a circle can't be understood, moved or tested
  alone);
- scripts/ and gradacc/ never import tests/ nor read what the tests write (test-artifacts/);
- importing gradacc's shared modules, gradacc.serving, gradacc.app or the CLI does not import torch (pages paint
  before the seconds-long torch import; the serving layer hands training to a thread that imports it; ``gradacc
  --help`` answers at once);
- an import inside a function (a lazy import) says why it is lazy in a comment beside it: an optional dependency,
  start-up time measured, torch kept out of a module the app or the CLI imports.

Imports are read with ``ast``, inside functions too: a lazy import is still a dependency.
"""

import ast
import io
import json
import pkgutil
import re
import subprocess
import sys
import tokenize
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


GROUND_FLOOR = ("gradacc.units", "gradacc.events", "gradacc.errors", "gradacc.paths", "gradacc.env", "gradacc.choices",
                "gradacc.recipes", "gradacc.config", "gradacc.steps", "gradacc.labels", "gradacc.conventions")
# What each layer must not import: everything above it.
ABOVE = {
    "export": ("gradacc.training", "gradacc.analysis", "gradacc.serving", "gradacc.app", "gradacc.bench",
               "gradacc.cli"),
    "training": ("gradacc.analysis", "gradacc.serving", "gradacc.app", "gradacc.bench", "gradacc.cli"),
    "analysis": ("gradacc.serving", "gradacc.app", "gradacc.bench", "gradacc.cli"),
}
TESTS = ROOT / "tests"
TEST_OUTPUT = "test-artifacts"


def upward_imports(path: Path, forbidden: tuple[str, ...], source: str | None = None) -> list[str]:
    return sorted(name for name in imported_modules(path, source) if any(within(name, f) for f in forbidden))


def ground_floor_offences(path: Path, source: str | None = None) -> list[str]:
    """What a ground-floor module imports of gradacc besides the ground floor (and the package itself)."""
    return sorted(name for name in imported_modules(path, source)
                  if within(name, "gradacc") and name != "gradacc" and not any(within(name, g) for g in GROUND_FLOOR))


def bare_test_module_names() -> set[str]:
    """The bare names under which modules of tests/ import (the suite puts tests/ and tests/browser/ on
    sys.path): conftest, support, app_support, ..."""
    return {path.stem for path in TESTS.rglob("*.py")} - {"__init__"}


def imports_of_tests(path: Path, source: str | None = None) -> list[str]:
    bare = bare_test_module_names()
    return sorted(name for name in imported_modules(path, source)
                  if within(name, "tests") or name.split(".")[0] in bare)


def reads_test_output(path: Path, source: str | None = None) -> list[str]:
    """String constants (docstrings aside) that name the tests' output folder."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source, filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and TEST_OUTPUT in node.value and id(node) not in docstrings]


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


@pytest.mark.parametrize("layer, more_than", [("training", 10), ("analysis", 5), ("export", 0)])
def test_training_analysis_and_export_import_nothing_from_the_layers_above_them(layer, more_than):
    modules = sources(PACKAGE / layer)
    assert len(modules) > more_than, f"gradacc/{layer}/ was not found where the layout puts it"
    offenders = {str(path.relative_to(ROOT)): upward_imports(path, ABOVE[layer]) for path in modules}
    assert {path: names for path, names in offenders.items() if names} == {}


@pytest.mark.parametrize("layer, planted, caught", [
    ("training", "from gradacc.analysis.health import run_warnings\n", ["gradacc.analysis.health",
                                                                         "gradacc.analysis.health.run_warnings"]),
    ("training", "def later():\n    from gradacc import cli\n", ["gradacc.cli"]),
    ("analysis", "from ..serving import manager\n", ["gradacc.serving", "gradacc.serving.manager"]),
    ("export", "import gradacc.training.run.engine\n", ["gradacc.training.run.engine"]),
])
def test_an_upward_import_is_caught(layer, planted, caught):
    assert upward_imports(PACKAGE / layer / "probe.py", ABOVE[layer], planted) == caught


def test_the_ground_floor_imports_no_layer():
    modules = [PACKAGE / f"{name.split('.')[-1]}.py" for name in GROUND_FLOOR]
    assert all(path.is_file() for path in modules), "a ground-floor module is not where the layout puts it"
    assert {str(path.relative_to(ROOT)): ground_floor_offences(path) for path in modules
            if ground_floor_offences(path)} == {}


def test_a_ground_floor_import_of_a_layer_is_caught():
    """paths.py once imported config for a label while config imported paths; labels.py broke the circle."""
    planted = ("from gradacc.errors import GradaccError\nfrom gradacc import labels\n"
               "def later():\n    from gradacc.training.memory.budget import check\n")
    assert ground_floor_offences(PACKAGE / "paths.py", planted) == ["gradacc.training.memory.budget",
                                                                   "gradacc.training.memory.budget.check"]


def gradacc_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sources(PACKAGE)}


def imported_gradacc_modules(path: Path, modules: set[str], source: str | None = None) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, from any scope: ``from P import name`` is ``P.name`` where that
    is a module, else ``P``; a name below a module is that module. A package's ``__init__`` that runs first on the way
    to one of its modules is not counted: every module of a package would otherwise depend on it."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source, filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]

    def nearest(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(nearest(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else nearest(base)
                         for alias in node.names)
    return found - {None, module_name(path)}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other, directly or through others (sorted), in module order."""
    def reachable(start: str) -> set[str]:
        seen, todo = set(), list(graph.get(start, ()))
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(graph.get(name, ()))
        return seen

    reach = {name: reachable(name) for name in graph}
    cycles, placed = [], set()
    for name in sorted(graph):
        if name in reach[name] and name not in placed:
            circle = sorted(other for other in reach[name] if name in reach.get(other, ()))
            placed.update(circle)
            cycles.append(circle)
    return cycles


def import_graph(planted: dict[str, str] | None = None) -> dict[str, set[str]]:
    """gradacc's modules → the modules of gradacc each imports; ``planted``: {module: source} read instead."""
    modules = gradacc_modules()
    planted = planted or {}
    return {name: imported_gradacc_modules(path, set(modules), planted.get(name)) for name, path in modules.items()}


def test_no_module_of_gradacc_imports_itself_through_others_lazily_or_not():
    graph = import_graph()
    assert len(graph) > 100 and "gradacc.training.run.engine" in graph["gradacc.analysis.gradient_runs"]
    assert import_cycles(graph) == []


@pytest.mark.parametrize("planted, caught", [
    # windows ← job (at the top): a lazy import back is still a circle.
    ({"gradacc.training.windows": "def later():\n    from gradacc.training.run.job import prepare\n"},
     ["gradacc.training.run.job", "gradacc.training.windows"]),
    # Through a third module, and relative: recovery → manager → recovery.
    ({"gradacc.serving.recovery": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import manager\n"},
     ["gradacc.serving.manager", "gradacc.serving.recovery"]),
    # `from gradacc.app import server` names the module server, not the package gradacc.app: no circle.
    ({"gradacc.app.server": "from gradacc.app import scroll\n"}, None),
])
def test_a_planted_import_cycle_is_caught(planted, caught):
    cycles = import_cycles(import_graph(planted))
    assert cycles == ([caught] if caught else [])


def test_scripts_and_the_package_never_import_tests_nor_read_their_output():
    modules = sources(PACKAGE, ROOT / "scripts", ROOT / "app.py", ROOT / "pages")
    assert any(path.name == "watchers.py" for path in modules)
    offenders = {str(path.relative_to(ROOT)): imports_of_tests(path) + reads_test_output(path) for path in modules}
    assert {path: found for path, found in offenders.items() if found} == {}


@pytest.mark.parametrize("planted, caught", [
    ("from conftest import CHROMIUM\n", ["conftest", "conftest.CHROMIUM"]),
    ("import st_ui\n", []),  # the page helpers live in scripts/browsing/, which tests may import
    ("def later():\n    from support import StreamlitServer\n", ["support", "support.StreamlitServer"]),
    ("from tests.browser import conftest\n", ["tests.browser", "tests.browser.conftest"]),
    ("FILE = ROOT / 'test-artifacts' / 'latency.json'\n", ["test-artifacts"]),
    ('"""Reads nothing of test-artifacts/ (a docstring may say so)."""\n', []),
])
def test_an_import_of_tests_or_a_read_of_their_output_is_caught(planted, caught):
    probe = ROOT / "scripts" / "probe.py"
    assert imports_of_tests(probe, planted) + reads_test_output(probe, planted) == caught


def light_modules() -> list[str]:
    """gradacc's shared modules, and every module of gradacc.serving, gradacc.app and gradacc.cli (which
    ``gradacc --help`` imports, the benchmarks' entry with it)."""
    shared = [f"gradacc.{m.name}" for m in pkgutil.iter_modules(gradacc.__path__) if not m.ispkg]
    layers = [m.name for package in ("serving", "app", "cli")
              for m in pkgutil.walk_packages([str(PACKAGE / package)], prefix=f"gradacc.{package}.")]
    return (sorted(set(shared) - {"gradacc.__main__"}) + ["gradacc.serving", "gradacc.app", "gradacc.cli"]
            + sorted(layers))


def test_importing_the_shared_modules_serving_app_and_the_cli_does_not_import_torch():
    modules = light_modules()
    assert {"gradacc.config", "gradacc.serving.manager", "gradacc.serving.store", "gradacc.app.inputs",
            "gradacc.cli.train"} <= set(modules)
    script = ("import importlib, json, sys\n"
              f"for name in {modules!r}:\n"
              "    importlib.import_module(name)\n"
              "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'accelerate', 'datasets') "
              "if m in sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


# The audit users import (gradacc.audit, gradacc/training/audit/) stands on its own: none of the app's engine (the
# run, the job, the backends' loops), no private name of gradacc, and nothing that walks the call stack.
USER_AUDIT = [PACKAGE / "audit.py", *sources(PACKAGE / "training" / "audit")]
ENGINE = ("gradacc.training.run", "gradacc.training.backends", "gradacc.analysis", "gradacc.serving", "gradacc.app")


def audit_offences(path: Path, source: str | None = None) -> list[str]:
    text = path.read_text(encoding="utf-8") if source is None else source
    engine = [name for name in imported_modules(path, source) if any(within(name, e) for e in ENGINE)]
    private = [name for name in imported_modules(path, source)
               if within(name, "gradacc") and any(part.startswith("_") and part != "__init__"
                                                  for part in name.split("."))]
    stack = [word for word in ("sys._getframe", "inspect.stack", "inspect.currentframe", "f_back") if word in text]
    return sorted(set(engine + private + stack))


def test_the_user_facing_audit_imports_nothing_of_the_engine_nor_private_names_and_walks_no_stack():
    assert len(USER_AUDIT) > 8, "gradacc/training/audit/ was not found where the layout puts it"
    offenders = {str(path.relative_to(ROOT)): audit_offences(path) for path in USER_AUDIT}
    assert {path: found for path, found in offenders.items() if found} == {}


@pytest.mark.parametrize("planted, caught", [
    ("from gradacc.training.run.engine import quiet_libraries\n", ["gradacc.training.run.engine",
                                                                   "gradacc.training.run.engine.quiet_libraries"]),
    ("def later():\n    from gradacc.training.backends.trainer_loop import _Samples\n",
     ["gradacc.training.backends.trainer_loop", "gradacc.training.backends.trainer_loop._Samples"]),
    ("import sys\nframe = sys._getframe(1)\n", ["sys._getframe"]),
])
def test_an_engine_import_a_private_name_or_a_stack_walk_in_the_audit_is_caught(planted, caught):
    assert audit_offences(PACKAGE / "training" / "audit" / "probe.py", planted) == caught


# ---- a lazy import says why -------------------------------------------------------------------------------------

LAZY_IMPORT_SCOPE = [PACKAGE, ROOT / "pages", ROOT / "app.py"]


# What a linter reads in a comment (# noqa: F401, # type: ignore[...], # pragma: no cover) is no reason.
LINTER_MARKERS = re.compile(r"noqa(:\s*[A-Z]+\d+(\s*,\s*[A-Z]+\d+)*)?|type:\s*ignore(\[[^]]*\])?|pragma:\s*no\s*cover",
                            re.IGNORECASE)


def lazy_import_groups(tree: ast.Module) -> list[list[ast.stmt]]:
    """The imports inside functions (methods, async functions and the blocks within them), in groups of imports on
    consecutive lines of one block."""
    inside = {id(node) for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))}
    groups: list[list[ast.stmt]] = []
    for node in ast.walk(tree):
        for block in (getattr(node, name, None) for name in ("body", "orelse", "finalbody")):
            block = block if isinstance(block, list) else []
            for before, statement in zip([None, *block], block):
                if id(statement) not in inside:
                    continue
                if id(before) in inside and statement.lineno == before.end_lineno + 1:
                    groups[-1].append(statement)  # the group ``before`` ended a moment ago
                else:
                    groups.append([statement])
    return groups


def reason_lines(source: str) -> set[int]:
    """The lines with a comment that says something besides a linter's marker."""
    return {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT and any(c.isalpha() for c in LINTER_MARKERS.sub("", token.string[1:]))}


def unexplained_lazy_imports(path: Path, source: str | None = None) -> list[str]:
    """The lazy imports of ``path`` (or ``source``) with no reason beside them, as "line: the import". A group is
    explained by a comment on one of its lines or on the line just above it."""
    text = path.read_text(encoding="utf-8") if source is None else source
    reasons = reason_lines(text)
    return [f"{node.lineno}: {ast.unparse(node)}" for group in lazy_import_groups(ast.parse(text))
            if not reasons & set(range(group[0].lineno - 1, group[-1].end_lineno + 1)) for node in group]


def test_every_lazy_import_says_why():
    modules = sources(*LAZY_IMPORT_SCOPE)
    lazy = sum(len(group) for path in modules for group in lazy_import_groups(ast.parse(path.read_text("utf-8"))))
    assert lazy > 50, "the walk found almost no import inside a function: it reads the wrong files or nodes"
    offenders = {str(path.relative_to(ROOT)): unexplained_lazy_imports(path) for path in modules}
    assert {path: found for path, found in offenders.items() if found} == {}


@pytest.mark.parametrize("planted, caught", [
    ("def later():\n    import torch\n    return torch\n", ["2: import torch"]),
    ("def later():\n    import torch  # here: the app imports this module before torch loads\n", []),
    # A comment on the line above covers the whole group of consecutive import lines.
    ("def later():\n    # optional: not in requirements.txt\n    import bitsandbytes\n"
     "    from peft import LoraConfig\n", []),
    # A blank line ends a group; a comment two lines up explains nothing.
    ("def later():\n    # here: it imports torch\n    import torch\n\n    from gradacc.training import fsdp\n",
     ["5: from gradacc.training import fsdp"]),
    ("def later():\n    # here: it imports torch\n\n    import torch\n", ["4: import torch"]),
    # A linter's marker is not a reason, nor is a '#' inside a string; one after the marker is.
    ("def later():\n    import torch  # noqa: F401\n", ["2: import torch"]),
    ("def later():\n    note = '# lazy'\n    import torch\n", ["3: import torch"]),
    ("def later():\n    import torch  # noqa: F401 - registers the ops before the first run\n", []),
    # Methods, async functions and blocks inside them count; the module's top and a __main__ block do not.
    ("class Probe:\n    async def later(self, ready):\n        if ready:\n            import plotly\n",
     ["4: import plotly"]),
    ("import torch\nif __name__ == '__main__':\n    import sys\n", []),
])
def test_an_unexplained_lazy_import_is_caught(planted, caught):
    assert unexplained_lazy_imports(PACKAGE / "probe.py", planted) == caught
