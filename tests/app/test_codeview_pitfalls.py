"""The Code page's loop with a pitfall: the right loop plus exactly that pitfall's wrong line, in red."""

import ast
import difflib

import pytest

from app_support import open_app
from gradacc.app import codeview
from gradacc.choices import PITFALLS
from gradacc.config import RunConfig


# The right line each pitfall's wrong line stands beside, as the plain loop writes it.
RIGHT_LINES = {"scheduler-per-micro-batch": "lr_scheduler.step()", "clip-per-micro-batch": "norm = clip_gradients(",
               "zero-grad-per-micro-batch": "optimizer.zero_grad()", "log-undivided-loss": "logged_loss = loss.item()",
               "drop-last-window": "last_of_window = (index + 1) %"}
LOOP = "gradacc.training.backends.pytorch_loop"


def added_and_removed(right: str, broken: str) -> tuple[list[str], list[str]]:
    diff = list(difflib.ndiff(right.splitlines(), broken.splitlines()))
    return [line[2:] for line in diff if line.startswith("+ ")], [line[2:] for line in diff if line.startswith("- ")]


@pytest.mark.parametrize("name", list(PITFALLS))
def test_each_pitfall_adds_exactly_its_own_wrong_line_marked_beside_the_right_one(name):
    right = codeview.backend_code(RunConfig().check())
    broken = codeview.backend_code(RunConfig(pitfalls=[name]).check())
    added, removed = added_and_removed(right, broken)
    assert not removed and added
    assert f'if job.pitfall("{name}")' in added[0] and "# WRONG" in added[0]
    roles = codeview.line_roles(broken)
    lines = broken.splitlines()
    assert [line for line, role in zip(lines, roles) if role == codeview.WRONG] == added
    right_row = codeview.right_line(broken, name)
    assert lines[right_row].strip().startswith(RIGHT_LINES[name]) and roles[right_row] != codeview.WRONG
    html = codeview.highlighted_html(broken, roles, {right_row})
    assert html.count('class="ga-line ga-wrong') == len(added) and html.count("ga-right") == 2  # the CSS rule, the row


def test_wrong_and_right_lines_are_found_in_the_syntax_tree_however_the_loop_is_laid_out():
    """The loop rewritten by ``ast.unparse`` (every ``if x: stmt`` on two lines, no comments, other quotes), the clip
    wrapped over two lines and two right lines written differently: each pitfall's whole ``if`` is still red, and its
    right line is still found, by what it does."""
    source = ast.unparse(ast.parse(codeview.definition_source(LOOP, "train")))
    source = source.replace("norm = clip_gradients(model, config.max_grad_norm)",
                            "grad_norm = clip_gradients(\n                    model, config.max_grad_norm)")
    source = source.replace("logged_loss = loss.item()", "logged_loss: float = loss.item()")
    assert "if job.pitfall('log-undivided-loss'):\n" in source  # the one-line layout is gone
    rewritten = {**RIGHT_LINES, "clip-per-micro-batch": "grad_norm = clip_gradients(",
                 "log-undivided-loss": "logged_loss: float = loss.item()"}
    lines, roles = source.splitlines(), codeview.line_roles(source)
    statements = codeview.pitfall_statements(source)
    assert set(statements) == set(PITFALLS)
    for name, (first, last) in statements.items():
        assert last > first and roles[first:last + 1] == [codeview.WRONG] * (last + 1 - first)
        assert lines[codeview.right_line(source, name)].strip().startswith(rewritten[name]), name
    dropped = codeview.without_pitfalls(source)
    assert "job.pitfall(" not in dropped and "grad_norm = clip_gradients(" in dropped
    ast.parse(dropped)


def test_the_right_loop_shows_no_wrong_line_and_the_source_still_holds_them_all():
    right = codeview.backend_code(RunConfig().check())
    assert "job.pitfall(" not in right and codeview.WRONG not in codeview.line_roles(right)
    source = codeview.definition_source("gradacc.training.backends.pytorch_loop", "train")
    assert set(codeview.pitfall_statements(source)) == set(PITFALLS)


def test_the_code_page_draws_the_chosen_pitfall_in_red(app_home):
    at = open_app("code")
    right = at.code[0].value
    at.multiselect(key="form.code.pitfalls").set_value(["log-undivided-loss"]).run()
    assert not at.exception
    added, removed = added_and_removed(right, at.code[0].value)
    assert not removed and len(added) == 1 and 'job.pitfall("log-undivided-loss")' in added[0]
    assert "ga-wrong" in at.get("html")[0].proto.body
    said = " ".join(m.value for m in at.markdown)
    assert "log-undivided-loss" in said and "transformers #35204" in said and "`logged_loss = loss.item()`" in said
    at.radio(key="form.code.backend").set_value("accelerate").run()  # the other loops have no wrong lines to show
    assert not at.multiselect and "job.pitfall(" not in at.code[0].value
