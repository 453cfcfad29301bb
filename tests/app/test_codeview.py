"""The Code page's text comes from the backends' own files, with this run's settings filled in."""

import ast
import inspect
import io
import subprocess
import sys
import tokenize

import pytest

from gradacc.app import codeview
from gradacc.training.backends import MODULES
from gradacc.config import RunConfig


@pytest.mark.parametrize("backend", list(MODULES))
def test_the_source_is_exactly_the_function_that_runs(backend):
    import importlib

    module = importlib.import_module(MODULES[backend])
    assert codeview.definition_source(MODULES[backend], "train") == inspect.getsource(module.train).rstrip("\n")


def test_settings_are_shown_in_a_header_and_where_the_loop_reads_them():
    code = codeview.backend_code(RunConfig(backend="pytorch", micro_batch_size=16, grad_accum_steps=3, epochs=5))
    assert "micro_batch_size = 16" in code and "grad_accum_steps = 3" in code
    assert "effective_batch = 48" in code
    assert "grad_accum_steps = config.grad_accum_steps  # ← grad_accum_steps = 3" in code
    assert "for epoch in range(1, config.epochs + 1):  # ← epochs = 5" in code
    ast.parse(code)  # still valid Python


def test_a_setting_is_annotated_where_the_code_reads_it_not_where_a_comment_or_string_names_it():
    source = ("def train(job, config):\n"
              "    # config.epochs is read below\n"
              "    print('config.seed')\n"
              "    total = sum(\n"
              "        config.epochs for _ in range(config.grad_accum_steps))\n")
    annotated = codeview.annotate(source, RunConfig(epochs=5, grad_accum_steps=3, seed=7)).splitlines()
    assert annotated[1:3] == source.splitlines()[1:3]  # the comment and the string: untouched
    assert annotated[3] == "    total = sum("
    assert annotated[4].endswith("  # ← epochs = 5, grad_accum_steps = 3")
    ast.parse("\n".join(annotated))


def test_helpers_are_the_module_functions_the_loop_calls():
    names = [name for name, _ in codeview.helpers(MODULES["accelerate"])]
    assert names == ["new_accelerator", "loss_weight", "clip_gradients"]
    assert [name for name, _ in codeview.helpers(MODULES["pytorch"])] == ["WindowRule", "loss_weight", "clip_gradients"]
    assert "make_loss_function" in [name for name, _ in codeview.helpers(MODULES["trainer"])]


def test_reading_the_source_imports_no_torch():
    script = ("import sys; from gradacc.app import codeview; from gradacc.config import RunConfig; "
              "[codeview.backend_code(RunConfig(backend=b)) for b in ('pytorch', 'accelerate', 'trainer')]; "
              "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


@pytest.mark.parametrize("backend", ["pytorch", "accelerate", "trainer"])
def test_the_three_things_accumulation_adds_stand_out_and_instrumentation_is_dimmed(backend):
    code = codeview.backend_code(RunConfig(backend=backend).check())
    lines = code.splitlines()
    roles = codeview.line_roles(code)
    marked = {role: [line.strip() for line, r in zip(lines, roles) if r == role] for role in set(roles)}
    expected = {
        "pytorch": {"scale": "loss = loss * loss_weight(", "backward": "precision.scale(loss).backward()",
                    "step": "precision.step(optimizer)"},
        "accelerate": {"scale": "weight = loss_weight(", "backward": "accelerator.backward(",
                       "step": "optimizer.zero_grad()"},
        "trainer": {"scale": "compute_loss_func=", "step": "gradient_accumulation_steps=config.grad_accum_steps"},
    }[backend]
    for role, start in expected.items():
        assert any(line.startswith(start) for line in marked[role]), (role, marked.get(role))
    assert any(line.startswith("report.step(") for line in marked["instrumentation"]) or backend == "trainer"
    assert any("activation_meter(" in line for line in marked["instrumentation"])
    # The training itself is never dimmed.
    assert not any("model(**batch)" in line or "optimizer.step()" in line for line in marked["instrumentation"])
    html = codeview.highlighted_html(code, roles)
    assert html.count('class="ga-badge"') == sum(1 for r in roles if r in codeview.ROLES.values())
    assert "white-space: pre-wrap" in html  # long lines wrap instead of being cut off at the right edge


def with_comments(source: str, text: str) -> str:
    """``source`` with every comment's text replaced by ``text`` (strings that look like comments left alone)."""
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            lines[row - 1] = lines[row - 1][:column] + text
    return "\n".join(lines)


@pytest.mark.parametrize("backend", ["pytorch", "accelerate", "trainer"])
def test_editing_the_comments_changes_no_role(backend):
    """Roles come from the syntax tree: comments reworded, or all saying another step's marker, change nothing."""
    code = codeview.backend_code(RunConfig(backend=backend).check())
    roles = codeview.line_roles(code)
    assert {"scale", "step"} <= set(roles)
    for text in ("# reworded", "# Accumulation, 3 of 3: step and zero", "# Accumulation:"):
        edited = with_comments(code, text)
        assert edited != code and codeview.line_roles(edited) == roles, text
