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

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from gradacc.serving import warmup
from gradacc.training.backends import MODULES
from gradacc.choices import PITFALLS
from gradacc.config import RunConfig

# Settings shown in the header, in this order, with the name people use for them.
HEADER = (("micro_batch_size", "micro_batch_size", "m"),
          ("grad_accum_steps", "grad_accum_steps", "k: gradient_accumulation_steps in 🤗 Accelerate and Trainer"),
          ("epochs", "epochs", None),
          ("learning_rate", "learning_rate", None),
          ("loss_normalization", "loss_normalization", "exact: weight by items in the window; naive: ÷ k"),
          ("max_grad_norm", "max_grad_norm", "0: no clipping"),
          ("seed", "seed", None))
_FIELDS = set(RunConfig().to_dict())
# Helpers in other modules worth showing beside a loop: the weight every backend puts on a micro-batch, and
# the clipping both hand-written loops do before the optimizer step.
SHARED_HELPERS = {"loss_weight": "gradacc.training.windows", "clip_gradients": "gradacc.training.backends.optimizer"}


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
    """Append this run's value to each line that reads a setting: ``range(1, config.epochs + 1):  # epochs = 2``.

    A setting is read where the syntax tree has ``config.FIELD`` (not in a comment or a string), on whichever line
    of a statement it stands."""
    values = config.to_dict()
    read: dict[int, list[str]] = {}
    for node in ast.walk(warmup.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "config" \
                and node.attr in _FIELDS:
            read.setdefault(node.lineno - 1, []).append(node.attr)
    out = []
    for row, line in enumerate(source.splitlines()):
        fields = sorted(set(read.get(row, ())), key=read.get(row, []).index)
        if fields:
            line += "  # ← " + ", ".join(f"{f} = {values[f]!r}" for f in fields)
        out.append(line)
    return "\n".join(out)


def backend_code(config: RunConfig) -> str:
    """The header with this run's settings, then the backend's ``train`` with the values filled in: the loop as this
    run executes it, so the plain loop's deliberate wrong lines appear only for the pitfalls the config names."""
    module_name = MODULES[config.backend]
    source = without_pitfalls(definition_source(module_name, "train"), keep=config.pitfalls)
    return settings_header(config, module_name) + "\n\n\n" + annotate(source, config)


# ---- pitfalls: the plain loop's deliberate wrong lines, ``if job.pitfall("NAME"): ...  # WRONG: ...`` -------
# Found in the syntax tree, not by how a line is laid out: an ``if`` whose test calls ``job.pitfall("NAME")``, on one
# line or several; the right line it stands beside is the first other statement that does what its body does.

def _parsed_source(source: str) -> ast.Module:
    """``source``'s syntax tree; an empty one for a fragment that does not parse."""
    try:
        return warmup.parse(source)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def _pitfall_ifs(tree: ast.Module) -> dict[str, ast.If]:
    """{pitfall name: its ``if job.pitfall("NAME")`` statement} in ``tree``."""
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        for call in ast.walk(node.test):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "pitfall" \
                    and call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value in PITFALLS:
                found[call.args[0].value] = node
    return found


def pitfall_statements(source: str) -> dict[str, tuple[int, int]]:
    """{pitfall name: (first, last) row, 0-based} of each ``if job.pitfall("NAME")`` statement in ``source``."""
    return {name: (node.lineno - 1, node.end_lineno - 1) for name, node in _pitfall_ifs(_parsed_source(source)).items()}


def without_pitfalls(source: str, keep=()) -> str:
    """``source`` without the wrong lines of the pitfalls not in ``keep`` (with none kept: the right loop)."""
    dropped = {row for name, (first, last) in pitfall_statements(source).items() if name not in keep
               for row in range(first, last + 1)}
    return "\n".join(line for row, line in enumerate(source.splitlines()) if row not in dropped)


def _actions(statement: ast.stmt) -> set[str]:
    """What a simple statement does, by name: the names it assigns (``logged_loss``) and the function its value calls
    (``optimizer.zero_grad()``)."""
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        targets = [statement.target]
    else:
        targets = []
    value = getattr(statement, "value", None) if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign,
                                                                         ast.Expr)) else None
    called = {ast.unparse(value.func) + "()"} if isinstance(value, ast.Call) else set()
    return {ast.unparse(target) for target in targets} | called


def pitfall_notes(source: str) -> tuple[list[str], set[int]]:
    """For each wrong line in ``source``: one Markdown sentence naming its pitfall, its upstream report and the
    right line it stands beside; and the rows of those right lines (to outline them)."""
    lines, notes, rows = source.splitlines(), [], set()
    for name in pitfall_statements(source):
        row = right_line(source, name)
        right = f"; the right line, outlined in green: `{lines[row].split('#')[0].strip()}`" if row is not None else ""
        notes.append(f":red[**✗ {name}**] ({PITFALLS[name]}): the red line is the mistake{right}.")
        rows |= {row} if row is not None else set()
    return notes, rows


def right_line(source: str, name: str) -> int | None:
    """The row (0-based) of the right line that pitfall ``name``'s wrong line stands beside: the first statement
    outside every pitfall's ``if`` that does what the wrong one does (zeroes, clips, steps the scheduler, sets
    ``logged_loss`` or ``last_of_window``); None if there is none."""
    tree = _parsed_source(source)
    ifs = _pitfall_ifs(tree)
    if name not in ifs:
        return None
    wrong = set().union(*(_actions(statement) for statement in ifs[name].body))
    inside = {id(node) for node in ifs.values() for node in ast.walk(node)}
    statements = sorted((node for node in ast.walk(tree)
                         if isinstance(node, ast.stmt) and id(node) not in inside), key=lambda node: node.lineno)
    return next((statement.lineno - 1 for statement in statements if _actions(statement) & wrong), None)


# ---- what to look at: the three things accumulation adds, and the bookkeeping around them --------------

# The backends mark each of the three with a comment, "# Accumulation, 1 of 3: ..." (Trainer: "# Accumulation:").
ROLES = {"1": "scale", "2": "backward", "3": "step"}
ROLE_TITLES = {"scale": "scale the loss", "backward": "backward() every micro-batch",
               "step": "step and zero every k"}
WRONG = "wrong"  # a pitfall's wrong line: red
_MARKER = re.compile(r"^\s*# Accumulation(?:, (\d) of 3)?:")
# Statements inside the "step" block that are the step itself (the rest there is bookkeeping).
_STEP_ITSELF = re.compile(r"\b(optimizer\.(step|zero_grad)|precision\.step|lr_scheduler\.step|if last_of_window|"
                          r"sync_gradients)\b")
# Trainer does all three inside its own loop: what gradacc sets is the k and the loss scaling.
_TRAINER_SETTINGS = {"gradient_accumulation_steps=": "step", "compute_loss_func=": "scale"}
# Measuring and reporting, not training: drawn dimmed, so the loop reads as the loop.
_INSTRUMENTATION = re.compile(
    r"\b(meter|report|measuring|activation_bytes|check_stop|sync_probe|SyncProbe|"
    r"StepReporter|ActivationMeter|activation_meter|WindowTally|window|callback|EventCallback|before_optimizer_step|"
    r"check_finite|job=job|logged_loss)\b")


def line_roles(source: str) -> list[str]:
    """One role per line of ``source``: 'scale', 'backward' or 'step' for the three things accumulation adds
    (their marker comments included), 'wrong' for a pitfall's wrong line, 'instrumentation' for measuring and
    reporting, '' for the rest."""
    lines = source.splitlines()
    roles = [""] * len(lines)
    try:
        tree = warmup.parse(source)
    except SyntaxError:  # not a whole function (a fragment): the markers and the patterns still apply
        tree = ast.Module(body=[], type_ignores=[])
    statements = sorted((node for node in ast.walk(tree) if isinstance(node, ast.stmt)), key=lambda n: n.lineno)
    for index, line in enumerate(lines):
        marker = _MARKER.match(line)
        if not marker:
            continue
        role = ROLES.get(marker.group(1) or "", "")
        for comment in range(index, len(lines)):  # the marker comment, however many lines it takes
            if not lines[comment].strip().startswith("#"):
                break
            roles[comment] = role or "step"
        if role:
            _mark_statements(lines, roles, statements, comment, role)
        else:
            _mark_trainer_settings(lines, roles, tree)
    for first, last in pitfall_statements(source).values():
        roles[first:last + 1] = [WRONG] * (last + 1 - first)
    for index, line in enumerate(lines):
        if not roles[index] and _INSTRUMENTATION.search(line.split("#")[0]):
            roles[index] = "instrumentation"
    return roles


def _mark_statements(lines, roles, statements, first: int, role: str) -> None:
    """What a marker points at: for 1 and 2 the statement right after it; for 3 the step itself, the statements
    after it (up to a blank line or the end of their block) that step, schedule or zero, and the header of a
    compound statement that does (``if last_of_window:``) with those inside it."""
    start = next((s for s in statements if s.lineno - 1 >= first), None)
    if start is None:
        return
    if role != "step":
        for row in range(start.lineno - 1, start.end_lineno):
            roles[row] = role
        return
    level = _indent(lines[start.lineno - 1])
    row = start.lineno - 1
    while row < len(lines):
        text = lines[row]
        if not text.strip() or _indent(text) < level:
            return
        statement = next((s for s in statements if s.lineno - 1 == row), None)
        end = statement.end_lineno if statement else row + 1
        if _STEP_ITSELF.search(text.split("#")[0]):
            roles[row] = role
            for inner in range(row + 1, end):
                if _STEP_ITSELF.search(lines[inner].split("#")[0]):
                    roles[inner] = role
        row = end


def _mark_trainer_settings(lines, roles, tree) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and f"{node.arg}=" in _TRAINER_SETTINGS:
            for inner in range(node.lineno - 1, node.end_lineno):
                roles[inner] = _TRAINER_SETTINGS[f"{node.arg}="]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def highlighted_html(source: str, roles: list[str], right_rows=()) -> str:
    """The loop as HTML: Python colours from pygments, the three roles on a coloured band with their number,
    a pitfall's wrong line on red with ✗ and the ``right_rows`` it stands beside outlined with ✓,
    instrumentation dimmed, long lines wrapped (never cut off at the right edge)."""
    lexer, formatter = PythonLexer(stripnl=False, ensurenl=False), HtmlFormatter(nowrap=True, style="friendly")
    numbers = {role: number for number, role in ROLES.items()}
    rows = []
    for row, (line, role) in enumerate(zip(source.splitlines(), roles + [""] * len(source.splitlines()))):
        code = highlight(line, lexer, formatter).rstrip("\n") or " "
        mark = "✗" if role == WRONG else numbers.get(role)
        badge = f'<span class="ga-badge">{mark}</span>' if mark else '<span class="ga-gap"></span>'
        right = " ga-right" if row in right_rows else ""
        if right and role == "instrumentation":
            role = ""  # the right line a wrong one gets wrong is read, not dimmed (logged_loss = loss.item())
        tag = '<span class="ga-tag">✓ the right line</span>' if right else ""
        rows.append(f'<div class="ga-line ga-{role or "plain"}{right}">{badge}<span class="ga-code">{code}</span>'
                    f'{tag}</div>')
    return (f"<style>{formatter.get_style_defs('.ga-listing')}{_CSS}</style>"
            f'<div class="ga-listing">{"".join(rows)}</div>')


_CSS = """
.ga-listing { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.86rem;
  line-height: 1.45; background: #fafafa; border: 1px solid #e6e6e6; border-radius: 0.5rem; padding: 0.6rem 0; }
.ga-line { display: flex; align-items: flex-start; padding: 0 0.8rem 0 0.3rem; }
/* Wrapped, never clipped: a continuation keeps the line's indentation. */
.ga-code { white-space: pre-wrap; overflow-wrap: anywhere; flex: 1; }
.ga-badge, .ga-gap { flex: 0 0 1.5rem; text-align: center; font-weight: 700; border-radius: 0.75rem;
  margin-right: 0.4rem; font-family: sans-serif; }
.ga-badge { color: white; }
.ga-scale { background: #e8f1fd; } .ga-scale .ga-badge { background: #1f6feb; }
.ga-backward { background: #fdf0e6; } .ga-backward .ga-badge { background: #d9730d; }
.ga-step { background: #e9f7ec; } .ga-step .ga-badge { background: #2da44e; }
.ga-instrumentation { opacity: 0.38; }
.ga-wrong { background: #fde8e8; } .ga-wrong .ga-badge { background: #cf222e; }
.ga-right { outline: 2px solid #2da44e; outline-offset: -2px; }
.ga-tag { flex: 0 0 auto; margin-left: 0.5rem; color: #1a7f37; font-family: sans-serif; font-size: 0.75rem; }
"""
