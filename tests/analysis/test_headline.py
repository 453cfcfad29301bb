"""The headline of two runs: what Compare, the Demos page and `python -m gradacc compare` say."""

import json
import re
import statistics

import pytest

from gradacc import cli
from gradacc.cli import options as cli_options
from gradacc import events as ev
from gradacc.analysis import divergence, headline, run_names
from gradacc.config import RunConfig


def run_events(m=8, k=4, losses=(0.7, 0.5, 0.3), activation=1_000_000, seconds_per_step=1.0, f1=0.9,
               eval_metrics=None, jitter=(0.0,), cpu_seconds_per_step=None, **config_changes) -> list[dict]:
    """One run's events; step n ends at n × seconds_per_step plus jitter[n % len(jitter)] of wall time, and at
    n × cpu_seconds_per_step of the training thread's CPU time (none measured when None)."""
    config = RunConfig(micro_batch_size=m, grad_accum_steps=k, **config_changes).check()
    batch = config.effective_batch
    found = [ev.run_started(config=config.to_dict(), effective_batch=batch, total_steps=len(losses),
                            steps_per_epoch=len(losses), train_examples=batch * len(losses), eval_examples=10,
                            static_memory={"total": 1}, device="cpu")]
    for step, loss in enumerate(losses, 1):
        found.append(ev.step(step=step, epoch=1, samples_seen=step * batch, tokens_seen=0, micro_batches=k,
                             loss=loss, grad_norm=1.0, lr=1e-3, elapsed_s=step * seconds_per_step + jitter[step % len(jitter)],
                             memory={"activation_bytes": activation, "rss_bytes": 1, "cuda_peak_bytes": None},
                             cpu_s=None if cpu_seconds_per_step is None else step * cpu_seconds_per_step))
    if eval_metrics is None:
        found.append(ev.eval_(epoch=1, step=len(losses), eval_loss=0.3, eval_accuracy=0.9, eval_f1=f1))
    else:
        found.append({"event": ev.EVAL, "epoch": 1, "step": len(losses), **eval_metrics})
    found.append(ev.run_ended(status="completed", reason=None, steps=len(losses), wall_s=3.0))
    return found


def test_identical_curves_say_so_with_the_costs():
    losses = (0.7, 0.6, 0.5, 0.45, 0.4, 0.35)
    big = run_events(m=32, k=1, losses=losses, activation=4_200_000, seconds_per_step=1.0, dropout=0.0,
                     jitter=(0.0, 0.05, -0.05))
    small = run_events(m=8, k=4, losses=(*losses[:-1], 0.35000003), activation=1_000_000, seconds_per_step=1.6,
                       dropout=0.0, jitter=(0.0, 0.05, -0.05))
    figures = headline.headline(big, small)
    # The time per step is measured, never said: two runs one after the other are no paired measurement.
    assert figures["headline"] == "Loss curves identical (max difference 9e-08) · activations 4.2× smaller · F1 0.900 both"
    assert figures["loss_points_compared"] == 6
    assert figures["activation_ratio"] == pytest.approx(4.2)
    assert figures["samples_per_s_ratio"] == pytest.approx(1 / 1.6)
    assert figures["effective_batch"] == [32, 32]
    assert figures["differences"] == ["micro_batch_size", "grad_accum_steps"]


def test_curves_apart_at_a_few_steps_only_say_both_the_largest_and_the_median_difference():
    """batchnorm's LayerNorm control over 960 steps: equivalent runs whose float rounding drifts them 2 % apart at a
    few late steps, 1e-07 at the median. "Differ by 1e-07" contradicted itself."""
    start = (0.66, 0.5, 0.3, 0.2, 0.1)
    a = run_events(m=32, k=1, losses=(*start, 0.05), dropout=0.0)
    b = run_events(m=4, k=8, losses=(*(loss * (1 + 1e-7) for loss in start), 0.051), dropout=0.0)
    figures = headline.headline(a, b, name_differences=False)
    assert figures["loss_claim"] == ("Loss curves differ by up to 2.0% (median 1e-07): identical to 1e-07 for steps "
                                     f"1–5, apart from step 6 — {divergence.ROUNDING}")
    assert figures["verdict"] == divergence.EXPLAINED


def test_different_curves_name_what_differs():
    exact = run_events(losses=(0.7, 0.5, 0.4))
    naive = run_events(losses=(0.7, 0.45, 0.28), loss_normalization="naive", f1=0.8)
    figures = headline.headline(exact, naive)
    assert figures["loss_max_rel_diff"] == pytest.approx(0.3)
    # naive described against exact: naive's values first, as the names are said; the median over the three steps
    # (0, 10 and 30 % apart), not the largest.
    assert figures["headline"].startswith("Loss curves differ by 10% (median of 3 steps): identical to the bit for "
                                          "step 1, apart from step 2 — normalisation naive vs exact differs · ")
    assert figures["verdict"] == divergence.EXPLAINED
    # A page naming each run by what differs ("naive", "exact") leaves the setting to the names: the headline stays
    # short (a demo's on a projector), and blue, not green.
    short = headline.headline(exact, naive, name_differences=False)
    assert short["loss_claim"] == "Loss curves differ by 10% (median of 3 steps)"
    assert short["verdict"] == divergence.EXPLAINED
    assert "activations the same" in figures["headline"]
    # One run of each cannot tell an effect from seed noise: the scores are shown, not explained.
    assert "F1 0.800 vs 0.900 (one seed each)" in figures["headline"]


def test_different_effective_batches_are_not_called_identical():
    small = run_events(m=8, k=4, losses=(0.7, 0.5, 0.3, 0.2))
    large = run_events(m=8, k=8, losses=(0.5, 0.2))  # the same losses at 64 and 128 samples seen
    figures = headline.headline(small, large)
    assert figures["loss_points_compared"] == 2 and figures["loss_max_rel_diff"] == 0
    assert not figures["same_effective_batch"]
    assert figures["loss_claim"] == "Different effective batches (64 vs 32): loss differs by 0% (median of 2 steps)"
    assert "identical" not in figures["headline"]


def test_different_data_is_said_before_any_equality():
    figures = headline.headline(run_events(), run_events(seed=7))
    assert figures["loss_claim"].startswith("Different data (seed 7 vs 42)")
    assert not figures["same_data"]


def test_without_f1_perplexity_or_else_the_shared_eval_metrics_are_reported():
    lm = {"eval_loss": 2.0, "eval_perplexity": 7.389, "eval_next_token_accuracy": 0.41}
    other = {"eval_loss": 2.0, "eval_perplexity": 7.389, "eval_next_token_accuracy": 0.43}
    figures = headline.headline(run_events(eval_metrics=lm), run_events(eval_metrics=other))
    assert set(figures["eval"]) == {"eval_perplexity"}  # a language model's one score: the headline stays short
    assert "perplexity 7.389 both" in figures["headline"]
    without = {key: value for key, value in lm.items() if key != "eval_perplexity"}
    figures = headline.headline(run_events(eval_metrics=without), run_events(eval_metrics=other))
    assert "next token accuracy 0.430 vs 0.410 (one seed each)" in figures["headline"]
    pairs = {"eval_loss": 0.2, "eval_mrr_at_10": 0.978, "eval_recall_at_1": 0.955}
    figures = headline.headline(run_events(eval_metrics=pairs), run_events(eval_metrics={**pairs, "eval_mrr_at_10": 0.969}))
    assert set(figures["eval"]) == {"eval_mrr_at_10"}  # contrastive: its ranking score alone
    assert "MRR@10 0.969 vs 0.978 (one seed each)" in figures["headline"]


def test_cli_compare_prints_the_headline_or_json(tmp_path, capsys):
    paths = []
    for name, events in (("a", run_events(m=32, k=1, activation=4_000_000)), ("b", run_events())):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(ev.to_json(e) + "\n" for e in events))
        paths.append(str(path))
    assert cli.main(["compare", *paths]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Loss curves identical (max difference 0) · activations 4.0× smaller")
    assert out[1] == "(b.jsonl against a.jsonl)"  # the order the headline's values are in
    assert cli.main(["compare", *paths, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["activation_ratio"] == 4.0 and figures["headline"].startswith("Loss curves identical")


def test_a_loss_hundreds_of_times_larger_is_said_as_a_ratio_not_a_bounded_percentage():
    figures = headline.headline(run_events(losses=(0.7, 0.5, 0.3), learning_rate=0.005),
                                run_events(losses=(140.0, 150.0, 171.0), learning_rate=5.0))
    assert figures["loss_claim"] == ("Loss curves differ: loss 300× larger (median of 3 steps): apart from step 1 — "
                                     "lr 5 vs 0.005 differs")


def test_a_loss_ratio_is_the_median_over_the_steps_above_noise_not_a_maximum_over_near_zero_losses():
    # Both runs fit their data: late losses near zero, where 0.002 against 0.0001 would read "20×".
    a = run_events(losses=(0.7, 0.5, 0.3, 0.2, 0.001, 0.0001, 0.0002))
    b = run_events(losses=(0.7, 0.55, 0.33, 0.21, 0.002, 0.002, 0.0001), seed=42, learning_rate=1e-3)
    figures = headline.headline(a, b)
    assert figures["loss_points_above_noise"] == 4  # 5 % of the first loss (0.035) and above, in both runs
    assert figures["loss_ratio_median"] == pytest.approx(statistics.median([1.0, 1.1, 1.1, 1.05]))
    # |B − A| over the larger: 0, 0.05/0.55, 0.03/0.33, 0.01/0.21; their median 6.9 %
    assert figures["loss_claim"].startswith("Loss curves differ by 6.9% (median of 4 steps)")
    assert "20×" not in figures["headline"] and "up to" not in figures["headline"]


def test_the_steps_naive_applied_off_their_gradient_are_said_where_the_normalisations_differ():
    # m=8, k=4, 40 examples: a window of 32, then one of a single micro-batch (8 examples): naive steps it at 0.25×.
    def short_window_run(normalization):
        found = run_events(losses=(0.7, 0.6), loss_normalization=normalization)
        for event, (seen, micro_batches) in zip([e for e in found if e["event"] == ev.STEP], ((32, 4), (40, 1))):
            event.update(samples_seen=seen, micro_batches=micro_batches)
        return found

    figures = headline.headline(short_window_run("exact"), short_window_run("naive"))
    assert figures["scale_claim"] == "naive: 1 of 2 steps at 0.25× their gradient"
    assert " · naive: 1 of 2 steps at 0.25× their gradient · " in figures["headline"]
    assert headline.headline(short_window_run("naive"), short_window_run("naive"))["scale_claim"] is None


def test_trainer_default_against_the_fix_says_the_k_times_loss_and_why():
    default = run_events(losses=(2.8, 2.0, 1.6, 1.2), trainer_library_default=True, backend="trainer")
    fixed = run_events(losses=(0.7, 0.52, 0.42, 0.31), trainer_library_default=False, backend="trainer")
    figures = headline.headline(default, fixed)
    assert figures["loss_ratio_median"] == pytest.approx(1 / 3.9, rel=0.02)
    assert figures["loss_claim"] == ("Loss 3.9× smaller with gradacc's fix (median of 4 steps): Trainer's default "
                                     "did not divide the loss by k=4")


def test_time_per_step_is_measured_but_never_said_of_runs_made_one_after_the_other():
    # The same pair read "within noise" in one run and "1.6× slower (CPU time)" in the next: two runs one after the
    # other on a shared machine are no paired measurement, whatever their figures say.
    losses = (0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3)
    quiet = run_events(losses=losses, seconds_per_step=1.0, cpu_seconds_per_step=0.9)
    for other in (run_events(losses=losses, seconds_per_step=2.0, cpu_seconds_per_step=1.8),
                  run_events(losses=losses, seconds_per_step=2.0), run_events(losses=losses, seconds_per_step=1.0)):
        figures = headline.headline(quiet, other)
        assert not re.search(r"per step|slower|faster|within noise", figures["headline"]), figures["headline"]
    figures = headline.headline(quiet, run_events(losses=losses, seconds_per_step=2.0, cpu_seconds_per_step=1.8))
    assert figures["step_seconds_clock"] == "cpu"
    assert figures["step_seconds_quartiles"][1][1] == pytest.approx(1.8)  # measured for --json and the table
    assert figures["time_per_step_ratio"] == pytest.approx(2.0)


def test_cli_compare_refuses_a_file_that_is_not_events(tmp_path, capsys):
    bad = tmp_path / "notes.jsonl"
    bad.write_text("hello\n")
    assert cli.main(["compare", str(bad), str(bad)]) == cli_options.EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == ("error: 'notes.jsonl' line 1 is not JSON; pass a file written by "
                                               "--metrics-out.")


def test_runs_are_named_by_what_differs():
    configs = {"a": RunConfig(dropout=0.0, learning_rate=5e-3).check().to_dict(),
               "b": RunConfig(dropout=0.1, learning_rate=1e-4).check().to_dict(),
               "c": RunConfig(dropout=0.1, learning_rate=1e-4).check().to_dict()}
    assert run_names.differing_labels(configs) == {"a": "m=8, k=4, lr 0.005, dropout 0",
                                                 "b": "m=8, k=4, lr 0.0001, dropout 0.1 #1",
                                                 "c": "m=8, k=4, lr 0.0001, dropout 0.1 #2"}


def test_a_run_without_a_memory_budget_is_named_so():
    configs = {"wall": RunConfig(micro_batch_size=64, grad_accum_steps=1, memory_budget_mb=450).check().to_dict(),
               "free": RunConfig(micro_batch_size=64, grad_accum_steps=1).check().to_dict()}
    assert run_names.differing_labels(configs) == {"wall": "m=64, k=1, budget 450 MB",
                                                 "free": "m=64, k=1, no memory budget"}


def test_curves_that_part_after_naive_stepped_a_short_window_at_another_scale_are_not_called_rounding():
    """Both runs naive ÷k, 204 examples an epoch: six windows of 32, then 12 left. m=8, k=4 steps them as 8 + 4
    (0.375× and 0.75× their due), m=4, k=8 as 4 + 4 + 4 (0.375×): another update, measured, not float rounding,
    though the curves agreed for the 7 steps before."""
    def short_window_run(m, k, last_micro_batches, losses, normalization):
        found = run_events(m=m, k=k, losses=losses, loss_normalization=normalization, dropout=0.0)
        seen = [32 * n for n in range(1, 7)] + [204] + [204 + 32 * n for n in range(1, 4)]
        for event, samples in zip([e for e in found if e["event"] == ev.STEP], seen):
            event.update(samples_seen=samples, micro_batches=last_micro_batches if samples == 204 else k)
        return found

    agreed = (0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4)

    def pair(normalization):
        return (short_window_run(8, 4, 2, (*agreed, 0.38, 0.36, 0.34), normalization),
                short_window_run(4, 8, 3, (*agreed, 0.39, 0.37, 0.35), normalization))

    figures = headline.headline(*pair("naive"), name_differences=False)
    assert figures["agree_steps"] == 7 and figures["part_step"] == 8
    assert figures["loss_claim"].endswith("identical to the bit for steps 1–7, apart from step 8 — naive: 1 of 10 "
                                          "steps at 0.38× their gradient"), figures["loss_claim"]
    assert divergence.ROUNDING not in figures["headline"] and figures["verdict"] == divergence.DIFFERS
    # The same curves of two exact runs: every window stepped whole, so the late part is rounding's.
    figures = headline.headline(*pair("exact"), name_differences=False)
    assert figures["loss_claim"].endswith(divergence.ROUNDING) and figures["verdict"] == divergence.EXPLAINED
