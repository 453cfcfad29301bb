"""``gradacc bench grpo --quick``: real GRPOTrainer runs, each optimizer step's gradient against the gradient of its
window's documented objective. What is asserted is what the runs measured: grpo and dr_grpo exact at every step,
dapo exact where steps_per_generation = k and not where it is 2k, its scale there the window's tokens ÷ TRL's
normaliser (the generation batch's tokens × k / steps_per_generation), both read from the run's own inputs."""

import json

import pytest

from gradacc.bench import grpo
from gradacc.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:The kopts argument:UserWarning")


def test_quick_grpo_bench_measures_which_loss_types_follow_their_window(tmp_path, capsys):
    code = main(["bench", "grpo", "--quick", "--out", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["suite"] == "grpo" and result["quick"] is True
    rows = result["rows"]
    assert {r["loss_type"] for r in rows} == {"grpo", "dr_grpo", "dapo"}
    assert all(r["verdict"] != "no signal" and r["residual"] < 1e-4 for r in rows), rows  # same direction throughout
    for r in rows:
        k, spg = r["k"], r["steps_per_generation"]
        if r["loss_type"] in ("grpo", "dr_grpo") or spg == k:
            assert abs(r["scale"] - 1) < 1e-4 and r["verdict"] == "exact", r
        else:  # dapo over two windows per generation: each step ÷ the generation's tokens × k/spg
            assert r["verdict"] == "scaled" and abs(r["scale"] - 1) > 1e-4, r
            [generation_tokens] = r["generation_batch_tokens"]
            assert r["scale"] == pytest.approx(r["window_tokens"] / (generation_tokens * k / spg), rel=1e-4), r
    spread = [r for r in rows if r["loss_type"] == "dapo" and r["steps_per_generation"] == 2 * r["k"]]
    assert len(spread) == 2 and sum(r["window_tokens"] for r in spread) == spread[0]["generation_batch_tokens"][0]
    for r in (r for r in rows if r["step"] == 1):  # the audit on each run's first step, against the truth's scale
        audit = r["audit"]
        assert audit["cause"] == ("exact" if r["verdict"] == "exact" else "normalised_by_generation_batch"), r
        assert audit["scale"] == pytest.approx(r["scale"], rel=1e-5), r
    headers, table = grpo.table(result)  # the table the command prints: one line a step
    assert len(table) == len(rows) and all(len(line) == len(headers) for line in table)
