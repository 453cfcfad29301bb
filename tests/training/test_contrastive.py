"""The contrastive task: in-batch negatives make accumulation a different loss; GradCache is the big batch."""

import pytest

from support import tiny_sentence_encoder
from gradacc.analysis.equivalence import check
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.events import Recorder
from gradacc.training.run.engine import train

EXACT_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return tiny_sentence_encoder(tmp_path_factory.mktemp("encoders") / "tiny-encoder")


def contrastive(encoder_dir, **changes) -> RunConfig:
    values = dict(model=str(encoder_dir), task="contrastive", dataset="builtin-pairs", micro_batch_size=4,
                  grad_accum_steps=4, max_seq_length=16, train_samples=32, eval_samples=16, epochs=1)
    return RunConfig(**{**values, **changes})


@pytest.fixture(autouse=True)
def trusted_folders(monkeypatch, encoder_dir):
    monkeypatch.setenv("GRADACC_MODEL_DIRS", str(encoder_dir.parent))


@pytest.mark.parametrize("backend", ["pytorch", "accelerate", "trainer"])
def test_accumulation_is_another_loss_and_gradcache_the_big_batch(backend, encoder_dir, one_torch_thread):
    report = check(contrastive(encoder_dir, backend=backend))
    ways = report["ways"]
    assert report["effective_batch"] == 16
    assert ways["batch"]["rel_error"] == 0.0  # the reference itself
    assert ways["accumulation"]["rel_error"] >= 0.1
    assert ways["gradcache"]["rel_error"] <= EXACT_TOLERANCE
    assert (ways["accumulation"]["micro_batch_size"], ways["gradcache"]["gradcache_mini_batch"]) == (4, 4)
    # Activations of a micro-batch (accumulation) or of a mini-batch (GradCache): far below the batch's.
    batch_bytes = ways["batch"]["activation_bytes"]
    assert 0 < ways["accumulation"]["activation_bytes"] < batch_bytes / 2
    assert 0 < ways["gradcache"]["activation_bytes"] < batch_bytes / 2


def test_a_contrastive_run_reports_retrieval_after_each_epoch(encoder_dir, one_torch_thread):
    recorder = Recorder()
    ended = train(contrastive(encoder_dir, epochs=2, gradcache_mini_batch=2, learning_rate=1e-3), recorder)
    assert ended["status"] == "completed", ended["reason"]
    evals = recorder.of("eval")
    assert [e["epoch"] for e in evals] == [1, 2]
    for event in evals:
        assert 0 < event["eval_mrr_at_10"] <= 1 and 0 <= event["eval_recall_at_1"] <= 1
        assert event["eval_f1"] is None
    steps = recorder.of("step")
    assert steps[0]["samples_seen"] == 16 and steps[0]["activation_bytes"] > 0
    assert recorder.of("run_started")[0]["config"]["gradcache_mini_batch"] == 2


@pytest.mark.parametrize("changes, field, words", [
    (dict(task="classification", dataset="builtin-sentiment", gradcache_mini_batch=2), "gradcache_mini_batch",
     "contrastive task only"),
    (dict(gradcache_mini_batch=8), "gradcache_mini_batch", "from 1 to 4"),
    (dict(memory_budget_mb=100.0), "memory_budget_mb", "not measured for the contrastive task"),
])
def test_bad_contrastive_settings_are_refused_in_words(encoder_dir, changes, field, words):
    with pytest.raises(GradaccError, match=words) as refused:
        contrastive(encoder_dir, **changes).check()
    assert refused.value.field == field


def test_wrong_data_for_the_task_fails_with_a_reason(encoder_dir):
    ended = train(contrastive(encoder_dir, dataset="builtin-sentiment"), Recorder())
    assert ended["field"] == "dataset" and "builtin-pairs" in ended["reason"]
    ended = train(RunConfig(dataset="builtin-pairs", train_samples=8, eval_samples=8), Recorder())
    assert ended["field"] == "dataset" and "contrastive task" in ended["reason"]


def test_the_cli_defaults_a_contrastive_run_to_minilm_on_builtin_pairs():
    from gradacc.cli import build_parser
    from gradacc.cli.options import config_from_args

    config = config_from_args(build_parser().parse_args(["train", "--task", "contrastive", "-m", "16", "-k", "4"]))
    assert (config.model, config.dataset) == ("all-MiniLM-L6-v2", "builtin-pairs")


def test_builtin_pairs_ship_with_a_held_out_set():
    import json

    from gradacc.training.sources.builtin_data import PAIRS_FILE

    data = json.loads(PAIRS_FILE.read_text(encoding="utf-8"))
    assert len(data["train"]) >= 2000 and len(data["eval"]) >= 200
    assert PAIRS_FILE.stat().st_size < 1_000_000
    assert not {p["query"] for p in data["train"]} & {p["query"] for p in data["eval"]}
