"""``gradacc app``: become ``streamlit run`` on the app; the options that follow go to it."""

from __future__ import annotations

import os
import sys

from gradacc.app.command import streamlit_command
from gradacc.cli.options import EXIT_FAILED


def add_parser(commands) -> None:
    commands.add_parser("app", help="start the Streamlit app; other options go to streamlit run "
                                    "(e.g. --server.port 8502)")


def run(streamlit_options: list[str]) -> int:
    """Become ``streamlit run``: Ctrl-C and a container's SIGTERM then reach the server itself."""
    command = streamlit_command(streamlit_options)
    sys.stdout.flush()
    os.execv(command[0], command)
    return EXIT_FAILED  # not reached
