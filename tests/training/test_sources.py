"""Every data and model source, from files and folders the tests write themselves (never a download)."""

import json
import os

import pytest
from support import load_script

from gradacc.config import RunConfig
from gradacc.training.sources.data import load_text_data
from gradacc.training.run.engine import train
from gradacc.errors import GradaccError
from gradacc.events import Recorder
from gradacc.training.tasks import load_model as load

SMALL = dict(train_samples=None, eval_samples=None, epochs=1, micro_batch_size=4, grad_accum_steps=2,
             max_seq_length=32)


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setenv("GRADACC_MODEL_DIRS", str(folder))
    return folder


def rows(n=40):
    return [(f"the movie was {'great' if i % 2 else 'awful'} number {i}", "pos" if i % 2 else "neg") for i in range(n)]


def test_csv_with_detected_columns_and_string_labels(data_dir):
    path = data_dir / "reviews.csv"
    path.write_text("review,sentiment\n" + "\n".join(f'"{t}",{l}' for t, l in rows()), encoding="utf-8")
    data = load_text_data(RunConfig(dataset=str(path), **SMALL))
    assert data.label_names == ["neg", "pos"]
    assert len(data.train_texts) == 32 and len(data.eval_texts) == 8
    assert set(data.train_labels) == {0, 1}


def test_jsonl_with_named_columns_trains(data_dir):
    path = data_dir / "reviews.jsonl"
    path.write_text("\n".join(json.dumps({"body": t, "y": int(l == "pos")}) for t, l in rows()), encoding="utf-8")
    recorder = Recorder()
    ended = train(RunConfig(dataset=str(path), text_column="body", label_column="y", **SMALL), recorder)
    assert ended["status"] == "completed", ended["reason"]
    assert recorder.of("run_started")[0]["train_examples"] == 32
    assert len(recorder.of("eval")) == 1


def test_save_to_disk_folder_uses_its_validation_split(data_dir):
    import datasets

    texts, labels = zip(*rows())
    ints = [int(l == "pos") for l in labels]
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": texts[:30], "label": ints[:30]}, features=features),
        "validation": datasets.Dataset.from_dict({"text": texts[30:], "label": ints[30:]}, features=features)})
    splits.save_to_disk(str(data_dir / "saved"))
    data = load_text_data(RunConfig(dataset=str(data_dir / "saved"), **SMALL))
    assert (len(data.train_texts), len(data.eval_texts)) == (30, 10)
    assert data.label_names == ["negative", "positive"]


@pytest.mark.parametrize("content,message", [
    ("", "is empty"),
    ("text,label\nonly one,a\nsecond,a\n", "same label"),
    ("words,stars\nhello,1\n", "Could not find a text column"),
    ("text,label\n,1\n  ,0\n", "No row has both"),
])
def test_unusable_csv_is_refused_with_a_reason(data_dir, content, message):
    path = data_dir / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(GradaccError, match=message):
        load_text_data(RunConfig(dataset=str(path), **SMALL))


def test_non_utf8_file_is_refused(data_dir):
    path = data_dir / "latin.csv"
    path.write_bytes("text,label\ncaf\xe9 cr\xe8me,1\nna\xefve,0\n".encode("latin-1"))
    with pytest.raises(GradaccError, match="not UTF-8"):
        load_text_data(RunConfig(dataset=str(path), **SMALL))


def test_data_file_outside_allowed_folders_is_refused(data_dir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "x.csv"
    elsewhere.write_text("text,label\na,0\nb,1\n", encoding="utf-8")
    with pytest.raises(GradaccError, match="outside the allowed folders"):
        load_text_data(RunConfig(dataset=str(elsewhere), **SMALL))


def _saved_model(model_dir, name, num_labels=2, safe=True, architecture_head=True):
    from gradacc.training.sources.models import tiny_bert, tiny_bert_tokenizer

    model = tiny_bert(num_labels, {i: str(i) for i in range(num_labels)}, seed=0, dropout=0.0)
    folder = model_dir / name
    model.save_pretrained(str(folder), safe_serialization=safe)
    tiny_bert_tokenizer().save_pretrained(str(folder))
    return folder


def test_save_pretrained_folder_loads_and_trains(model_dir):
    folder = _saved_model(model_dir, "mine")
    recorder = Recorder()
    ended = train(RunConfig(model=str(folder), train_samples=32, eval_samples=8, epochs=1, micro_batch_size=8,
                            grad_accum_steps=2, max_seq_length=32), recorder)
    assert ended["status"] == "completed", ended["reason"]


def test_pickle_only_checkpoint_is_refused(model_dir):
    folder = _saved_model(model_dir, "pickled")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    import torch

    torch.save({"x": torch.zeros(1)}, folder / "pytorch_model.bin")
    with pytest.raises(GradaccError, match="only pickle weights"):
        load(RunConfig(model=str(folder)), 2, ["a", "b"])


def test_model_with_custom_code_is_refused(model_dir):
    folder = _saved_model(model_dir, "custom")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForSequenceClassification": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(GradaccError, match="never runs remote or custom code"):
        load(RunConfig(model=str(folder)), 2, ["a", "b"])


def test_classifier_with_other_label_count_is_refused(model_dir):
    folder = _saved_model(model_dir, "three", num_labels=3)
    with pytest.raises(GradaccError, match="3 labels but the data has 2"):
        load(RunConfig(model=str(folder)), 2, ["a", "b"])


def test_folder_that_is_not_a_model(model_dir):
    (model_dir / "empty").mkdir()
    with pytest.raises(GradaccError, match="no config.json"):
        load(RunConfig(model=str(model_dir / "empty")), 2, ["a", "b"])


def test_model_outside_allowed_folders_is_refused(model_dir, tmp_path_factory):
    with pytest.raises(GradaccError, match="outside the allowed folders"):
        load(RunConfig(model=str(tmp_path_factory.mktemp("other"))), 2, ["a", "b"])


def test_packaged_pretrained_minilm_loads_offline():
    loaded = load(RunConfig(model="all-MiniLM-L6-v2").check(), 2, ["neg", "pos"])  # load takes a resolved config
    assert loaded.model.config.num_labels == 2
    assert sum(p.numel() for p in loaded.model.parameters()) > 20_000_000
    assert loaded.tokenizer("hello world")["input_ids"][0] == loaded.tokenizer.cls_token_id


@pytest.mark.parametrize("offline_flag", ["1", None])
def test_hub_id_offline_is_refused_with_a_reason_before_loading(offline_flag, monkeypatch):
    """With HF_HUB_OFFLINE set no connection is even tried; without it, one short probe of the hub's host (that
    this network refuses) decides, and from_pretrained is never reached."""
    import socket
    from urllib.parse import urlparse

    import transformers

    if offline_flag is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    probes, real_connect = [], socket.create_connection

    def spy(address, *args, **kwargs):
        probes.append(address)
        return real_connect(address, *args, **kwargs)

    def never(*args, **kwargs):
        raise AssertionError("from_pretrained was called for an unreachable hub id")

    monkeypatch.setattr(socket, "create_connection", spy)
    for auto_class in (transformers.AutoConfig, transformers.AutoModelForSequenceClassification,
                       transformers.AutoTokenizer):
        monkeypatch.setattr(auto_class, "from_pretrained", never)
    with pytest.raises(GradaccError, match="'someone/some-model' is a hub id, and the Hugging Face Hub cannot be reached"):
        load(RunConfig(model="someone/some-model"), 2, ["a", "b"])
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    assert [address[0] for address in probes] == ([] if offline_flag else [host])


def test_tiny_bert_is_deterministic_for_a_seed():
    import torch

    first = load(RunConfig(seed=3).check(), 2, ["a", "b"]).model
    second = load(RunConfig(seed=3).check(), 2, ["a", "b"]).model
    other = load(RunConfig(seed=4).check(), 2, ["a", "b"]).model
    pairs = zip(first.state_dict().values(), second.state_dict().values())
    assert all(torch.equal(a, b) for a, b in pairs)
    assert not torch.equal(first.classifier.weight, other.classifier.weight)


def test_a_models_init_is_its_seeds_while_another_thread_builds_models():
    """The app builds models on several threads (a demo's runs and the gradient checks beside them) and torch's
    generator is the process's: without process_state.guard(generator=True) in models.load, 4 of 30 builds here got
    another init."""
    import threading

    import torch

    def build(model: str, seed: int):
        return load(RunConfig(model=model, seed=seed, dropout=0.0).check(), 2, ["a", "b"]).model.state_dict()

    alone = build("bow-layernorm", 42)
    stop = threading.Event()

    def other_builds():
        while not stop.is_set():
            build("bow-batchnorm", 7)

    other = threading.Thread(target=other_builds, daemon=True)
    other.start()
    try:
        beside = [build("bow-layernorm", 42) for _ in range(30)]
    finally:
        stop.set()
        other.join()
    assert all(torch.equal(state[name], alone[name]) for state in beside for name in alone)


def test_tiny_bert_tokenizer_ships_and_its_recipe_still_trains_one_of_its_kind(tmp_path, monkeypatch):
    """tiny-bert's tokenizer loads from the package (every process gets the same vocabulary, so runs repeat);
    the recipe that made it, kept for when the corpus changes, still trains a tokenizer it could replace."""
    from gradacc.training.sources import builtin_data
    from gradacc.training.sources.models import TINY_BERT_TOKENIZER, _load_tokenizer, tiny_bert_tokenizer

    train_tiny_bert_tokenizer = load_script("train_tiny_bert_tokenizer").train_tiny_bert_tokenizer

    monkeypatch.setenv("GRADACC_HOME", str(tmp_path / "home"))
    shipped = tiny_bert_tokenizer()
    assert shipped.name_or_path == str(TINY_BERT_TOKENIZER)
    assert not (tmp_path / "home" / "models").exists()  # nothing trained or cached

    train_tiny_bert_tokenizer(tmp_path / "fresh")
    fresh = _load_tokenizer(tmp_path / "fresh")
    corpus = builtin_data.tokenizer_corpus()
    for tokenizer in (shipped, fresh):
        assert tokenizer.all_special_ids == shipped.all_special_ids  # [PAD] 0 … [MASK] 4, in the same places
        assert abs(len(tokenizer) - len(shipped)) <= 0.05 * len(shipped)
        encoded = tokenizer(corpus[:500])["input_ids"]
        assert all(ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id for ids in encoded)
        assert not any(tokenizer.unk_token_id in ids for ids in encoded)  # the corpus is fully covered
