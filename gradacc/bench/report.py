"""What every suite shares: the result envelope, small statistics, the table, and the files written.

A suite returns one JSON-ready dict; ``write`` puts it under the output folder as ``SUITE.json`` with
its plotly figure as ``SUITE.html`` and ``SUITE.png``. PNG export needs a Chrome (kaleido 1.x); when it
cannot run, the HTML is still written and the PNG is reported as skipped with the reason.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from gradacc.errors import one_line
from gradacc.training.run.job import pick_device

FIGURE_SIZE = dict(width=960, height=460)
# kaleido's Chrome page sometimes is not ready in time on a loaded machine; once more usually works.
PNG_ATTEMPTS = 2


_STARTED = time.perf_counter()


def progress(message: str) -> None:
    """Long suites say what they are doing on stderr (stdout stays one JSON object with --json)."""
    print(f"[bench {time.perf_counter() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def machine(threads: int) -> dict:
    import torch  # here: `gradacc --help` imports this module (through gradacc.bench) before torch loads

    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "torch_threads": threads, "device": str(pick_device()),
            "load_average_at_start": _load_average()}


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def envelope(suite: str, quick: bool, threads: int, settings: dict) -> dict:
    return {"suite": suite, "quick": quick, "machine": machine(threads), "settings": settings,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def finish(result: dict, started: float) -> dict:
    result["machine"]["load_average_at_end"] = _load_average()
    result["suite_wall_s"] = round(time.perf_counter() - started, 2)
    return result


# --- statistics ---------------------------------------------------------------------------------

def spread(values: list[float]) -> dict:
    """Median with quartiles and extremes: the claim and how far the rounds scatter around it."""
    ordered = sorted(values)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {"median": statistics.median(ordered), "q1": q1, "q3": q3, "min": ordered[0], "max": ordered[-1],
            "n": len(ordered), "values": values}


def step_intervals(step_events: list[dict]) -> list[float]:
    """Seconds between consecutive step events of the same epoch (an interval across an epoch end would
    include the evaluation)."""
    return [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(step_events, step_events[1:]) if a["epoch"] == b["epoch"]]


def goal(measured: float, target: str, met: bool) -> dict:
    return {"measured": measured, "goal": target, "met": bool(met)}


# --- output -------------------------------------------------------------------------------------

def write(result: dict, figure, out_dir: Path) -> dict:
    """SUITE.json, SUITE.html and (if a Chrome is available) SUITE.png; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = result["suite"]
    files = {"json": str(out_dir / f"{name}.json"), "html": str(out_dir / f"{name}.html")}
    figure.update_layout(**FIGURE_SIZE)
    # plotly.js once beside the pages rather than 4 MB inside each; opens offline.
    figure.write_html(files["html"], include_plotlyjs="directory")
    files["png"] = None
    for attempt in range(PNG_ATTEMPTS):
        try:
            figure.write_image(str(out_dir / f"{name}.png"), **FIGURE_SIZE)
            files["png"] = str(out_dir / f"{name}.png")
            files.pop("png_skipped", None)
            break
        except Exception as error:  # noqa: BLE001 - no Chrome, no kaleido: the HTML is enough
            files["png_skipped"] = one_line(error, limit=200)
            progress(f"PNG export failed (attempt {attempt + 1} of {PNG_ATTEMPTS}): {files['png_skipped']}")
    result["files"] = files
    Path(files["json"]).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return files


def print_table(headers: list[str], rows: list[list]) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("  ".join(str(h).ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if 0 < abs(value) < 1e-3:  # a rounding-level error is not 0.000
            return f"{value:.2e}"
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def print_goals(result: dict) -> None:
    for name, entry in result.get("goals", {}).items():
        mark = "met" if entry["met"] else "MISSED"
        print(f"goal {name}: {_cell(entry['measured'])} (goal {entry['goal']}) — {mark}")
    for note in result.get("notes", []):
        print(f"note: {note}")


def print_files(files: dict) -> None:
    written = [files["json"], files["html"]] + ([files["png"]] if files.get("png") else [])
    print("wrote " + ", ".join(written))
    if files.get("png_skipped"):
        print(f"PNG skipped: {files['png_skipped']}")


def megabytes(value: int | None) -> float | None:
    return None if value is None else value / 1e6
