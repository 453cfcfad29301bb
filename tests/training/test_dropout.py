"""The run's dropout reaches every family's config attributes and Dropout modules (folders, classifiers and causal
LMs alike), and what cannot be set is found: the Train run says so, the equivalence check refuses."""

import threading

import pytest
from attack_support import add_noise, hide_dropout

from gradacc import paths
from gradacc.bench import families
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.training.sources import dropout
from gradacc.training import tasks

RUN_DROPOUT = 0.25  # no family's default: a setting that was not applied shows


def _dropout_settings(model):
    """Every dropout the loaded model holds: config attributes that name one, and torch Dropout modules' p."""
    from torch.nn.modules.dropout import _DropoutNd

    attributes = {name: value for name, value in vars(model.config).items()
                  if dropout._names_dropout(name) and dropout._is_probability(value)}
    modules = [module.p for module in model.modules() if isinstance(module, _DropoutNd)]
    return attributes, modules


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory):
    home = tmp_path_factory.mktemp("families")
    for family in families.FAMILIES:
        families.build(family, home / family)
    return home


@pytest.mark.parametrize("family", list(families.FAMILIES))
def test_the_runs_dropout_is_set_on_every_attribute_and_module_of_a_folder_model(family, family_folders):
    kind = families.FAMILIES[family][0]
    config = RunConfig(model=str(family_folders / family), dropout=RUN_DROPOUT,
                       task="causal-lm" if kind == families.CAUSAL_LM else "classification").check()
    loaded = tasks.load_model(config, 2, ["negative", "positive"], confinement=paths.TRUST_USER)
    attributes, modules = _dropout_settings(loaded.model)
    assert attributes, "every family names at least one dropout in its config"
    assert attributes == {name: RUN_DROPOUT for name in attributes}
    assert modules == [RUN_DROPOUT] * len(modules)


def test_nested_sub_configs_get_the_dropout_too():
    from transformers import AutoConfig

    composite = AutoConfig.for_model("llava")
    names = dropout.set_in_config(composite, 0.0)
    assert "text_config.attention_dropout" in names
    assert composite.text_config.attention_dropout == 0.0


def _prepared(config):
    from gradacc.training.run.job import prepare

    return prepare(config.check(), lambda event: None, threading.Event())


SMALL = dict(micro_batch_size=2, grad_accum_steps=2, train_samples=8, eval_samples=8, max_seq_length=16)


def test_the_check_refuses_a_model_random_at_dropout_0_instead_of_a_false_verdict(monkeypatch, one_torch_thread):
    from gradacc.analysis.equivalence import check

    add_noise(monkeypatch)
    with pytest.raises(GradaccError) as refused:
        check(RunConfig(backend="pytorch", **SMALL), cases=("equal_windows",))
    message = refused.value.message
    assert "\n" not in message
    assert message.startswith("Model tiny-bert: the model's output is not deterministic with dropout 0 (max difference ")
    assert message.endswith("the gradient comparison would be meaningless.")


def test_a_run_says_when_its_dropout_could_not_be_applied(monkeypatch, one_torch_thread):
    deterministic = _prepared(RunConfig(dropout=0.0, **SMALL))
    assert not deterministic.variation.varies and not any("could not be applied" in n for n in deterministic.notes)
    with_dropout = _prepared(RunConfig(dropout=0.1, **SMALL))
    assert with_dropout.variation.varies and not any("could not be applied" in n for n in with_dropout.notes)

    add_noise(monkeypatch)  # random at dropout 0
    noisy = _prepared(RunConfig(dropout=0.0, **SMALL))
    assert any(n.startswith("Dropout 0 could not be applied to model tiny-bert: its output still differs") for n in
               noisy.notes)

    monkeypatch.undo()
    hide_dropout(monkeypatch)
    inert = _prepared(RunConfig(dropout=0.1, **SMALL))
    assert "Dropout 0.1 could not be applied to model tiny-bert: its output is the same on every pass in training " \
           "mode (it has no dropout gradacc can set)." in inert.notes


def test_the_test_leaves_the_random_stream_and_the_mode_as_they_were(one_torch_thread):
    import torch

    job = _prepared(RunConfig(dropout=0.1, **SMALL))
    job.model.eval()
    batch = job.collate(job.train_examples[:2])
    state = torch.random.get_rng_state()
    found = dropout.variation(job.model, batch, job.device, job.precision.autocast)
    assert found.varies
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not job.model.training


def test_the_cli_check_gives_the_refusal_in_one_line(monkeypatch, capsys, one_torch_thread):
    from gradacc.cli import main
    from gradacc.cli.options import EXIT_BAD_INPUT

    add_noise(monkeypatch)
    code = main(["check", "--backend", "pytorch", "-m", "2", "-k", "2", "--max-seq-length", "16"])
    captured = capsys.readouterr()
    assert code == EXIT_BAD_INPUT and captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("error: --model tiny-bert: the model's output is not deterministic with dropout 0")


def test_the_cli_says_when_the_dropout_could_not_be_applied(monkeypatch, capsys, one_torch_thread):
    from gradacc.cli import main
    from gradacc.cli.options import EXIT_OK

    hide_dropout(monkeypatch)
    code = main(["train", "--max-steps", "1", "--train-samples", "8", "--eval-samples", "8", "-m", "4", "-k", "1",
                 "--dropout", "0.1"])
    assert code == EXIT_OK
    assert "note: Dropout 0.1 could not be applied to model tiny-bert: its output is the same on every pass" in \
        capsys.readouterr().out
