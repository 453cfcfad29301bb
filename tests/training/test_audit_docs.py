"""docs/audit.md's examples marked "runs as written" run as written and print what the page says they print."""

import re

from support import ROOT

MARK = "<!-- runs as written: tests/training/test_audit_docs.py -->"


def runnable_blocks() -> list[tuple[str, list[str]]]:
    """(code, the lines its trailing comments say it prints) for each marked block."""
    text = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    blocks = []
    for part in text.split(MARK)[1:]:
        code = re.match(r"\s*```python\n(.*?)```", part, re.S).group(1)
        printed = [line[2:] for line in code.splitlines() if line.startswith("# ")]
        blocks.append((code, printed))
    return blocks


def test_the_docs_trainer_example_runs_as_written_and_prints_what_it_says(capsys):
    blocks = runnable_blocks()
    assert blocks, "docs/audit.md has no example marked to run"
    for code, printed in blocks:
        exec(compile(code, "docs/audit.md", "exec"), {"__name__": "docs_example"})
        # Trainer prints its own log dicts too (PrinterCallback); the example's lines are the rest.
        out = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("{")]
        assert out == printed
