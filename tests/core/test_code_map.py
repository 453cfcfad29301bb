"""The README's code map ("Where the code is") names every module of gradacc/, pages/ and scripts/, folder by folder,
and nothing else: a module added, moved or deleted without the map fails here.

The map is a table, one row per folder: | `folder/` | what it holds | `module`, `module`, ... |. Every folder holding a
.py file has a row; the row names every module in it (``__init__`` may be left out); every name is a file there.
"""

from __future__ import annotations

import re
from pathlib import Path

from support import ROOT

MAPPED = ("gradacc", "pages", "scripts")
ROW = re.compile(r"^\|\s*`(?P<folder>[^`]+/)`\s*\|(?P<what>[^|]*)\|(?P<modules>[^|]*)\|\s*$")


def code_map(readme: str) -> dict[str, set[str]]:
    """Folder → the module names its row gives, from the README's "Where the code is" section."""
    section = readme.split("\n## Where the code is\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if match := ROW.match(line):
            assert match["folder"] not in rows, f"the code map has two rows for {match['folder']}"
            rows[match["folder"]] = set(re.findall(r"`([^`]+)`", match["modules"]))
    return rows


def modules_on_disk(root: Path) -> dict[str, set[str]]:
    """Folder → the modules in it, for every folder under gradacc/, pages/ and scripts/ that holds a .py file."""
    found: dict[str, set[str]] = {}
    for top in MAPPED:
        for path in (root / top).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            found.setdefault(path.parent.relative_to(root).as_posix() + "/", set()).add(path.stem)
    return found


def map_problems(readme: str, root: Path) -> list[str]:
    mapped, on_disk = code_map(readme), modules_on_disk(root)
    problems = [f"{folder} is not in the code map" for folder in sorted(on_disk.keys() - mapped.keys())]
    problems += [f"the code map names {folder}, which holds no module"
                 for folder in sorted(mapped.keys() - on_disk.keys())]
    for folder in sorted(mapped.keys() & on_disk.keys()):
        problems += [f"{folder}{name}.py is missing from the code map"
                     for name in sorted(on_disk[folder] - mapped[folder] - {"__init__"})]
        problems += [f"the code map names {folder}{name}, which does not exist"
                     for name in sorted(mapped[folder] - on_disk[folder])]
    return problems


def test_the_readme_code_map_names_every_module_and_only_those():
    problems = map_problems((ROOT / "README.md").read_text(encoding="utf-8"), ROOT)
    assert problems == [], "README.md, Where the code is:\n" + "\n".join(problems)


def test_the_map_check_finds_a_planted_module_and_a_stale_name(tmp_path):
    """The check itself, on a small tree: clean as mapped, then a module added and a mapped one deleted."""
    for relative in ("gradacc/__init__.py", "gradacc/units.py", "gradacc/cli/__init__.py", "gradacc/cli/train.py",
                     "pages/home.py", "scripts/watchers.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    readme = ("# x\n\n## Where the code is\n\n| folder | what | modules |\n|---|---|---|\n"
              "| `gradacc/` | the ground floor | `units` |\n| `gradacc/cli/` | commands | `train` |\n"
              "| `pages/` | pages | `home` |\n| `scripts/` | by hand | `watchers` |\n\n## Next\n")
    assert map_problems(readme, tmp_path) == []

    (tmp_path / "gradacc/cli/plan.py").write_text("")
    (tmp_path / "scripts/browsing").mkdir()
    (tmp_path / "scripts/browsing/chromium.py").write_text("")
    (tmp_path / "pages/home.py").unlink()
    (tmp_path / "pages/train.py").write_text("")
    assert map_problems(readme, tmp_path) == [
        "scripts/browsing/ is not in the code map",
        "gradacc/cli/plan.py is missing from the code map",
        "pages/train.py is missing from the code map",
        "the code map names pages/home, which does not exist",
    ]
