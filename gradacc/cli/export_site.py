"""``gradacc export-site DIR``: every demo as a static gallery (an index and one replay page per demo) that opens
offline and deploys as a free static Hugging Face Space; the demos this machine has no run of are recorded first."""

from __future__ import annotations

import time
from pathlib import Path

from gradacc.analysis import demos
from gradacc.cli.options import EXIT_OK
from gradacc.errors import GradaccError


def add_parser(commands) -> None:
    site = commands.add_parser("export-site", help="every demo as a static gallery (index.html and one replay page "
                                                   "per demo) for a free static Space; records the demos it has no "
                                                   "run of")
    site.add_argument("folder", metavar="DIR", help="the folder to write (created if missing)")
    site.add_argument("--demo", action="append", dest="names", metavar="NAME", choices=list(demos.SCENARIOS),
                      help="this demo only (repeatable; default: every demo)")
    site.set_defaults(run=run)


def run(args) -> int:
    # The app's replay and the run manager: imported here so `gradacc --help` answers before Streamlit loads.
    from gradacc.app import gallery
    from gradacc.serving.store import RunStore

    folder = Path(args.folder)
    if folder.exists() and not folder.is_dir():
        raise GradaccError(f"DIR {args.folder!r} is a file; give a folder (it is created if missing).")
    began = time.perf_counter()
    try:
        written = gallery.write_site(folder, RunStore(), say=lambda line: print(line, flush=True), names=args.names)
    except OSError as error:
        raise GradaccError(f"DIR {args.folder!r} could not be written: {error.strerror or error}.") from None
    recorded = f", {len(written['recorded'])} demo(s) recorded first" if written["recorded"] else ""
    print(f"Wrote {folder}: {len(written['pages'])} pages, {written['bytes'] / 1e6:.1f} MB in all{recorded}, in "
          f"{time.perf_counter() - began:.0f} s. Open {folder / 'index.html'} in any browser (no network needed), "
          "or push the folder to a static Space (docs/demos.md).")
    return EXIT_OK
