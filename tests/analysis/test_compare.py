"""Compare: summary rows from events, and exports a spreadsheet cannot be tricked by."""

import csv
import io
import json

from gradacc.analysis import compare, run_names
from gradacc import events as ev
from gradacc.config import RunConfig
from gradacc.serving.manager import RunState


def finished_run(label="=1+1", dataset="/srv/gradacc/uploads/secret-abc.csv") -> RunState:
    config = RunConfig(backend="accelerate", micro_batch_size=4, grad_accum_steps=8, dataset=dataset).to_dict()
    steps = [ev.step(step=s, epoch=1, samples_seen=32 * s, tokens_seen=0, micro_batches=8, loss=1 / s, grad_norm=1.0,
                     lr=1e-3, elapsed_s=2.0 * s, memory={"activation_bytes": 1000 + s, "rss_bytes": 1,
                                                         "cuda_peak_bytes": None}) for s in (1, 2)]
    events = [*steps, ev.eval_(epoch=1, step=2, eval_loss=0.3, eval_accuracy=0.9, eval_f1=0.88888),
              ev.run_ended(status="completed", reason=None, steps=2, wall_s=4.5)]
    return RunState("20250101-000000-abcdef", "owner", label, config, "completed", events=events)


def test_a_summary_row_has_config_and_results():
    row = compare.summary(finished_run())
    assert row["backend"] == "accelerate" and (row["m"], row["k"], row["effective batch"]) == (4, 8, 32)
    assert row["optimizer steps"] == 2 and row["wall time (s)"] == 4.5 and row["samples/s"] == 16.0
    assert row["peak activation bytes"] == 1002 and row["final F1"] == 0.8889 and row["final accuracy"] == 0.9
    assert row["dataset"] == "secret-abc.csv"  # the server's folders stay private


def language_model_run() -> RunState:
    config = RunConfig(model="tiny-gpt", task="causal-lm").to_dict()
    events = [ev.eval_(epoch=1, step=2, eval_loss=2.0, eval_perplexity=7.389056, eval_next_token_accuracy=0.41)]
    return RunState("20250101-000000-bbbbbb", "owner", None, config, "completed", events=events)


def test_the_table_shows_the_scores_its_runs_have_and_the_csv_keeps_every_column():
    lm = compare.summary(language_model_run())
    assert (lm["final perplexity"], lm["final next-token accuracy"], lm["final F1"]) == (7.3891, 0.41, None)
    classifier = compare.summary(finished_run())
    shown = compare.shown_columns([lm])
    assert "final perplexity" in shown and "final F1" not in shown and "final accuracy" not in shown
    assert "peak activation bytes" in shown  # only evaluation scores are dropped when empty
    assert "final perplexity" not in compare.shown_columns([classifier])
    assert {"final F1", "final perplexity"} <= set(compare.shown_columns([lm, classifier]))
    header = next(csv.reader(io.StringIO(compare.to_csv([classifier]))))
    assert header == list(compare.COLUMNS)


def test_a_run_without_events_has_empty_results():
    run = RunState("r", "o", None, RunConfig().to_dict(), "queued")
    row = compare.summary(run)
    assert row["optimizer steps"] == 0 and row["final F1"] is None and row["wall time (s)"] is None
    assert run_names.title(run) == "r · queued"
    assert run_names.legend_name(finished_run()) == "accelerate m4×k8 exact · abcdef"


def test_csv_neutralises_formula_cells_only():
    rows = [compare.summary(finished_run(label=label)) for label in ("=HYPERLINK(1)", "+1", "-2", "@SUM(A1)", "ok")]
    rows[0]["final F1"] = -0.5  # a negative number is data, not a formula
    parsed = list(csv.DictReader(io.StringIO(compare.to_csv(rows))))
    assert [r["label"] for r in parsed] == ["'=HYPERLINK(1)", "'+1", "'-2", "'@SUM(A1)", "ok"]
    assert parsed[0]["final F1"] == "-0.5"
    assert list(parsed[0]) == list(compare.COLUMNS)


def test_json_keeps_config_and_events():
    exported = json.loads(compare.to_json([finished_run()]))
    assert exported[0]["config"]["backend"] == "accelerate"
    assert [e["event"] for e in exported[0]["events"]] == ["step", "step", "eval", "run_ended"]
