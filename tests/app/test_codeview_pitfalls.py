"""The Code page's loop with a pitfall: the right loop plus exactly that pitfall's wrong line, in red."""

import difflib

import pytest

from app_support import open_app
from gradacc.app import codeview
from gradacc.choices import PITFALLS
from gradacc.config import RunConfig


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
    assert lines[right_row].strip().startswith(codeview.RIGHT_LINES[name]) and roles[right_row] != codeview.WRONG
    html = codeview.highlighted_html(broken, roles, {right_row})
    assert html.count('class="ga-line ga-wrong') == len(added) and html.count("ga-right") == 2  # the CSS rule, the row


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
