"""The causal-lm task: tiny-gpt, its tokenizer, builtin-text, weights by predicted tokens, three equal curves."""

import json

import pytest

from gradacc.choices import CAUSAL_LM, CLASSIFICATION
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.events import Recorder
from gradacc.training import windows
from gradacc.training.run.engine import train
from gradacc.training.sources import builtin_data, models
from gradacc.training.sources.data import item_count

LM = dict(model="tiny-gpt", dataset="builtin-text", dropout=0.0, epochs=1, train_samples=44, eval_samples=16,
          micro_batch_size=4, grad_accum_steps=4, max_seq_length=32)


def test_tokenizer_is_byte_level_bpe_cached_and_round_trips():
    tokenizer = models.tiny_gpt_tokenizer()
    assert tokenizer is models.tiny_gpt_tokenizer()  # built once, then cached
    text = "Honestly the café was great, 5 stars!"  # bytes outside the corpus still encode (byte-level)
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == ids[-1] == tokenizer.eos_token_id  # <|endoftext|> text <|endoftext|>
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.pad_token_id != tokenizer.eos_token_id  # padding is never confused with a real end


def test_model_is_a_causal_lm_and_the_same_for_a_seed():
    import torch

    first, again, other = models.tiny_gpt(3, 0.0), models.tiny_gpt(3, 0.0), models.tiny_gpt(4, 0.0)
    assert type(first).__name__ == "GPT2LMHeadModel"
    assert 100_000 < sum(p.numel() for p in first.parameters()) < 400_000
    same = all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))
    assert same and not all(torch.equal(a, b) for a, b in zip(first.parameters(), other.parameters()))


def test_builtin_text_is_deterministic_and_very_uneven():
    assert builtin_data.make_text(50, 7) == builtin_data.make_text(50, 7)
    assert builtin_data.make_text(50, 7) != builtin_data.make_text(50, 8)
    tokenizer = models.tiny_gpt_tokenizer()
    lengths = [len(ids) for ids in tokenizer(builtin_data.make_text(400, 1))["input_ids"]]
    assert min(lengths) <= 6  # "never again." and the like
    assert sum(n > 64 for n in lengths) >= 20  # a tail past the default sequence length
    assert max(lengths) / min(lengths) > 20


def test_task_is_inferred_from_the_model(tmp_path):
    assert models.infer_task(RunConfig(model="tiny-gpt")) == CAUSAL_LM
    assert models.infer_task(RunConfig(model="tiny-bert")) == CLASSIFICATION
    assert models.infer_task(RunConfig(model="tiny-bert", task=CAUSAL_LM)) == CAUSAL_LM
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert models.infer_task(RunConfig(model=str(folder))) == CAUSAL_LM
    with pytest.raises(GradaccError, match="Task"):
        RunConfig(task="translation").check()


def test_labels_are_the_tokens_and_counts_are_of_predicted_tokens_with_a_short_last_window():
    from gradacc.training.run.job import prepare
    import threading

    job = prepare(RunConfig(**LM).check(), lambda e: None, threading.Event())
    assert job.config.task == CAUSAL_LM and job.task.next_token
    example = job.train_examples[0]
    # Position 0 predicts nothing; every other token is predicted from the ones before it.
    assert example["labels"][0] == -100 and example["labels"][1:] == example["input_ids"][1:]
    assert item_count(example) == len(example["input_ids"]) - 1
    # 44 examples, m=4: 11 micro-batches, windows of k=4: 4 + 4 + 3 (the short last one), 3 optimizer steps.
    assert len(job.micro_batches) == 11 and job.total_steps == 3
    counts = job.batch_items
    assert counts == [sum(len(job.train_examples[i]["input_ids"]) - 1 for i in batch) for batch in job.micro_batches]
    assert job.window_items == [sum(counts[0:4])] * 4 + [sum(counts[4:8])] * 4 + [sum(counts[8:11])] * 3
    assert len(set(counts)) > 5  # uneven: micro-batches hold very different numbers of predicted tokens
    exact = [windows.loss_weight("exact", b, w, 4) for b, w in zip(counts, job.window_items)]
    naive = [windows.loss_weight("naive", b, w, 4) for b, w in zip(counts, job.window_items)]
    assert sum(exact[8:11]) == pytest.approx(1.0) and sum(naive[8:11]) == pytest.approx(0.75)
    assert exact[0] != pytest.approx(0.25) and naive[0] == 0.25


def test_causal_lm_refuses_mismatches():
    ended = train(RunConfig(**{**LM, "task": "classification"}))
    assert ended["status"] == "failed" and ended["field"] in ("dataset", "task")
    ended = train(RunConfig(**{**LM, "model": "tiny-bert", "task": "causal-lm"}))
    assert ended["status"] == "failed" and ended["field"] == "model" and "classifier" in ended["reason"]


@pytest.mark.usefixtures("one_torch_thread")
def test_three_backends_give_the_same_lm_curve_and_lm_eval():
    curves, evals = {}, {}
    for backend in ("pytorch", "accelerate", "trainer"):
        recorder = Recorder()
        ended = train(RunConfig(**LM, backend=backend), recorder)
        assert ended["status"] == "completed", ended
        assert recorder.of("run_started")[0]["config"]["task"] == CAUSAL_LM
        curves[backend] = [step["loss"] for step in recorder.of("step")]
        evals[backend] = recorder.of("eval")[-1]
    assert len(curves["pytorch"]) == 3
    for backend in ("accelerate", "trainer"):
        for ours, theirs in zip(curves["pytorch"], curves[backend], strict=True):
            assert abs(ours - theirs) <= 1e-4 * abs(ours)
        assert evals[backend]["eval_loss"] == pytest.approx(evals["pytorch"]["eval_loss"], rel=1e-4)
        assert evals[backend]["eval_next_token_accuracy"] == pytest.approx(
            evals["pytorch"]["eval_next_token_accuracy"], abs=1e-3)
    final = evals["pytorch"]
    assert final["eval_f1"] is None and 0 <= final["eval_next_token_accuracy"] <= 1
    import math
    assert final["eval_perplexity"] == pytest.approx(math.exp(final["eval_loss"]))
