"""The Code page's source: the loop each backend really runs, read from gradacc's own files.

The text comes from the backend module's file (``ast`` finds ``train``), so it can never drift from what
runs, and reading it imports nothing heavy (importing the module itself would import torch).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from gradacc.serving import warmup
from gradacc.training.backends import MODULES
from gradacc.config import RunConfig

# Settings shown in the header, in this order, with the name people use for them.
HEADER = (("micro_batch_size", "micro_batch_size", "m"),
          ("grad_accum_steps", "gradient_accumulation_steps", "k"),
          ("epochs", "epochs", None),
          ("learning_rate", "learning_rate", None),
          ("loss_normalization", "loss_normalization", "exact: weight by items in the window; naive: ÷ k"),
          ("max_grad_norm", "max_grad_norm", "0: no clipping"),
          ("seed", "seed", None))
_FIELDS = set(RunConfig().to_dict())
_CONFIG_REFERENCE = re.compile(r"\bconfig\.([A-Za-z_]\w*)")
# Helpers in other modules worth showing beside a loop: the weight every backend puts on a micro-batch, and
# the clipping both hand-written loops do before the optimizer step.
SHARED_HELPERS = {"loss_weight": "gradacc.training.windows", "clip_gradients": "gradacc.training.backends.common"}


@lru_cache(maxsize=None)
def module_file(module_name: str) -> Path:
    """The file of a module, found without importing it."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin:
        raise LookupError(f"module {module_name} not found")
    return Path(spec.origin)


@lru_cache(maxsize=None)
def _parsed(module_name: str) -> tuple[str, ast.Module]:
    text = module_file(module_name).read_text(encoding="utf-8")
    return text, warmup.parse(text)


def definition_source(module_name: str, name: str) -> str:
    """Source of the top-level function or class ``name`` of ``module_name``, decorators included."""
    text, tree = _parsed(module_name)
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return "\n".join(lines[first - 1:node.end_lineno])
    raise LookupError(f"{module_name} has no top-level {name}")


def module_docstring(module_name: str) -> str:
    return ast.get_docstring(_parsed(module_name)[1]) or ""


def helpers(module_name: str, function: str = "train") -> list[tuple[str, str]]:
    """(name, source) of the same module's functions and classes that ``function`` uses, in file order,
    plus shared helpers such as ``loss_weight`` that decide the numbers."""
    _, tree = _parsed(module_name)
    used = {node.id for node in ast.walk(warmup.parse(definition_source(module_name, function)))
            if isinstance(node, ast.Name)}
    local = [node.name for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in used and node.name != function]
    shared = [(name, definition_source(module, name)) for name, module in SHARED_HELPERS.items() if name in used]
    return [(name, definition_source(module_name, name)) for name in local] + shared


def settings_header(config: RunConfig, module_name: str) -> str:
    assignments = [(f"{shown} = {getattr(config, field)!r}", meaning) for field, shown, meaning in HEADER]
    assignments.append((f"effective_batch = {config.effective_batch!r}",
                        f"m × k × processes = {config.micro_batch_size} × {config.grad_accum_steps} × "
                        f"{config.num_processes}"))
    width = max(len(text) for text, _ in assignments)
    lines = [f"# {module_name}.train: the loop this backend runs, read from {module_file(module_name).name}",
             "# This run's settings (the loop reads them from config):"]
    lines += [f"{text:<{width}}  # {meaning}" if meaning else text for text, meaning in assignments]
    return "\n".join(lines)


def annotate(source: str, config: RunConfig) -> str:
    """Append this run's value to each line that reads a setting: ``range(1, config.epochs + 1):  # epochs = 2``."""
    values = config.to_dict()
    out = []
    for line in source.splitlines():
        fields = [f for f in dict.fromkeys(_CONFIG_REFERENCE.findall(line)) if f in _FIELDS]
        if fields:
            line += "  # ← " + ", ".join(f"{f} = {values[f]!r}" for f in fields)
        out.append(line)
    return "\n".join(out)


def backend_code(config: RunConfig) -> str:
    """The header with this run's settings, then the backend's ``train`` with the values filled in."""
    module_name = MODULES[config.backend]
    return settings_header(config, module_name) + "\n\n\n" + annotate(definition_source(module_name, "train"), config)
