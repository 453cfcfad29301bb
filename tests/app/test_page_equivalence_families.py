"""The Equivalence page's "Trainer's default, by model family" table: the benchmark's measured rows, shown on
page load without computing anything (tests/analysis/test_families_bench.py checks that a rerun reproduces them)."""

import json

from app_support import open_app, page_text

from gradacc.app import equivalence_view


def test_the_page_shows_trainers_default_by_family(app_home):
    stored = json.loads(equivalence_view.FAMILY_TABLE.read_text(encoding="utf-8"))
    at = open_app("equivalence")
    assert not at.exception
    assert "Trainer's default, by model family" in [header.value for header in at.subheader]
    assert f"transformers {stored['settings']['transformers']}" in page_text(at)
    # Which data and collator: the Audit page finds a stock Trainer's causal LM miscounted, and this says why.
    assert equivalence_view.FAMILY_DATA in page_text(at) and "DataCollatorForLanguageModeling" in page_text(at)
    assert len(at.dataframe) == 1  # no check has run: this table is the only one
    table = at.dataframe[0].value
    assert list(table.columns) == ["family", "kind", "exact", "naive", "Trainer library default",
                                   "Trainer's default", equivalence_view.AUDIT_COLUMN]
    assert set(table[equivalence_view.AUDIT_COLUMN]) == {"exact / exact"}  # no false alarm, dropout on
    assert list(table["family"]) == [row["family"] for row in stored["rows"]]
    assert len(table) >= 8 and len(set(table["kind"])) == 3
    assert (table["exact"] <= 1e-5).all()
    k = stored["settings"]["grad_accum_steps"]
    verdicts = dict(zip(table["family"], table["Trainer's default"]))
    assert verdicts["bert"] == f"{k}× wrong" and verdicts["gpt2"] == "right"
