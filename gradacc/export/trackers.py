"""TensorBoard and Trackio, written from gradacc's own event stream.

One writer for every backend: the plain loop, Accelerate and Trainer emit the same events, and these
trackers turn them into the same scalars (Trainer keeps ``report_to="none"``; its own integrations are
never used). Step numbers are optimizer steps. A writer takes live events (it is an event sink) or a
stored run's list of events (the app's "Download for TensorBoard", for runs stored before this existed).

Nothing here imports torch, tensorboard or trackio at import time: each is imported when its tracker opens.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable

from gradacc import events as ev
from gradacc.labels import field_label
from gradacc.errors import GradaccError, one_line

log = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "trackio")
NONE = "none"
# Where TensorBoard event files go when no log dir is given: SummaryWriter's own default folder.
DEFAULT_LOG_DIR = "runs"
TRACKIO_PROJECT = "gradacc"
# Each would send a Trackio run to a Space, a server or a Hub bucket/dataset instead of the local store.
TRACKIO_REMOTE_VARIABLES = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID")

# ``step`` event field -> tracker tag. Fields that are None (no grad norm, no CUDA) are skipped.
STEP_SCALARS = {
    "loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm", "epoch": "train/epoch",
    "samples_seen": "train/samples_seen", "tokens_seen": "train/tokens_seen", "samples_per_s": "train/samples_per_s",
    "activation_bytes": "memory/activation_bytes", "rss_bytes": "memory/rss_bytes",
    "cuda_peak_bytes": "memory/cuda_peak_bytes",
}
# Every ``eval_*`` field of an ``eval`` event becomes ``eval/*`` (eval_f1 -> eval/f1).
EVAL_PREFIX = "eval_"


def parse_report_to(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"none"``, ``"tensorboard"``, ``"trackio"``, several comma-separated or a list of them -> the trackers."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for part in parts:
        name = str(part).strip().lower()
        if name in ("", NONE):
            continue
        if name not in TRACKERS:
            raise GradaccError(f"{field_label('report_to')} must be none, tensorboard or trackio (several comma-separated); "
                               f"got {str(part).strip()!r}.", "report_to")
        if name not in names:
            names.append(name)
    return tuple(names)


def scalars(event: dict) -> dict[str, float]:
    """The tracker scalars of a ``step`` or ``eval`` event (tag -> value); {} for any other event."""
    kind = event.get("event")
    if kind == ev.STEP:
        pairs = [(tag, event.get(field)) for field, tag in STEP_SCALARS.items()]
    elif kind == ev.EVAL:
        pairs = [("eval/" + key[len(EVAL_PREFIX):], value) for key, value in event.items()
                 if key.startswith(EVAL_PREFIX)]
    else:
        return {}
    return {tag: float(value) for tag, value in pairs
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def hyperparameters(config: dict) -> dict:
    """A run's config as flat hyper-parameters: numbers, text and booleans as they are, anything else as text."""
    return {name: value if isinstance(value, (int, float, str, bool)) else
            (NONE if value is None else json.dumps(value, default=str)) for name, value in config.items()}


def check_run_id(run_id: str) -> str:
    """A run id names a folder and a Trackio run: one plain name, never a path."""
    text = str(run_id).strip()
    if not text or text in (".", "..") or any(c in text for c in "/\\\0") or text != run_id:
        raise GradaccError(f"{field_label('run_id')} must be one plain name (no slashes); got {run_id!r}.", "run_id")
    return text


class Trackers:
    """The trackers of one run. Call it with each event (an event sink); close it when the run is over.

    A tracker that fails while the run trains is turned off with one warning; the run goes on.
    """

    def __init__(self, writers: list):
        self.writers = list(writers)
        self.failures: dict[str, str] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(writer.name for writer in self.writers)

    def __call__(self, event: dict) -> None:
        values = scalars(event)
        if not values:
            return
        for writer in list(self.writers):
            try:
                writer.log(int(event["step"]), values, event.get("time"))
            except Exception as error:  # noqa: BLE001 - a tracker never fails the run it records
                self._turn_off(writer, error)

    def close(self) -> None:
        for writer in self.writers:
            try:
                writer.close()
            except Exception as error:  # noqa: BLE001
                self._turn_off(writer, error)
        self.writers = []

    def _turn_off(self, writer, error: Exception) -> None:
        reason = one_line(error)
        self.failures[writer.name] = reason
        log.warning("%s export stopped: %s", writer.name, reason)
        if writer in self.writers:
            self.writers.remove(writer)


def open_trackers(report_to: str | Iterable[str] | None, log_dir: str | os.PathLike | None, run_id: str,
                  config: dict) -> Trackers:
    """Open every tracker asked for, or raise GradaccError with one line before anything is trained."""
    names = parse_report_to(report_to)
    if not names:
        return Trackers([])
    run_id = check_run_id(run_id)
    opened = []
    try:
        for name in names:
            opened.append(_OPENERS[name](Path(log_dir) if log_dir else None, run_id, config))
    except BaseException:
        Trackers(opened).close()
        raise
    return Trackers(opened)


def export_events(run_events: list[dict], report_to: str | Iterable[str], log_dir: str | os.PathLike | None,
                  run_id: str) -> None:
    """Write a finished (or stored) run's events to the trackers, as if they had been live."""
    started = next((e for e in run_events if e.get("event") == ev.RUN_STARTED), None)
    trackers = open_trackers(report_to, log_dir, run_id, (started or {}).get("config") or {})
    try:
        for event in run_events:
            trackers(event)
    finally:
        trackers.close()


def tensorboard_zip(run_events: list[dict], run_id: str) -> bytes:
    """A zip of the run's TensorBoard event files (``<run id>/events.out.tfevents...``), built from its events."""
    with tempfile.TemporaryDirectory(prefix="gradacc-tensorboard-") as folder:
        export_events(run_events, ["tensorboard"], folder, run_id)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(Path(folder).rglob("*")):
                if path.is_file():
                    archive.write(path, path.relative_to(folder).as_posix())
        return buffer.getvalue()


# --- the two trackers -------------------------------------------------------------------------------------


class TensorBoardWriter:
    """Event files under ``log_dir/<run id>/`` (``torch.utils.tensorboard.SummaryWriter``)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path | None, run_id: str, config: dict):
        _require("tensorboard")
        folder = _writable_folder(log_dir or Path(DEFAULT_LOG_DIR)) / run_id
        try:
            # here: the app and `gradacc --help` import this module before torch loads
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(folder))
        except Exception as error:  # noqa: BLE001 - one line, at start
            raise GradaccError(f"{field_label('report_to')} tensorboard could not start: {one_line(error)}", "report_to") from None
        self.folder = folder
        self.config = config
        self.metrics: list[str] = []

    def log(self, step: int, values: dict[str, float], walltime: float | None) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step, walltime=walltime)
            if tag.startswith("eval/") and tag not in self.metrics:
                self.metrics.append(tag)

    def close(self) -> None:
        # Hyper-parameters last: the HParams dashboard lists the eval metrics, known once the run has evaluated.
        if self.config:
            # here: the app and `gradacc --help` import this module before torch loads
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(hyperparameters(self.config), {tag: 0.0 for tag in self.metrics}):
                self.writer.file_writer.add_summary(summary)
        self.writer.close()


class TrackioWriter:
    """A local Trackio project ``gradacc`` (its SQLite store in ``log_dir`` when given), one run per run id.

    Local only: no Space, no server, no upload. Trackio reads its folder (``TRACKIO_DIR``) once, when it is
    imported, so one process writes to one folder.
    """

    name = "trackio"

    def __init__(self, log_dir: Path | None, run_id: str, config: dict):
        remote = [name for name in TRACKIO_REMOTE_VARIABLES if os.environ.get(name)]
        if remote:
            raise GradaccError(f"{field_label('report_to')} trackio writes a local project only, but {remote[0]} is set (it would "
                               f"send the run elsewhere); unset it.", "report_to")
        _point_trackio_at(log_dir)
        trackio = _require("trackio")
        folder = _writable_folder(Path(trackio.utils.TRACKIO_DIR))
        try:
            with _quiet_stdout():
                self.run = trackio.init(project=TRACKIO_PROJECT, name=run_id, config=hyperparameters(config),
                                        embed=False, auto_log_cpu=False, auto_log_gpu=False)
        except Exception as error:  # noqa: BLE001 - one line, at start
            raise GradaccError(f"{field_label('report_to')} trackio could not start: {one_line(error)}", "report_to") from None
        self.trackio = trackio
        self.folder = folder

    def log(self, step: int, values: dict[str, float], walltime: float | None) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        with _quiet_stdout():
            # trackio.finish() also forgets the run, so its exit hook does not finish it a second time.
            if self.trackio.context_vars.current_run.get() is self.run:
                self.trackio.finish()
            else:
                self.run.finish()


def _point_trackio_at(log_dir: Path | None) -> None:
    """Make ``log_dir`` Trackio's folder: TRACKIO_DIR, which Trackio reads once, when it is imported."""
    if log_dir is None:
        return
    folder = _writable_folder(log_dir).resolve()
    loaded = sys.modules.get("trackio.utils")
    if loaded is not None and Path(loaded.TRACKIO_DIR).resolve() != folder:
        raise GradaccError(f"{field_label('log_dir')} for trackio: this process already writes Trackio to {loaded.TRACKIO_DIR} "
                           "(Trackio reads its folder once per process); use that log dir or a new process.",
                           "log_dir")
    os.environ["TRACKIO_DIR"] = str(folder)


_OPENERS = {"tensorboard": TensorBoardWriter, "trackio": TrackioWriter}


def _require(package: str):
    try:
        return importlib.import_module(package)
    except ImportError:
        raise GradaccError(f"{field_label('report_to')} {package} needs the {package} package: pip install {package}",
                           "report_to") from None


def _writable_folder(folder: Path) -> Path:
    """Create ``folder`` and prove a file can be written there, so a bad log dir fails before training."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise GradaccError(f"{field_label('log_dir')} {str(folder)!r} cannot be written: {error.strerror or error}.",
                           "log_dir") from None
    return folder


@contextlib.contextmanager
def _quiet_stdout():
    """Trackio prints banners (and a ``trackio show`` hint without the folder): stdout may be a JSON event
    stream, and the CLI says where the run went itself."""
    with open(os.devnull, "w", encoding="utf-8") as devnull, contextlib.redirect_stdout(devnull):
        yield
