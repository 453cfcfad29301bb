"""The Code page's pitfalls: the loop stays the right one; each pitfall is a hook from pitfalls.py, shown apart with
its wrong line in red, beside the loop's line it gets wrong."""

import ast

import pytest

from app_support import open_app
from gradacc.app import codeview
from gradacc.choices import PITFALLS
from gradacc.config import RunConfig

LOOP = "gradacc.training.backends.pytorch_loop"
# The loop's right line each pitfall gets wrong, and the hook's wrong line, as the two files write them.
RIGHT_LINES = {"scheduler-per-micro-batch": "lr_scheduler.step()", "clip-per-micro-batch": "norm = clip_gradients(",
               "zero-grad-per-micro-batch": "optimizer.zero_grad()", "log-undivided-loss": "window.add(loss.item()",
               "drop-last-window": "last_of_window = windows.closes("}
WRONG_LINES = {"scheduler-per-micro-batch": "loop.lr_scheduler.step()",
               "clip-per-micro-batch": "clip_gradients(loop.model,",
               "zero-grad-per-micro-batch": "loop.optimizer.zero_grad()",
               "log-undivided-loss": 'loop.window.add = lambda loss, activation_bytes: add(returned["loss"].item()',
               "drop-last-window": "loop.windows.closes = lambda index, num_micro_batches: (index + 1) % k == 0"}


@pytest.mark.parametrize("name", list(PITFALLS))
def test_each_pitfall_is_a_hook_whose_wrong_line_stands_beside_the_loops_right_line(name):
    right = codeview.backend_code(RunConfig().check())
    assert codeview.backend_code(RunConfig(pitfalls=[name]).check()) == right  # the loop itself never changes
    hook = codeview.pitfall_source(name)
    assert hook.startswith(f'@pitfall("{name}", breaks=')
    roles = codeview.pitfall_roles(name)
    assert [line.strip() for line, role in zip(hook.splitlines(), roles) if role == codeview.WRONG] \
        and all(line.strip().startswith(WRONG_LINES[name])
                for line, role in zip(hook.splitlines(), roles) if role == codeview.WRONG)
    lines = right.splitlines()
    row = codeview.right_line(right, name)
    assert lines[row].strip().startswith(RIGHT_LINES[name])
    note, noted_row = codeview.pitfall_note(right, name)
    assert noted_row == row and name in note and PITFALLS[name] in note
    html = codeview.highlighted_html(right, codeview.line_roles(right), {row})
    assert html.count("ga-right") == 2 and 'class="ga-line ga-wrong' not in html  # the CSS rule and the row
    assert codeview.highlighted_html(hook, roles).count('class="ga-line ga-wrong') == roles.count(codeview.WRONG)


def test_every_pitfall_has_one_registered_hook_and_the_loop_names_none():
    from gradacc.training.backends import pitfalls

    hooks = codeview.pitfall_hooks()
    assert list(hooks) == list(pitfalls.HOOKS) and set(hooks) == set(PITFALLS)
    assert all(pitfalls.HOOKS[name].__name__ == function for name, (function, _) in hooks.items())
    loop = ast.parse(codeview.definition_source(LOOP, "train"))
    named = {node.value for node in ast.walk(loop) if isinstance(node, ast.Constant)}
    assert not named & set(PITFALLS)


def test_the_right_line_is_found_in_the_syntax_tree_however_the_loop_is_laid_out():
    """The loop rewritten by ``ast.unparse`` (no comments, other quotes), the clip wrapped over two lines: each
    pitfall's right line is still found, by the call it makes."""
    source = ast.unparse(ast.parse(codeview.definition_source(LOOP, "train")))
    source = source.replace("norm = clip_gradients(model, config.max_grad_norm)",
                            "grad_norm = clip_gradients(\n                    model, config.max_grad_norm)")
    lines = source.splitlines()
    rewritten = {**RIGHT_LINES, "clip-per-micro-batch": "grad_norm = clip_gradients("}
    for name in PITFALLS:
        assert lines[codeview.right_line(source, name)].strip().startswith(rewritten[name]), name


def test_the_code_page_shows_the_chosen_pitfalls_hook_apart_from_the_loop(app_home):
    at = open_app("code")
    right = at.code[0].value
    at.multiselect(key="form.code.pitfalls").set_value(["log-undivided-loss"]).run()
    assert not at.exception
    assert at.code[0].value == right  # the loop as plain text: unchanged
    hook, loop = [html.proto.body for html in at.get("html") if "ga-listing" in html.proto.body]
    assert 'class="ga-line ga-wrong' in hook and "log_undivided_loss" in hook
    assert 'class="ga-line ga-wrong' not in loop and 'class="ga-line ga-plain ga-right' in loop
    said = " ".join(m.value for m in at.markdown)
    assert "log-undivided-loss" in said and "transformers #35204" in said and "Break it on purpose" in said
    assert "`window.add(loss.item(), meter.bytes if measuring else None)`" in said
    at.radio(key="form.code.backend").set_value("accelerate").run()  # the other loops have no pitfalls to show
    assert not at.multiselect and sum("ga-listing" in html.proto.body for html in at.get("html")) == 1
