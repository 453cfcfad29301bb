"""``gradacc export-html``: a demo, or stored runs, as one self-contained web page that replays them offline."""

from __future__ import annotations

from pathlib import Path

from gradacc.cli.options import EXIT_OK
from gradacc.errors import GradaccError
from gradacc.serving.store import RunStore


def add_parser(commands) -> None:
    export = commands.add_parser("export-html", help="a demo (its last completed runs) or stored runs / --metrics-out "
                                                     "files as one self-contained HTML page replaying them")
    export.add_argument("sources", nargs="+", metavar="RUN_OR_DEMO",
                        help="a demo name, or run ids from this machine's store and --metrics-out files")
    export.add_argument("--out", required=True, help="the HTML file to write, e.g. demo.html")
    export.set_defaults(run=run)


def run(args) -> int:
    # The replay builds the app's own view (Streamlit's modules): imported here so `gradacc --help` answers at once.
    from gradacc.app import gallery, web_page

    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise GradaccError(f"--out {args.out!r} must be a file in a folder that exists.")
    title, runs, scenario, compares = web_page.resolve(args.sources, RunStore())
    if scenario:
        page = web_page.demo_page(scenario, runs, gallery.gradient_checks(scenario, lambda line: print(line, flush=True)))
    else:
        page = web_page.page_html(title, runs, compares=compares)
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as error:
        raise GradaccError(f"--out {args.out!r} could not be written: {error.strerror or error}.") from None
    print(f"Wrote {out} ({len(page) / 1e6:.1f} MB): {title}, {len(runs)} runs; open it in any browser, no network "
          "needed.")
    return EXIT_OK
