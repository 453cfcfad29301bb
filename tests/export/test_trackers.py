"""TensorBoard and Trackio export, written from the event stream: read back with each tool's own reader.

Every backend, both trackers: each step's loss (and the other scalars) equals the JSON event's value, every eval
metric is there, the config is the run's hyper-parameters, the run id its name. A tracker that cannot start
fails before training with one line; one that fails halfway leaves the run alone.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gradacc import events as ev
from gradacc.cli import main
from gradacc.choices import BACKENDS
from gradacc.config import RunConfig
from gradacc.export import trackers
from gradacc.training.run.engine import train

# 2 epochs of ceil(ceil(40/8)/2) = 3 optimizer steps: a short last window in each epoch, two evals.
TINY = RunConfig(micro_batch_size=8, grad_accum_steps=2, epochs=2, train_samples=40, eval_samples=16,
                 max_seq_length=32, dropout=0.0)
CLI_TINY = ["-m", "8", "-k", "2", "--epochs", "1", "--train-samples", "32", "--eval-samples", "16",
            "--max-seq-length", "32"]
STEP_FIELDS = {"loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm",
               "samples_seen": "train/samples_seen", "tokens_seen": "train/tokens_seen",
               "activation_bytes": "memory/activation_bytes", "rss_bytes": "memory/rss_bytes"}
EVAL_FIELDS = {"eval_loss": "eval/loss", "eval_accuracy": "eval/accuracy", "eval_f1": "eval/f1"}


@pytest.fixture(scope="session")
def trackio_dir():
    """Trackio reads its folder once per process (TRACKIO_DIR), when first imported, by whichever test imports it
    (TRL's GRPOTrainer and Lightning do): conftest gives each test process one folder from the start, and every
    Trackio test writes there."""
    return Path(os.environ["TRACKIO_DIR"])


@pytest.fixture(scope="module")
def exported(trackio_dir):
    """One run per backend with both trackers on: {backend: (events, tensorboard folder, run id)}.

    One log dir for both, as the CLI's --log-dir: Trackio's store and TensorBoard's run folders side by side."""
    log_dir = trackio_dir
    runs = {}
    for backend in BACKENDS:
        recorder = ev.Recorder()
        run_id = f"test-{backend}"
        ended = train(TINY.replace(backend=backend), recorder, report_to="tensorboard,trackio", log_dir=log_dir,
                      run_id=run_id)
        assert ended["status"] == ev.COMPLETED, ended
        runs[backend] = (recorder.events, log_dir / run_id, run_id)
    return runs


def tensorboard_scalars(folder) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: {s.step: s.value for s in accumulator.Scalars(tag)} for tag in accumulator.Tags()["scalars"]}


def tensorboard_hparams(folder) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    content = accumulator.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
            for name, value in start.hparams.items()}


def trackio_rows(run_id: str) -> list[dict]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(trackers.TRACKIO_PROJECT, run_id)


def assert_matches_events(run_events, scalars_by_tag, exact: bool):
    """Every step's and every eval's values, at the optimizer step, equal the JSON events' values.

    TensorBoard keeps scalars as float32, so there the JSON value is compared after the same rounding."""
    same = (lambda a, b: a == b) if exact else (lambda a, b: np.float32(a) == np.float32(b))
    steps = [e for e in run_events if e["event"] == ev.STEP]
    evals = [e for e in run_events if e["event"] == ev.EVAL]
    assert steps and evals
    for fields, kind_events in ((STEP_FIELDS, steps), (EVAL_FIELDS, evals)):
        for field, tag in fields.items():
            logged = scalars_by_tag[tag]
            assert sorted(logged) == [e["step"] for e in kind_events], tag  # optimizer steps, nothing more
            for event in kind_events:
                assert same(logged[event["step"]], event[field]), (tag, event["step"], logged, event[field])


def trackio_by_tag(rows) -> dict[str, dict[int, float]]:
    by_tag: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if key not in ("step", "timestamp"):
                by_tag.setdefault(key, {})[row["step"]] = value
    return by_tag


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensorboard_reads_back_every_step_and_eval_of_each_backend(exported, backend):
    run_events, folder, _ = exported[backend]
    assert_matches_events(run_events, tensorboard_scalars(folder), exact=False)
    hyper = tensorboard_hparams(folder)
    config = run_events[0]["config"]
    assert hyper["backend"] == backend and hyper["micro_batch_size"] == config["micro_batch_size"]
    assert hyper["learning_rate"] == config["learning_rate"] and hyper["max_steps"] == "none"
    assert set(hyper) == set(config)


@pytest.mark.parametrize("backend", BACKENDS)
def test_trackio_reads_back_every_step_and_eval_of_each_backend(exported, backend):
    from trackio.sqlite_storage import SQLiteStorage

    run_events, _, run_id = exported[backend]
    assert run_id in SQLiteStorage.get_runs(trackers.TRACKIO_PROJECT)  # the run id is the run's name
    assert_matches_events(run_events, trackio_by_tag(trackio_rows(run_id)), exact=True)
    config = SQLiteStorage.get_run_config(trackers.TRACKIO_PROJECT, run_id)
    assert config["backend"] == backend and config["grad_accum_steps"] == 2


def test_every_backend_exports_the_same_tags_at_the_same_steps(exported):
    shapes = {}
    for backend, (_, folder, run_id) in exported.items():
        board = {tag: sorted(steps) for tag, steps in tensorboard_scalars(folder).items()}
        tracked = {tag: sorted(steps) for tag, steps in trackio_by_tag(trackio_rows(run_id)).items()}
        assert board == tracked, backend  # both trackers get the same scalars
        shapes[backend] = board
    assert shapes["pytorch"] == shapes["accelerate"] == shapes["trainer"]
    assert shapes["pytorch"]["train/loss"] == [1, 2, 3, 4, 5, 6]  # optimizer steps, not micro-batches
    assert shapes["pytorch"]["eval/f1"] == [3, 6]


def test_the_cli_writes_both_trackers_and_keeps_stdout_json(tmp_path, trackio_dir, capsys):
    code = main(["train", *CLI_TINY, "--json", "--report-to", "tensorboard,trackio", "--log-dir", str(trackio_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    run_events = [json.loads(line) for line in captured.out.splitlines()]  # trackio's banners are not in it
    assert run_events[-1]["status"] == ev.COMPLETED
    run_id = captured.err.split("Trackio: run ")[1].split()[0]
    assert_matches_events(run_events, tensorboard_scalars(trackio_dir / run_id), exact=False)
    assert_matches_events(run_events, trackio_by_tag(trackio_rows(run_id)), exact=True)
    assert f"TensorBoard: {trackio_dir}/{run_id}/" in captured.err


def test_tensorboard_zip_of_a_stored_run(exported, tmp_path):
    """The app's download: built from the run's stored events (a run stored before the export works too)."""
    from gradacc.serving.store import RunStore

    run_events, _, _ = exported["accelerate"]
    store = RunStore(tmp_path / "runs.sqlite3")
    store.create_run("20250101-120000-abcdef", "someone", run_events[0]["config"])
    for event in run_events:
        store.append_event("20250101-120000-abcdef", event)
    data = trackers.tensorboard_zip(store.events("20250101-120000-abcdef"), "20250101-120000-abcdef")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        assert len(names) == 1 and names[0].startswith("20250101-120000-abcdef/events.out.tfevents.")
        archive.extractall(tmp_path / "unzipped")
    assert_matches_events(run_events, tensorboard_scalars(tmp_path / "unzipped" / "20250101-120000-abcdef"),
                          exact=False)


def test_an_interrupted_run_without_run_ended_still_zips(exported, tmp_path):
    run_events, _, _ = exported["pytorch"]
    cut = [e for e in run_events if e["event"] != ev.RUN_ENDED][:3]  # run_started and two steps
    data = trackers.tensorboard_zip(cut, "cut-short")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        archive.extractall(tmp_path)
    assert sorted(tensorboard_scalars(tmp_path / "cut-short")["train/loss"]) == [1, 2]


def test_trackio_writes_without_touching_the_network(exported, trackio_dir, monkeypatch):
    """No Space, no server, no upload: every socket connection is refused while Trackio opens, logs and finishes."""
    import socket

    attempts = []

    def refuse(self, address, *args):
        attempts.append(address)
        raise OSError("the network is off in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    run_events, _, _ = exported["pytorch"]
    trackers.export_events(run_events, "trackio", trackio_dir, "no-network")
    assert attempts == []
    assert_matches_events(run_events, trackio_by_tag(trackio_rows("no-network")), exact=True)


# --- failures: one line at start, never a failed run halfway ------------------------------------------------


def cli_error(args, capsys) -> str:
    try:
        code = main(["train", *CLI_TINY, *args])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2, captured
    error_lines = [line for line in captured.err.strip().splitlines()]
    assert len(error_lines) == 1 and error_lines[0].startswith("error: "), captured.err
    assert "run_started" not in captured.out and "optimizer steps on" not in captured.out  # nothing trained
    return error_lines[0]


def test_an_unknown_tracker_is_refused(capsys):
    assert "--report-to must be none, tensorboard or trackio" in cli_error(["--report-to", "wandb"], capsys)


@pytest.mark.parametrize("tracker", trackers.TRACKERS)
def test_a_missing_tracker_package_is_one_line_at_start(tracker, monkeypatch, capsys, trackio_dir):
    monkeypatch.setitem(sys.modules, tracker, None)  # what `import` does when the package is not installed
    line = cli_error(["--report-to", tracker, "--log-dir", str(trackio_dir)], capsys)
    assert f"--report-to {tracker} needs the {tracker} package: pip install {tracker}" in line


@pytest.mark.parametrize("tracker", trackers.TRACKERS)
def test_an_unwritable_log_dir_is_one_line_at_start(tracker, tmp_path, capsys):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    line = cli_error(["--report-to", tracker, "--log-dir", str(a_file / "logs")], capsys)
    assert "--log-dir " in line and "cannot be written" in line and "not-a-folder" in line


def test_trackio_never_goes_remote(monkeypatch, capsys, trackio_dir):
    monkeypatch.setenv("TRACKIO_SPACE_ID", "someone/space")
    line = cli_error(["--report-to", "trackio", "--log-dir", str(trackio_dir)], capsys)
    assert "local project only" in line and "TRACKIO_SPACE_ID" in line


def test_trackio_refuses_a_second_folder_in_one_process(tmp_path, capsys, trackio_dir):
    import trackio  # noqa: F401 - imported with the session's folder

    line = cli_error(["--report-to", "trackio", "--log-dir", str(tmp_path / "elsewhere")], capsys)
    assert "already writes Trackio to" in line


def test_the_engine_reports_a_tracker_that_cannot_start_as_a_bad_field(tmp_path):
    recorder = ev.Recorder()
    a_file = tmp_path / "f"
    a_file.write_text("")
    ended = train(TINY, recorder, report_to=["tensorboard"], log_dir=a_file)
    assert ended["status"] == ev.FAILED and ended["field"] == "log_dir" and ended["steps"] == 0
    assert [e["event"] for e in recorder.events] == [ev.RUN_ENDED]


def test_a_tracker_failing_halfway_leaves_the_run_alone(tmp_path, monkeypatch, caplog):
    calls = []

    def disk_full(self, step, values, walltime):
        calls.append(step)
        if step == 2:
            raise OSError(28, "No space left on device")
        self.writer.add_scalar("train/loss", values["train/loss"], step)

    monkeypatch.setattr(trackers.TensorBoardWriter, "log", disk_full)
    recorder = ev.Recorder()
    with caplog.at_level(logging.WARNING, logger="gradacc.export.trackers"):
        ended = train(TINY.replace(epochs=1), recorder, report_to="tensorboard", log_dir=tmp_path, run_id="halfway")
    assert ended["status"] == ev.COMPLETED and len(recorder.of(ev.STEP)) == 3  # every event kept
    assert calls == [1, 2]  # turned off after its failure
    assert "tensorboard export stopped: OSError: [Errno 28] No space left on device" in caplog.text
    assert sorted(tensorboard_scalars(tmp_path / "halfway")["train/loss"]) == [1]  # what it wrote stays


@pytest.mark.parametrize("value,expected", [
    ("none", ()), (None, ()), ("tensorboard", ("tensorboard",)), (" TensorBoard , trackio ", ("tensorboard", "trackio")),
    (["trackio", "trackio"], ("trackio",)), ("none,tensorboard", ("tensorboard",)),
])
def test_report_to_accepts_names_lists_and_none(value, expected):
    assert trackers.parse_report_to(value) == expected


@pytest.mark.parametrize("run_id", ["../x", "a/b", "", "."])
def test_a_run_id_is_never_a_path(run_id, tmp_path):
    from gradacc.errors import GradaccError

    with pytest.raises(GradaccError, match="Run id must be one plain name"):
        trackers.open_trackers("tensorboard", tmp_path, run_id, {})
