"""The pitfall demos: per family, the right loop and the same run with its one wrong line, headlined by name."""

import warnings

import pytest

from gradacc.analysis import demos
from gradacc.choices import PITFALLS

FAMILIES = {"pitfall-scheduler": "scheduler-per-micro-batch", "pitfall-clip": "clip-per-micro-batch",
            "pitfall-zero-grad": "zero-grad-per-micro-batch", "pitfall-log-loss": "log-undivided-loss",
            "pitfall-drop-last": "drop-last-window"}


@pytest.mark.parametrize("name,pitfall", FAMILIES.items())
def test_each_pitfall_has_a_demo_of_the_right_loop_against_the_broken_one(name, pitfall):
    scenario = demos.get(name)
    if "#" in PITFALLS[pitfall]:  # the upstream report, named where the speaker starts, where there is one
        assert scenario.title.endswith(f" ({PITFALLS[pitfall]})")
    else:
        assert not scenario.title.endswith(")")  # nothing to add: the title names the mistake
    (right_label, right), (broken_label, broken) = scenario.configs(scale=1)
    assert (right.pitfalls, broken.pitfalls) == ([], [pitfall]) and scenario.compares == (0, 1)
    assert right.replace(pitfalls=[]) == broken.replace(pitfalls=[])  # nothing else differs
    assert right.backend == "pytorch" and right.grad_accum_steps > 1
    assert pitfall in broken_label and pitfall in scenario.explanation


def test_the_drop_last_demo_has_a_short_last_window_and_the_clip_demo_a_clip_that_engages():
    (_, drop), _ = demos.get("pitfall-drop-last").configs(scale=1)
    assert drop.train_samples % drop.effective_batch == 24  # the examples its broken run never trains
    (_, clip), _ = demos.get("pitfall-clip").configs(scale=1)
    assert clip.max_grad_norm < 1.0


def test_a_shrunken_pitfall_demo_headlines_the_pitfall_and_its_upstream_report(monkeypatch):
    from gradacc.analysis.headline import headline
    from gradacc.events import Recorder
    from gradacc.training.run.engine import train

    monkeypatch.setenv(demos.SCALE_ENV, "0.02")
    recorded = []
    for _, config in demos.get("pitfall-log-loss").configs():
        recorder = Recorder()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train(config.replace(max_seq_length=32), recorder)
        recorded.append(recorder.events)
    figures = headline(*recorded)
    assert figures["headline"].startswith("Broken on purpose: log-undivided-loss (transformers #35204) · ")
    assert figures["eval"]["eval_f1"][0] == figures["eval"]["eval_f1"][1]  # only the logging differs
    assert any(w.startswith("Pitfall log-undivided-loss") for w in recorded[1][-1]["warnings"])
