"""The Code page's source: the loop each backend really runs, read from gradacc's own files.

The text comes from the backend module's file (``ast`` finds ``train``), so it can never drift from what
runs, and reading it imports nothing heavy (importing the module itself would import torch). What each line does
(scale, backward, step, instrumentation) is read from the syntax tree too, never from a comment's words; a pitfall is
its hook in pitfalls.py, found by its ``@pitfall`` decorator and shown apart from the loop.
"""

from __future__ import annotations

import ast
import importlib.util
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
SHARED_HELPERS = {"WindowRule": "gradacc.training.windows", "loss_weight": "gradacc.training.windows",
                  "clip_gradients": "gradacc.training.backends.optimizer"}


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
    run executes it (a pitfall changes none of its lines: it is a hook from pitfalls.py, see ``pitfall_source``)."""
    module_name = MODULES[config.backend]
    return settings_header(config, module_name) + "\n\n\n" + annotate(definition_source(module_name, "train"), config)


def _parsed_source(source: str) -> ast.Module:
    """``source``'s syntax tree; an empty one for a fragment that does not parse."""
    try:
        return warmup.parse(source)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def _names(target: str, dotted: str) -> bool:
    """Whether ``dotted`` is ``target`` or ends with it (``loop.optimizer.zero_grad`` names ``optimizer.zero_grad``)."""
    return dotted == target or dotted.endswith("." + target)


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "decorator_list")


def _header(statement: ast.stmt) -> list[ast.AST]:
    """What a statement is without the statements it holds: the whole of a simple one, a compound one's header
    (``if last_of_window``, ``with model.no_sync() ...``, ``for index, batch in ...``)."""
    parts = []
    for field, value in ast.iter_fields(statement):
        if field not in _BLOCKS:
            parts += value if isinstance(value, list) else [value]
    return [part for part in parts if isinstance(part, ast.AST)]


def _rows(statement: ast.stmt) -> range:
    """The rows (0-based) of a statement's header: all of a simple statement, a compound one's up to its body."""
    ends = [node.end_lineno for node in _header(statement) if getattr(node, "end_lineno", None)]
    last = statement.end_lineno if not hasattr(statement, "body") else max(ends, default=statement.lineno)
    return range(statement.lineno - 1, last)


def _does(statement: ast.stmt, target: str) -> bool:
    """Whether a statement's header calls ``target`` or assigns to it (by its dotted name or the end of one)."""
    for part in _header(statement):
        for node in ast.walk(part):
            if isinstance(node, ast.Call) and _names(target, ast.unparse(node.func)):
                return True
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    return any(_names(target, ast.unparse(node)) for node in targets)


def _statements(tree: ast.Module) -> list[ast.stmt]:
    return sorted((node for node in ast.walk(tree) if isinstance(node, ast.stmt)), key=lambda node: node.lineno)


# ---- pitfalls: hooks in pitfalls.py, each ``@pitfall("NAME", breaks="CALL")`` beside the loop's line of CALL ------

PITFALLS_MODULE = "gradacc.training.backends.pitfalls"


def pitfall_hooks() -> dict[str, tuple[str, str]]:
    """{pitfall name: (its hook function, the loop's call whose line it gets wrong)}, from each ``@pitfall(NAME,
    breaks=CALL)`` in pitfalls.py's syntax tree."""
    found = {}
    for node in _parsed(PITFALLS_MODULE)[1].body:
        for decorator in getattr(node, "decorator_list", []):
            if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pitfall":
                breaks = next(k.value.value for k in decorator.keywords if k.arg == "breaks")
                found[decorator.args[0].value] = (node.name, breaks)
    return found


def pitfall_source(name: str) -> str:
    """The hook that installs pitfall ``name``: what "Break it on purpose" changes, shown apart from the loop."""
    return definition_source(PITFALLS_MODULE, pitfall_hooks()[name][0])


def pitfall_roles(name: str) -> list[str]:
    """One role per line of ``pitfall_source(name)``: 'wrong' where the hook calls (or replaces) the loop's call."""
    source, breaks = pitfall_source(name), pitfall_hooks()[name][1]
    roles = [""] * len(source.splitlines())
    for statement in _statements(_parsed_source(source)):
        if _does(statement, breaks):
            for row in _rows(statement):
                roles[row] = WRONG
    return roles


def _right_statement(source: str, name: str) -> ast.stmt | None:
    """The loop's statement that pitfall ``name`` gets wrong: the first simple one that calls its ``breaks`` (zeroes,
    clips, steps the scheduler, logs the loss, asks the window rule); None if none does."""
    breaks = pitfall_hooks()[name][1]
    return next((statement for statement in _statements(_parsed_source(source))
                 if not hasattr(statement, "body") and _does(statement, breaks)), None)


def right_line(source: str, name: str) -> int | None:
    """The row (0-based) where the loop's statement that pitfall ``name`` gets wrong starts; None if none."""
    statement = _right_statement(source, name)
    return None if statement is None else statement.lineno - 1


def pitfall_note(source: str, name: str) -> tuple[str, int | None]:
    """One Markdown sentence naming pitfall ``name``, its upstream report and the loop's line it gets wrong, and the
    row of that line in ``source`` (to outline it)."""
    statement = _right_statement(source, name)
    if statement is None:
        return f":red[**✗ {name}**] ({PITFALLS[name]}): its hook, with the wrong line in red.", None
    return (f":red[**✗ {name}**] ({PITFALLS[name]}): its hook, with the wrong line in red; the loop's line it gets "
            f"wrong is outlined in green: `{ast.unparse(statement)}`.", statement.lineno - 1)


# ---- what to look at: the three things accumulation adds, and the bookkeeping around them --------------

ROLES = {"1": "scale", "2": "backward", "3": "step"}
ROLE_TITLES = {"scale": "scale the loss", "backward": "backward() every micro-batch",
               "step": "step and zero every k"}
WRONG = "wrong"  # a pitfall's wrong line: red
# The three, found in the syntax tree by the call that does them (a dotted name, or the end of one); the ``if``
# that holds the step is the step's too. Comments never decide a role: editing one changes nothing here.
ACCUMULATION_CALLS = {"loss_weight": "scale", "backward": "backward", "optimizer.step": "step",
                      "precision.step": "step", "lr_scheduler.step": "step", "optimizer.zero_grad": "step"}
# Trainer does all three inside its own loop: what gradacc sets is the k and the loss scaling.
TRAINER_KEYWORDS = {"gradient_accumulation_steps": "step", "compute_loss_func": "scale"}
# Measuring and reporting, not training: a line that names one of these is drawn dimmed, so the loop reads as the loop.
INSTRUMENTATION = frozenset({
    "meter", "report", "measuring", "activation_bytes", "check_stop", "sync_probe", "SyncProbe", "StepReporter",
    "ActivationMeter", "activation_meter", "WindowTally", "window", "callback", "EventCallback",
    "before_optimizer_step", "check_finite", "pitfalls"})
INSTRUMENTATION_KEYWORDS = INSTRUMENTATION | {"job"}  # GradaccTrainer(job=job): the job is read, not trained


def line_roles(source: str) -> list[str]:
    """One role per line of ``source``, from its syntax tree: 'scale', 'backward' or 'step' for the three things
    accumulation adds (with the comment lines right above them), 'instrumentation' for measuring and reporting,
    '' for the rest."""
    lines = source.splitlines()
    roles = [""] * len(lines)
    tree = _parsed_source(source)
    statements = _statements(tree)
    for statement in statements:
        role = _accumulation_role(statement)
        for row in _rows(statement) if role else ():
            roles[row] = role
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in TRAINER_KEYWORDS:
            roles[node.lineno - 1:node.end_lineno] = [TRAINER_KEYWORDS[node.arg]] * (node.end_lineno - node.lineno + 1)
    _dim_instrumentation(tree, roles, statements)
    for row in range(len(lines) - 2, -1, -1):  # a comment takes the role of the accumulation line it stands over
        if lines[row].strip().startswith("#") and roles[row + 1] in ROLES.values():
            roles[row] = roles[row + 1]
    return roles


def _accumulation_role(statement: ast.stmt) -> str:
    """'scale', 'backward' or 'step' for a statement (its header) that makes one of ``ACCUMULATION_CALLS``, 'step'
    for an ``if`` whose body steps; '' otherwise."""
    role = next((role for call, role in ACCUMULATION_CALLS.items() if _does(statement, call)), "")
    if not role and isinstance(statement, ast.If) \
            and any(_accumulation_role(inner) == "step" for inner in statement.body):
        return "step"
    return role


def _dim_instrumentation(tree: ast.Module, roles: list[str], statements: list[ast.stmt]) -> None:
    """Dims each line where an instrumentation name (a variable, an attribute, a keyword) stands, and the whole of
    a simple statement whose first line does (``report.step(...)`` over two lines)."""
    rows = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in INSTRUMENTATION_KEYWORDS \
                or isinstance(node, ast.Name) and node.id in INSTRUMENTATION \
                or isinstance(node, ast.Attribute) and node.attr in INSTRUMENTATION:
            rows.add(node.lineno - 1)
    for statement in statements:
        if not hasattr(statement, "body") and statement.lineno - 1 in rows:
            rows.update(_rows(statement))
    for row in rows:
        if not roles[row]:
            roles[row] = "instrumentation"


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
