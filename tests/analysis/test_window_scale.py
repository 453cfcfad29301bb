"""The gradient each step applied against its window's own, read from a run's events (the naive-vs-exact demo's
first chart and its headline clause), checked against gradients computed another way."""

import pytest

from gradacc.analysis import equivalence, window_scale
from gradacc.config import RunConfig
from gradacc.events import Recorder
from gradacc.training.run.engine import train


def recorded(**changes) -> list[dict]:
    recorder = Recorder()
    config = RunConfig(**{"model": "tiny-bert", "micro_batch_size": 8, "grad_accum_steps": 4, "epochs": 1,
                          "dropout": 0.0, "eval_samples": 16, "max_seq_length": 32, **changes}).check()
    assert train(config, recorder)["status"] == "completed"
    return recorder.events


def test_naive_steps_a_window_of_one_micro_batch_at_a_quarter_of_its_gradient_as_the_gradients_say():
    # 40 examples, m=8, k=4: a window of 32, then one of a single micro-batch.
    naive = window_scale.step_scales(recorded(train_samples=40, loss_normalization="naive"))
    assert naive == [(32, 1.0, 1.0), (40, 0.25, 0.25)]
    assert window_scale.claim(recorded(train_samples=40, loss_normalization="naive")) == \
        "1 of 2 steps at 0.25× their gradient"
    assert window_scale.step_scales(recorded(train_samples=40)) == [(32, 1.0, 1.0), (40, 1.0, 1.0)]  # exact
    # The truth another way: naive's accumulated gradient of a window of 8 examples against the full-batch gradient
    # of those 8, through the backend (gradacc.analysis.equivalence): 0.25 g is 75 % off g.
    report = equivalence.check(RunConfig(model="tiny-bert", micro_batch_size=8, grad_accum_steps=4,
                                         max_seq_length=32).check(), samples=8, cases=())
    assert report["naive_rel_error"] == pytest.approx(1 - naive[1][1], abs=1e-5)
    assert report["exact_rel_error"] <= 1e-5


def test_a_short_last_micro_batch_scales_its_window_unevenly():
    # 44 examples: the second window holds a micro-batch of 8 and one of 4 (N = 12): N/(k·n) = 12/32 and 12/16.
    scales = window_scale.step_scales(recorded(train_samples=44, loss_normalization="naive"))
    assert scales[1] == (44, 0.375, 0.75)
    assert window_scale.claim(recorded(train_samples=44, loss_normalization="naive")) == \
        "1 of 2 steps at 0.38–0.75× their gradient"


def test_no_scales_where_the_events_cannot_tell():
    lm = recorded(model="tiny-gpt", train_samples=32, task="causal-lm", loss_normalization="naive")
    assert window_scale.step_scales(lm) is None and window_scale.claim(lm) is None  # weighed by tokens
    broken = recorded(train_samples=40, loss_normalization="naive", pitfalls=["zero-grad-per-micro-batch"])
    assert window_scale.step_scales(broken) is None
