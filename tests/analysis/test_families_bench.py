"""`python -m gradacc bench families` on its quick subset: check on families it was never shown gives no false
verdict, Trainer's library default is k× wrong on classifier heads and right on causal LMs, gradacc.audit raises no
false alarm with each family's dropout on, and a rerun reproduces the rows the Equivalence page shows."""

import json

import pytest

from gradacc.app import equivalence_view
from gradacc.bench import families
from gradacc.cli import build_parser


@pytest.fixture(scope="module")
def quick():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return families.run(quick=True)
    finally:
        torch.set_num_threads(before)


def test_the_suite_is_a_bench_command():
    args = build_parser().parse_args(["bench", "families", "--quick"])
    assert args.suite == "families"


def test_no_false_verdicts_and_the_library_default_by_head(quick):
    k = quick["settings"]["grad_accum_steps"]
    rows = {row["family"]: row for row in quick["rows"]}
    assert list(rows) == list(families.QUICK_FAMILIES)
    kinds = {row["kind"] for row in rows.values()}
    assert kinds == {families.ENCODER, families.DECODER_CLASSIFIER, families.CAUSAL_LM}
    for row in rows.values():
        assert row["exact"] <= families.EXACT_LIMIT, row  # a false verdict would be exact "wrong"
        if row["kind"] == families.CAUSAL_LM:
            assert families.verdict(row, k) == "right"
            assert row["naive"] > 1e-3  # texts of uneven lengths: ÷k weighs tokens wrongly
        else:
            assert families.verdict(row, k) == f"{k}× wrong"
            assert row["library_default"] == pytest.approx(k - 1, rel=0.01)
    assert all(goal["met"] for goal in quick["goals"].values())
    headers, table = families.table(quick)
    assert headers[-2] == "Trainer's default" and len(table) == len(rows)


def test_the_moe_rows_name_the_router_term_k_times_and_the_fix_exact(quick):
    """One process (--quick): a stock Trainer's router term 4× the micro-batches' mean, the fix 1× (the audit's
    verdicts; tests/training/test_audit_moe.py holds them against the truth)."""
    k = quick["settings"]["grad_accum_steps"]
    stock, fixed = quick["moe"]["rows"]
    assert stock["verdict"] == "router_loss_k_times_too_large" and stock["router_scale"] == pytest.approx(k, rel=1e-3)
    assert fixed["verdict"] == "exact" and fixed["router_scale"] == pytest.approx(1, rel=1e-3)
    assert stock["main_scale"] == pytest.approx(1, abs=1e-4) and fixed["main_scale"] == pytest.approx(1, abs=1e-4)
    gap = quick["moe"]["window_gap"]
    assert -1 <= gap["cosine_all_weights"] < 1 - 1e-6  # the window's router loss is another objective
    assert len(quick["notes"]) == len(quick["moe"]["rows"]) + 1  # printed under the table


def test_the_audit_raises_no_false_alarm_on_any_family_with_its_dropout_on(quick):
    """gradacc.audit where accumulation is right (a Trainer with the fix, the Accelerate recipe), each family's
    dropout at 0.1: every verdict is exact, and the table's last column says so."""
    for row in quick["rows"]:
        assert [row[way] for way in families.AUDIT_WAYS] == ["exact", "exact"], row
    assert quick["goals"]["no_false_alarm_of_the_audit_with_dropout_on"]["met"]
    headers, table = families.table(quick)
    assert headers[-1].startswith("audit, dropout on") and {line[-1] for line in table} == {"exact / exact"}


def test_a_rerun_reproduces_the_pages_table(quick):
    stored = json.loads(equivalence_view.FAMILY_TABLE.read_text(encoding="utf-8"))
    for name in ("backend", "micro_batch_size", "grad_accum_steps", "max_seq_length", "seed", "case"):
        assert stored["settings"][name] == quick["settings"][name], name
    assert set(stored["settings"]["families"]) == set(families.FAMILIES)
    stored_rows = {row["family"]: row for row in stored["rows"]}
    for row in quick["rows"]:
        kept = stored_rows[row["family"]]
        assert kept["kind"] == row["kind"]
        assert kept["exact"] <= families.EXACT_LIMIT
        # Errors at rounding level are noise; the others are reproduced to a part in a thousand.
        for name in ("naive", "library_default"):
            if max(kept[name], row[name]) > families.EXACT_LIMIT:
                assert row[name] == pytest.approx(kept[name], rel=1e-3), (row["family"], name)
            else:
                assert row[name] <= families.EXACT_LIMIT
