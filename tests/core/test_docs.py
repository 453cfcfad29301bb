"""The documentation's links lead somewhere, and its gradacc commands are commands gradacc has.

Every relative link and image in README.md, BENCHMARKS.md, SECURITY.md and docs/ names a file that exists, and a
``#anchor`` names a heading of that file (as GitHub makes anchors of headings). Every ``gradacc`` command in a bash
block of those pages parses with the CLI's own parser: a renamed flag or command fails here, not in a reader's
terminal. Nothing is run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gradacc.cli import build_parser
from support import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "SECURITY.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def prose_and_blocks(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines outside fenced code blocks, and each block as (its language, its lines)."""
    prose, blocks, block = [], [], None
    for line in text.splitlines():
        fence = FENCE.match(line.strip())
        if block is None and fence:
            block = (fence.group(2).strip().lower(), [])
        elif block is not None and fence and not fence.group(2).strip():
            blocks.append(block)
            block = None
        elif block is not None:
            block[1].append(line)
        else:
            prose.append(line)
    return prose, blocks


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, links reduced to their text, punctuation dropped,
    spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = prose_and_blocks(page.read_text(encoding="utf-8"))
    found, seen = set(), {}
    for line in prose:
        if match := HEADING.match(line):
            slug = anchor(match.group(1))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    prose, _ = prose_and_blocks(page.read_text(encoding="utf-8"))
    problems = []
    for line in prose:
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):  # a link inside a code span is not a link
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                problems.append(f"{target}: no such file")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                problems.append(f"{target}: no heading #{fragment} in {linked.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_link_leads_to_a_file_and_a_heading(page):
    assert broken_links(page) == []


def gradacc_commands(page: Path) -> list[list[str]]:
    """The argument lists of every gradacc command in the page's bash blocks: after ``-m gradacc`` or the
    ``gradacc`` console script; comments dropped, continued lines joined."""
    _, blocks = prose_and_blocks(page.read_text(encoding="utf-8"))
    commands = []
    for language, lines in blocks:
        if language not in ("bash", "sh", "shell", ""):
            continue
        for line in "\n".join(lines).replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for at, word in enumerate(words):
                if (word == "gradacc" and at and words[at - 1] == "-m") or (at == 0 and Path(word).name == "gradacc"):
                    commands.append(words[at + 1:])
                    break
    return commands


def test_the_check_finds_commands_and_anchors_the_way_github_makes_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## cuda: one H200, once\n\n## cuda: one H200, once\n\n### #47688 table\n\n"
                    "```bash\ntorchrun --nproc_per_node 2 \\\n    -m gradacc train -m 8   # a comment\n"
                    ".venv/bin/gradacc --version\npip install .\n```\n\n[a](#cuda-one-h200-once-1) [b](#no-such)\n"
                    "[c](missing.md) `[d](in-code.md)` [e](https://example.org/x.md)\n")
    assert anchors(page) == {"title", "cuda-one-h200-once", "cuda-one-h200-once-1", "47688-table"}
    assert broken_links(page) == ["#no-such: no heading #no-such in page.md", "missing.md: no such file"]
    assert gradacc_commands(page) == [["train", "-m", "8"], ["--version"]]


COMMANDS = [(page, command) for page in PAGES for command in gradacc_commands(page)]
COMMAND_IDS = [f"{page.relative_to(ROOT).as_posix()}: {' '.join(command)}"[:120] for page, command in COMMANDS]


@pytest.mark.parametrize("page, command", COMMANDS, ids=COMMAND_IDS)
def test_every_documented_command_parses(page, command, capsys):
    try:
        args, extra = build_parser().parse_known_args(command)
    except SystemExit as exited:  # --version and --help exit 0; a usage error exits 2 with its reason
        assert exited.code == 0, capsys.readouterr().err
        return
    assert not extra or args.command == "app", f"unrecognized arguments: {extra}"  # app hands them to streamlit


def test_the_pages_hold_commands_to_check():
    assert len(COMMANDS) >= 30  # a parser of the pages that finds nothing would pass everything above
