"""A data table's columns: the file read as text cells, which column is the text and which the label, whether a
column can be a label at all, and its rows cleaned into texts and label ids (``gradacc.training.sources.data`` loads a
dataset through these; the Train form checks a visitor's file with them before Start).
"""

from __future__ import annotations

from gradacc import paths
from gradacc.config import RunConfig
from gradacc.errors import GradaccError, one_line
from gradacc.labels import field_label

TEXT_COLUMNS = ("text", "sentence", "review", "content", "document", "comment", "utterance")
LABEL_COLUMNS = ("label", "labels", "target", "class", "sentiment", "category")
# What a label column must look like. A class needs examples to learn from and, with 20 % held out, one to
# be evaluated on: at most one class per MIN_ROWS_PER_CLASS rows on average (never fewer than 2 allowed,
# never more than MAX_CLASSES). A column with a different value in (almost) every row is an id or a name,
# and one whose values are mostly sentences is text; neither trains anything (F1 0.000, "completed").
MIN_ROWS_PER_CLASS = 5
MAX_CLASSES = 1000
ID_LIKE_FRACTION = 0.9
FREE_TEXT_WORDS = 4


def read_table(source: str, confinement: paths.Confinement | None = None):
    """A CSV/JSONL/JSON data file as a pandas DataFrame of text cells; GradaccError (field ``dataset``) when
    the path lies outside ``confinement`` (None: the app's visitors' folders), is missing or empty, is not
    UTF-8 or cannot be parsed."""
    import pandas as pd  # here: the app's forms and uploads import this module; pandas loads in the warm-up

    path = paths.visitors_unless(confinement).data_path(source)
    if not path.is_file():
        raise GradaccError(f"No data file at {source!r}.", "dataset")
    if path.stat().st_size == 0:
        raise GradaccError(f"The data file {path.name!r} is empty.", "dataset")
    try:
        if path.suffix.lower() == ".csv":
            # Everything as text: labels are mapped below, and no cell is ever evaluated.
            # utf-8-sig: "CSV UTF-8" from Excel starts with a byte-order mark, which must not stick to a name.
            return pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
        return pd.read_json(path, lines=path.suffix.lower() == ".jsonl", dtype=False, encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise GradaccError(f"{path.name!r} is not UTF-8 text; save it as UTF-8 and try again.", "dataset") from None
    except (ValueError, pd.errors.ParserError) as error:
        raise GradaccError(f"Could not read {path.name!r} as {path.suffix[1:].upper()}: "
                           f"{one_line(error, with_type=False)}.",
                           "dataset") from None


def max_classes(rows: int) -> int:
    """Most classes ``rows`` labelled rows can support (see MIN_ROWS_PER_CLASS)."""
    return min(MAX_CLASSES, max(2, rows // MIN_ROWS_PER_CLASS))


def label_problem(values) -> str | None:
    """Why a column of values cannot be a classification label (a clause), or None if it can."""
    present = [str(v).strip() for v in values if v is not None and v == v and str(v).strip() != ""]
    if not present:
        return "it is empty"
    rows, classes = len(present), len(set(present))
    if classes < 2:
        return f"every row has the same label ({present[0]!r}); a classifier needs at least two"
    cap = max_classes(rows)
    if classes > cap and sorted(len(v.split()) for v in present)[rows // 2] >= FREE_TEXT_WORDS:
        return f"it holds free text ({classes} different sentences in {rows} rows), not classes"
    if rows >= 10 and classes >= ID_LIKE_FRACTION * rows:
        return f"it has a different value in almost every row ({classes} values in {rows} rows), like an id or a name"
    if classes > cap:
        return (f"it has {classes} classes, more than {rows} rows can teach (at most {cap}: "
                f"{MIN_ROWS_PER_CLASS} rows per class on average, {MAX_CLASSES} at most)")
    return None


def usable_label_columns(frame, text_column: str | None = None) -> list[str]:
    """Columns of ``frame`` (other than the text column) that could be a label, in table order."""
    return [str(c) for c in frame.columns if c != text_column and label_problem(frame[c]) is None]


def _pick_column(columns, given: str | None, candidates, what: str, field_name: str) -> str:
    if given:
        if given not in columns:
            raise GradaccError(f"There is no {what} column {given!r}; columns are {', '.join(map(str, columns))}.",
                               field_name)
        return given
    lowered = {str(c).lower(): c for c in columns}
    for name in candidates:
        if name in lowered:
            return lowered[name]
    raise GradaccError(f"Could not find a {what} column (looked for {', '.join(candidates)}); "
                       f"columns are {', '.join(map(str, columns))}. Name it explicitly.", field_name)


def detect_label_column(frame, text_column: str | None = None) -> str | None:
    """The column auto-detection picks: the first by name (LABEL_COLUMNS) that can be a label, never an id,
    free text, a single class or too many classes; None when no column is named like a label."""
    lowered = {str(c).lower(): c for c in frame.columns if c != text_column}
    named = [lowered[name] for name in LABEL_COLUMNS if name in lowered]
    usable = [c for c in named if label_problem(frame[c]) is None]
    return (usable or named or [None])[0]


def pick_columns(frame, config: RunConfig, labelled: bool) -> tuple[str, str | None]:
    """The text column and (``labelled``: the task learns a label per text) the label column."""
    columns = list(frame.columns)
    text_col = _pick_column(columns, config.text_column, TEXT_COLUMNS, "text", "text_column")
    if not labelled:
        return text_col, None  # e.g. a language model learns the text itself
    label_col = config.label_column or detect_label_column(frame, text_col)
    if label_col is None:
        works = usable_label_columns(frame, text_col)
        raise GradaccError(f"Could not find a label column (looked for {', '.join(LABEL_COLUMNS)}); columns are "
                           f"{', '.join(map(str, columns))}. {_would_work(works, 'Name one explicitly')}",
                           "label_column")
    label_col = _pick_column(columns, label_col, LABEL_COLUMNS, "label", "label_column")
    if text_col == label_col:  # every text would be its own class: a run that learns nothing, silently
        raise GradaccError(f"The text and the label column are both {text_col!r}; pick a different label column.",
                           "label_column")
    problem = label_problem(frame[label_col])
    if problem:
        works = usable_label_columns(frame, text_col)
        raise GradaccError(f"{field_label('label_column')} {label_col!r} cannot be a label: {problem}. "
                           f"{_would_work(works)}", "label_column")
    return text_col, label_col


def _would_work(columns: list[str], ask: str = "Pick one") -> str:
    if not columns:
        return "No column of this data would work as a label."
    return f"{ask}: {', '.join(repr(c) for c in columns)} would work."


def clean_texts(raw_texts: list):
    """Causal-lm: keep the rows with a non-empty text (``clean_rows``'s shape, without labels)."""
    kept = [i for i, t in enumerate(raw_texts) if isinstance(t, str) and t.strip()]
    if not kept:
        raise GradaccError("No row has a non-empty text.", "dataset")
    dropped = len(raw_texts) - len(kept)
    notes = [f"Dropped {dropped} row(s) with an empty text."] if dropped else []
    return [raw_texts[i] for i in kept], [], [], notes, kept


def clean_rows(raw_texts: list, raw_labels: list):
    """Drop rows without text or label, map labels to ids 0..C-1, refuse what cannot be learned.

    Returns texts, label ids, label names, notes, and the indices of the rows kept.
    """
    notes = []
    kept = [i for i, (t, l) in enumerate(zip(raw_texts, raw_labels))
            if isinstance(t, str) and t.strip() and l is not None and str(l).strip() != "" and l == l]
    rows = [(raw_texts[i], raw_labels[i]) for i in kept]
    dropped = len(raw_texts) - len(rows)
    if not rows:
        raise GradaccError("No row has both a non-empty text and a label.", "dataset")
    if dropped:
        notes.append(f"Dropped {dropped} row(s) with an empty text or label.")
    label_values = [l for _, l in rows]
    kinds = {"number" if isinstance(l, (int, float)) and not isinstance(l, bool) else "text" for l in label_values}
    if len(kinds) > 1:
        raise GradaccError("Labels mix numbers and text; use one kind for every row.", "label_column")
    label_names = sorted({str(l) for l in label_values}, key=_natural_key)
    if len(label_names) < 2:
        raise GradaccError(f"Every row has the same label ({label_names[0]!r}); a classifier needs at least two.",
                           "label_column")
    if len(label_names) > MAX_CLASSES:  # pick_columns refuses this first; kept for data that skips it
        raise GradaccError(f"{len(label_names)} distinct labels; at most {MAX_CLASSES} are supported.", "label_column")
    ids = {name: i for i, name in enumerate(label_names)}
    return [t for t, _ in rows], [ids[str(l)] for l in label_values], label_names, notes, kept


def _natural_key(name: str):
    try:
        return (0, float(name), name)
    except ValueError:
        return (1, 0.0, name)
