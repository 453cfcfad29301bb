"""The event stream's schema (gradacc/events.py): every event the three backends emit, on a good run and on
each way a run ends badly, is exactly what its kind declares: no unknown key, every required key, right types."""

import threading
from collections import Counter

import pytest

from attack_support import TINY, nan_loss, sabotage
from gradacc import events as ev
from gradacc.choices import BACKENDS
from gradacc.config import RunConfig
from gradacc.training.sources.data import load_text_data


def conforms(recorded: list[dict]) -> list[str]:
    return [problem for event in recorded for problem in ev.schema_problems(event)]


def run(config: RunConfig, **options) -> ev.Recorder:
    from gradacc.training.run.engine import train

    recorder = ev.Recorder()
    train(config, recorder, **options)
    return recorder


def kinds(recorder: ev.Recorder) -> list[str]:
    return [e["event"] for e in recorder.events]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_event_of_a_run_conforms_on_every_backend(backend, one_torch_thread):
    config = RunConfig(backend=backend, **TINY)
    recorder = run(config)
    assert kinds(recorder) == ["run_started", "step", "step", "step", "eval", "run_ended"]
    assert recorder.ended["status"] == ev.COMPLETED
    assert conforms(recorder.events) == []
    # A classifier's eval names its floor: the most frequent eval label's share, counted here from the data.
    labels = load_text_data(config).eval_labels
    evaluation = recorder.of("eval")[-1]
    assert evaluation["majority_accuracy"] == pytest.approx(Counter(labels).most_common(1)[0][1] / len(labels))
    assert evaluation["labels_predicted"] in (1, 2)


def test_the_optional_fields_conform_where_a_run_carries_them(one_torch_thread):
    """A run with a pitfall (``pitfall`` on its steps) under a generous memory budget (``memory_need``)."""
    recorder = run(RunConfig(backend="pytorch", pitfalls=["clip-per-micro-batch"], memory_budget_mb=100_000, **TINY))
    assert "memory_need" in recorder.of("run_started")[0] and "notes" in recorder.of("run_started")[0]
    assert all("pitfall" in step for step in recorder.of("step"))
    assert conforms(recorder.events) == []


@pytest.mark.parametrize("gradcache", [None, 4])
def test_a_contrastive_run_conforms(tmp_path, monkeypatch, gradcache, one_torch_thread):
    """The contrastive task's eval carries retrieval metrics; GradCache steps its own way."""
    from support import tiny_sentence_encoder

    encoder = tiny_sentence_encoder(tmp_path / "tiny-encoder")
    monkeypatch.setenv("GRADACC_MODEL_DIRS", str(tmp_path))
    recorder = run(RunConfig(model=str(encoder), task="contrastive", dataset="builtin-pairs", micro_batch_size=4,
                             grad_accum_steps=2, max_seq_length=16, train_samples=16, eval_samples=8, epochs=1,
                             gradcache_mini_batch=gradcache))
    assert recorder.ended["status"] == ev.COMPLETED, recorder.ended["reason"]
    assert recorder.of("eval")[-1]["eval_mrr_at_10"] is not None
    assert conforms(recorder.events) == []


def test_a_run_past_its_memory_budget_ends_conforming(one_torch_thread):
    recorder = run(RunConfig(backend="pytorch", memory_budget_mb=1, **TINY))
    ended = recorder.ended
    assert ended["status"] == ev.FAILED and "out_of_memory" in ended
    assert conforms(recorder.events) == []


def test_a_run_whose_loss_turns_nan_ends_conforming(monkeypatch, one_torch_thread):
    sabotage(monkeypatch, nan_loss, after_forwards=2)
    recorder = run(RunConfig(backend="pytorch", **TINY))
    assert recorder.ended["status"] == ev.FAILED
    assert conforms(recorder.events) == []


def test_a_stopped_run_ends_conforming(one_torch_thread):
    from gradacc.training.run.engine import train

    stop = threading.Event()
    recorder = ev.Recorder()

    def on_event(event):
        recorder(event)
        if event["event"] == ev.STEP:
            stop.set()

    train(RunConfig(backend="pytorch", **TINY), on_event, stop)
    assert recorder.ended["status"] == ev.STOPPED and recorder.of("step")
    assert conforms(recorder.events) == []


def test_the_serving_layers_own_run_ended_conforms():
    """The manager and the launcher build run_ended for runs that never reached the engine."""
    for ended in (ev.run_ended(status=ev.STOPPED, reason="stopped before it started", steps=0, wall_s=0.0),
                  ev.run_ended(status=ev.FAILED, reason="could not start the launcher", steps=0, wall_s=0.1)):
        assert ev.schema_problems(ended) == []


@pytest.mark.parametrize("change, problem", [
    ({"surprise": 1}, "step: unknown key 'surprise'"),
    ({"loss": "0.7"}, "step.loss: '0.7' is not float"),
    ({"step": True}, "step.step: True is not int"),
    ({"pitfall": {"planned_lr": 0.1}}, "step.pitfall: missing 'examples_seen'"),
])
def test_the_schema_catches_what_departs_from_it(change, problem):
    step = ev.step(step=1, epoch=1, samples_seen=16, tokens_seen=256, micro_batches=2, loss=0.7, grad_norm=None,
                   lr=1e-3, elapsed_s=0.5, memory={"activation_bytes": None, "rss_bytes": 1, "cuda_peak_bytes": None})
    assert ev.schema_problems(step) == []
    assert problem in ev.schema_problems({**step, **change})
    missing = dict(step)
    del missing["lr"]
    assert ev.schema_problems(missing) == ["step: missing 'lr'"]
    assert ev.schema_problems({"event": "checkpoint"}) == ["unknown event kind 'checkpoint'"]


def test_a_step_takes_only_the_declared_memory_fields():
    kwargs = dict(step=1, epoch=1, samples_seen=8, tokens_seen=64, micro_batches=1, loss=0.7, grad_norm=None,
                  lr=1e-3, elapsed_s=0.5)
    assert ev.step(**kwargs, memory={"rss_bytes": 1})["cuda_peak_bytes"] is None  # not measured: None
    with pytest.raises(TypeError, match="unknown memory field"):
        ev.step(**kwargs, memory={"rss_bytes": 1, "gpu_temperature": 60})


SHARDING = {"grad_sync": "per-window", "grad_bytes": [768776, 768776], "grad_peak_bytes": [868744, 868744],
            "grad_comm_bytes": [768776, 768776], "grad_comm_calls": [3, 3], "param_comm_bytes": [1168648, 1168648],
            "window_s": [0.11, 0.1]}


@pytest.mark.parametrize("change, problem", [
    ({"grad_sync": "sometimes"}, "step.sharding.grad_sync: 'sometimes' is not one of"),
    ({"grad_bytes": [1.5, 2]}, "step.sharding.grad_bytes[0]: 1.5 is not int"),
    ({"window_s": 0.1}, "step.sharding.window_s: 0.1 is not a list"),
])
def test_a_sharded_step_carries_each_ranks_figures_as_declared(change, problem):
    """A sharded (FSDP) run's steps carry one figure per rank (tests/training/test_fsdp.py checks real runs' steps)."""
    step = ev.step(step=1, epoch=1, samples_seen=16, tokens_seen=256, micro_batches=2, loss=0.7, grad_norm=None,
                   lr=1e-3, elapsed_s=0.5, memory={"rss_bytes": 1}, sharding=SHARDING)
    assert step["sharding"] == SHARDING and ev.schema_problems(step) == []
    assert problem in " ".join(ev.schema_problems({**step, "sharding": {**SHARDING, **change}}))
    assert "sharding" not in ev.step(step=1, epoch=1, samples_seen=16, tokens_seen=256, micro_batches=2, loss=0.7,
                                     grad_norm=None, lr=1e-3, elapsed_s=0.5, memory={})
