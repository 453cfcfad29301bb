"""``gradacc compare``: the headline of two runs from their --metrics-out event files, B against A."""

from __future__ import annotations

import json
from pathlib import Path

from gradacc import events
from gradacc.analysis import headline
from gradacc.cli.options import EXIT_OK


def add_parser(commands) -> None:
    compare = commands.add_parser("compare", help="the headline of two runs from their --metrics-out event files")
    compare.add_argument("run_a", metavar="A.jsonl")
    compare.add_argument("run_b", metavar="B.jsonl", help="described against A (\"activations 4× smaller\")")
    compare.add_argument("--json", action="store_true", help="the figures as JSON keys, plus 'headline'")
    compare.set_defaults(run=run)


def run(args) -> int:
    figures = headline.headline(events.read_events(args.run_a), events.read_events(args.run_b))
    if args.json:
        print(json.dumps(figures))
    else:  # the headline says B's values first: name the files in that order
        print(figures["headline"])
        print(f"({Path(args.run_b).name} against {Path(args.run_a).name})")
    return EXIT_OK
