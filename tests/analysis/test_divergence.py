"""Why two loss curves differ, as the headline and ``gradacc compare`` say it: on runs that part by float rounding
(recorded real runs) and by dropout (real short runs), with the figures checked against a truth computed here."""

import statistics
from pathlib import Path

import pytest
from support import real_run_events, write_events

from gradacc import cli
from gradacc import events as ev
from gradacc.cli.options import EXIT_BAD_INPUT
from gradacc.analysis import divergence, headline

# Two real runs of Train's defaults at dropout 0 (tiny-bert, the PyTorch loop, 2000 examples, 2 epochs, 126 steps),
# m=8, k=4 and m=4, k=8, recorded on the CPU (support.REAL_RUNS) by
#   python -m gradacc train -m 8 -k 4 --dropout 0 --metrics-out tiny-bert-m8k4-dropout0.jsonl
#   python -m gradacc train -m 4 -k 8 --dropout 0 --metrics-out tiny-bert-m4k8-dropout0.jsonl
# They agree to 2e-06 for 42 steps, then part: another summation order, amplified by training.
ROUNDING_PAIR = ("tiny-bert-m8k4-dropout0", "tiny-bert-m4k8-dropout0")


def losses(run_events: list[dict]) -> list[float]:
    """The loss of each optimizer step, in step order."""
    steps = sorted((e for e in run_events if e["event"] == ev.STEP), key=lambda e: e["step"])
    assert [e["step"] for e in steps] == list(range(1, len(steps) + 1))
    return [e["loss"] for e in steps]


def rounding_truth(a: list[float], b: list[float]) -> dict:
    """Where two step-aligned curves part, and their median difference, counted here step by step."""
    apart = [abs(x - y) / max(abs(x), abs(y)) for x, y in zip(a, b)]
    part = next(step for step, difference in enumerate(apart, 1) if difference > 1e-5)
    # The median over the steps where both losses are at least 5 % of their run's first loss.
    kept = [d for x, y, d in zip(a, b, apart) if x >= 0.05 * a[0] and y >= 0.05 * b[0]]
    return {"part": part, "agree_max": max(apart[:part - 1]), "median": statistics.median(kept), "kept": len(kept)}


@pytest.fixture(scope="module")
def rounding_pair() -> tuple[list[dict], list[dict]]:
    return real_run_events(ROUNDING_PAIR[0]), real_run_events(ROUNDING_PAIR[1])


def test_runs_parted_by_rounding_are_explained_as_rounding_never_as_accumulation(rounding_pair):
    a, b = rounding_pair
    truth = rounding_truth(losses(a), losses(b))
    assert truth["part"] == 43 and truth["agree_max"] < 1e-5 and truth["kept"] == 126  # the recorded runs
    figures = headline.headline(a, b)
    assert (figures["agree_steps"], figures["agree_last_step"], figures["part_step"]) == (42, 42, 43)
    assert figures["agree_max"] == pytest.approx(truth["agree_max"])
    assert figures["loss_claim"] == (f"Loss curves differ by {truth['median']:.1%} (median of 126 steps): identical to "
                                     f"{truth['agree_max']:.0e} for steps 1–42, apart from step 43 — not "
                                     "accumulation: another summation order, amplified by training (the gradients "
                                     "agree: see the Equivalence page's gradient check)")
    assert figures["verdict"] == divergence.EXPLAINED
    assert "m 4 vs 8" not in figures["headline"] and "accumulation is not" not in figures["headline"]
    # B against A or A against B: the same explanation.
    assert headline.headline(b, a)["loss_claim"].endswith(divergence.ROUNDING)


def test_the_same_runs_parted_at_step_2_are_laid_at_m_and_k_where_only_they_differ(rounding_pair):
    """What rounding is not: the same curves, B's losses off by 0.1 % from step 2 (the first loss after an update)
    on, a difference in the update itself, where only m and k differ."""
    a, b = rounding_pair
    moved = [{**e, "loss": e["loss"] * 1.001} if e["event"] == ev.STEP and e["step"] >= 2 else e for e in b]
    figures = headline.headline(a, moved, name_differences=False)
    assert figures["part_step"] == 2 and figures["agree_steps"] == 1
    first = abs(losses(a)[0] - losses(b)[0]) / max(losses(a)[0], losses(b)[0])
    assert figures["loss_claim"].endswith(f"identical to {first:.0e} for step 1, apart from step 2 — where only m "
                                          "and k differ: accumulation is not the big batch here"), figures["loss_claim"]
    assert figures["verdict"] == divergence.DIFFERS


def test_cli_compare_explains_the_rounding_in_the_headlines_words(rounding_pair, tmp_path, capsys):
    a, b = (write_events(tmp_path / f"{name}.jsonl", events) for name, events in zip("ab", rounding_pair))
    assert cli.main(["compare", a, b]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == headline.headline(*rounding_pair)["headline"]
    assert said[0].startswith("Loss curves differ by ")
    assert f"apart from step 43 — {divergence.ROUNDING} · " in said[0]
    assert said[1] == "(b.jsonl against a.jsonl)"


def train(tmp_path: Path, m: int, k: int, dropout: float) -> str:
    """A real short run of tiny-bert: 64 examples, one epoch of 4 optimizer steps of 16."""
    out = tmp_path / f"m{m}k{k}-dropout{dropout:g}.jsonl"
    assert cli.main(["train", "-m", str(m), "-k", str(k), "--dropout", str(dropout), "--epochs", "1",
                     "--train-samples", "64", "--eval-samples", "16", "--metrics-out", str(out)]) == 0
    return str(out)


def test_real_runs_with_dropout_are_explained_by_their_masks_and_agree_without(tmp_path, capsys):
    with_dropout = [train(tmp_path, 8, 2, 0.1), train(tmp_path, 4, 4, 0.1)]
    without = [train(tmp_path, 8, 2, 0.0), train(tmp_path, 4, 4, 0.0)]
    capsys.readouterr()
    curves = [losses(ev.read_events(path)) for path in with_dropout]
    first = abs(curves[0][0] - curves[1][0]) / max(curves[0][0], curves[1][0])
    assert first > 1e-5, curves  # the masks differ from step 1's forward pass on: nothing agrees

    assert cli.main(["compare", *with_dropout]) == 0
    said = capsys.readouterr().out.splitlines()[0]
    assert said.startswith("Loss curves differ "), said
    assert ("apart from step 1 — dropout 0.1 in both runs: each run draws its own dropout masks: set Dropout to 0 to "
            "compare the accumulation alone") in said, said
    assert "m 4 vs 8" not in said and "accumulation is not" not in said, said
    assert headline.headline(*map(ev.read_events, with_dropout))["verdict"] == divergence.EXPLAINED

    # The same two runs at dropout 0: the same curve, as the explanation said.
    assert cli.main(["compare", *without]) == 0
    assert capsys.readouterr().out.startswith("Loss curves identical (max difference ")


def test_a_run_that_failed_before_its_first_step_is_said_so_with_its_reason_never_as_none_figures(rounding_pair):
    failed = [ev.run_ended(status=ev.FAILED, reason="Could not load model 'no/such-model': not found on the hub.",
                           steps=0, wall_s=1.0, field="model")]
    figures = headline.headline(rounding_pair[0], failed)
    assert figures["headline"] == ("No loss to compare: the second run failed before its first step (Could not load "
                                   "model 'no/such-model': not found on the hub.)")
    assert figures["verdict"] == divergence.FAILED and "none" not in figures["headline"]
    first_failed = headline.headline(failed, rounding_pair[0])["headline"]
    assert first_failed.startswith("No loss to compare: the first run failed")


def test_cli_compare_says_a_file_of_a_failed_run_failed_and_why(rounding_pair, tmp_path, capsys):
    good = write_events(tmp_path / "a.jsonl", rounding_pair[0])
    failed = write_events(tmp_path / "b.jsonl", [ev.run_ended(status=ev.FAILED, reason="Could not load model 'x'.",
                                                               steps=0, wall_s=1.0, field="model")])
    assert cli.main(["compare", good, failed]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == ("error: 'b.jsonl' is a run that failed before its first step (Could "
                                               "not load model 'x'.): it has no loss to compare.")
