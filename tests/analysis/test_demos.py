"""The demo registry: every scenario builds valid runs, shrinks for tests without losing its point."""

import pytest

from gradacc.analysis import demos
from gradacc.config import RunConfig


@pytest.mark.parametrize("scenario", demos.SCENARIOS.values(), ids=list(demos.SCENARIOS))
def test_every_scenario_builds_valid_runs_that_differ(scenario):
    configs = scenario.configs(scale=1)
    assert len(configs) == len(scenario.runs) >= 2
    assert all(isinstance(config, RunConfig) for _, config in configs)
    for a, b in (scenario.compares, *scenario.controls):
        assert configs[a][1] != configs[b][1]  # each pair said compares two different runs
    assert scenario.chart in (None, *demos.STORY_CHARTS)
    from gradacc.serving.checks import CHECK_SETS

    assert scenario.checks in (None, *CHECK_SETS)
    assert scenario.name == scenario.name.strip().lower() and " " not in scenario.name  # ?demo=NAME


def test_the_stories_the_issue_asks_for_are_there():
    same = dict(demos.SCENARIOS["same-curve"].configs(scale=1))
    assert [(c.micro_batch_size, c.grad_accum_steps, c.dropout) for c in same.values()] == [(32, 1, 0.0), (8, 4, 0.0)]
    naive = [c for _, c in demos.SCENARIOS["naive-vs-exact"].configs(scale=1)]
    assert {c.loss_normalization for c in naive} == {"exact", "naive"}
    assert all(c.train_samples % c.effective_batch for c in naive)  # a short last window every epoch
    # Accumulation is not a big batch: each coupled loss its own demo, on its own axes, with its own checks.
    negatives = [c for _, c in demos.SCENARIOS["in-batch-negatives"].configs(scale=1)]
    assert {c.task for c in negatives} == {"contrastive"} and {c.effective_batch for c in negatives} == {64}
    norms = [c for _, c in demos.SCENARIOS["batchnorm"].configs(scale=1)]
    assert [(c.model, c.micro_batch_size, c.grad_accum_steps) for c in norms] == [
        ("bow-layernorm", 32, 1), ("bow-layernorm", 4, 8), ("bow-batchnorm", 32, 1), ("bow-batchnorm", 4, 8)]
    assert demos.SCENARIOS["batchnorm"].compares == (2, 3)  # the control first, the result about BatchNorm
    assert (demos.SCENARIOS["in-batch-negatives"].checks, demos.SCENARIOS["batchnorm"].checks) == (
        "in-batch-negatives", "norms")
    pitfall = [c for _, c in demos.SCENARIOS["trainer-pitfall"].configs(scale=1)]
    assert [c.trainer_library_default for c in pitfall] == [True, False]
    assert {c.backend for c in pitfall} == {"trainer"} and pitfall[0].grad_accum_steps > 1
    lm = [c for _, c in demos.SCENARIOS["naive-vs-exact-lm"].configs(scale=1)]
    assert {c.model for c in lm} == {"tiny-gpt"} and {c.task for c in lm} == {"causal-lm"}
    assert [(c.micro_batch_size, c.grad_accum_steps, c.loss_normalization) for c in lm] == [
        (32, 1, "exact"), (2, 16, "naive"), (2, 16, "exact")]  # full batch, naive, exact: one effective batch
    assert {c.dropout for c in lm} == {0.0} and len({c.train_samples for c in lm}) == 1


def test_shrinking_keeps_the_short_last_window(monkeypatch):
    monkeypatch.setenv(demos.SCALE_ENV, "0.05")
    for _, config in demos.SCENARIOS["naive-vs-exact"].configs():
        assert config.train_samples < 3880
        assert config.train_samples % config.effective_batch == 3880 % 32
        assert config.epochs == 2  # of 6: still two short last windows
    assert demos.scaled(1280, 32, 0.01) == 64  # never less than two windows


def test_a_shrunken_demo_keeps_the_steps_its_story_needs():
    lm = demos.SCENARIOS["naive-vs-exact-lm"]
    assert lm.min_steps > 2  # naive's drift needs steps to grow: 10 of them keep it under 0.5 %
    for scale in (0.01, 0.1):
        assert {config.train_samples // config.effective_batch for _, config in lm.configs(scale)} == {lm.min_steps}
    assert {config.train_samples for _, config in lm.configs(scale=1)} == {3200}  # on stage: all 100
    assert demos.scaled(96, 32, 0.1, min_steps=25) == 96  # never more windows than the scenario has


def test_a_bad_scale_is_refused_with_the_variable_name(monkeypatch):
    from gradacc.errors import GradaccError

    monkeypatch.setenv(demos.SCALE_ENV, "-1")
    with pytest.raises(GradaccError, match="GRADACC_DEMO_SCALE"):
        demos.demo_scale()


def test_the_landing_pages_range_of_demo_times_is_the_measured_one_in_docs():
    # docs/demos.md's table: | Link | What it shows | First progress | First point | Headline | Last run | Load |
    from support import ROOT

    rows = [line.split("|")[1:-1] for line in (ROOT / "docs" / "demos.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `/demos?demo=")]
    # one time ("23.3 s") or the range of the passes measured ("21.2–22.9 s")
    headlines = {cells[0].strip().strip("`").split("=")[1]: [float(t) for t in cells[4].strip().removesuffix(" s")
                                                             .split("–")] for cells in rows}
    assert set(headlines) == set(demos.SCENARIOS)  # every demo measured
    assert demos.MEASURED_RESULT_S == (min(min(t) for t in headlines.values()), max(max(t) for t in headlines.values()))


def test_a_titles_parenthesis_says_something_its_title_does_not():
    # "zero_grad() inside the accumulation window (zero_grad inside the window)" said it twice on the landing page.
    for scenario in demos.SCENARIOS.values():
        title, _, aside = scenario.title.partition(" (")
        words = {word.strip("():").lower() for word in title.split()}
        assert not {word for word in aside.rstrip(")").lower().split() if len(word) > 3} & words, scenario.title
