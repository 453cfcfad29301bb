"""``python -m gradacc``: the engine headless, one module per command.

    train        one run; progress and a summary, or JSON events (one per line) with --json   (cli/train.py)
    check        the gradient-equivalence errors, naive vs exact                                (cli/check.py)
    audit        your script audited unchanged (-- python train.py), or a stock 🤗 Trainer on a model (cli/audit.py)
    plan         every memory lever measured on a model, and m and k for a budget              (cli/plan.py)
    compare      the headline of two runs from their --metrics-out files                        (cli/compare.py)
    export-html  a demo or runs as one self-contained web page that replays them               (cli/export.py)
    export-site  every demo as a static gallery for a free static Space                         (cli/export_site.py)
    bench        benchmark suites                                                               (gradacc/bench/)
    app          the Streamlit app (what follows goes to ``streamlit run``)                    (cli/app.py)

``gradacc`` (the installed console script) is the same command. Each command module has ``add_parser(commands)``,
which registers its flags and its ``run(args) -> exit code``; a command imports torch only inside ``run``, so
``--help`` and a mistyped flag answer at once.

Exit codes: 0 success, 2 bad input (one ``error:`` line on stderr), 1 a run that failed.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys

from gradacc import __version__, bench
from gradacc.cli import app, audit, check, compare, export, export_site, plan, train
from gradacc.cli.options import EXIT_BAD_INPUT, EXIT_FAILED, Parser
from gradacc.errors import GradaccError
from gradacc.labels import in_cli_words
from gradacc.training import distributed

COMMANDS = (train, plan, check, audit, compare, export, export_site, bench, app)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gradacc", description="See, and trust, gradient accumulation.")
    parser.add_argument("--version", action="version", version=f"gradacc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "app":
        return app.run(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if distributed.world_size() > 1:  # a rank of accelerate launch / torchrun: leave its process group at exit
        atexit.register(distributed.leave_process_group)
    try:
        return args.run(args)
    except GradaccError as error:
        print(f"error: {in_cli_words(error.message, error.field)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # e.g. `... --json | head`: the reader left; leave quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
