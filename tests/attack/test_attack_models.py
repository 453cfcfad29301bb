"""Hostile or broken models through the CLI and the app: a hub id while offline (even when name lookups hang),
a folder that is not a model, custom code, a pickle-only checkpoint (with a payload that must never run), a
path outside GRADACC_MODEL_DIRS (directly or through a symlink), a classifier with the wrong label count.

The loaders' own refusals are tested in test_sources.py; here each must reach a person as one ``error:`` line
(exit 2) or as the run's status in the app, with the page still usable; a hub id offline is refused before
anything loads and, with HF_HUB_OFFLINE, without a single name lookup.
"""

import json
import pickle
import socket
import threading

import pytest
from app_support import alerts, error_after, open_app, run_until
from attack_support import TINY, TINY_ARGS, assert_one_error_line, cli

RUN_TIMEOUT_S = 120
OTHER_MODEL = "other: hub id or local folder"


class Payload:
    """Unpickling this writes a file: proof that a checkpoint's code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """Every kind of model folder, built once: models/ is the allowed folder, outside/ is not."""
    from gradacc.training.sources.models import tiny_bert, tiny_bert_tokenizer

    root = tmp_path_factory.mktemp("model-attacks")
    allowed, outside = root / "models", root / "outside"
    allowed.mkdir()
    outside.mkdir()
    markers = root / "markers"
    markers.mkdir()

    def save(folder, num_labels=2):
        tiny_bert(num_labels, {i: str(i) for i in range(num_labels)}, seed=0, dropout=0.0).save_pretrained(str(folder))
        tiny_bert_tokenizer().save_pretrained(str(folder))
        return folder

    (allowed / "not-a-model").mkdir()
    (allowed / "not-a-model" / "notes.txt").write_text("just a folder\n")

    custom = save(allowed / "custom-code")
    config = json.loads((custom / "config.json").read_text())
    config["auto_map"] = {"AutoModelForSequenceClassification": "modeling_evil.EvilModel"}
    (custom / "config.json").write_text(json.dumps(config))
    (custom / "modeling_evil.py").write_text(f"open({str(markers / 'custom-code-ran')!r}, 'w')\n")

    pickled = save(allowed / "pickle-only")
    for weights in pickled.glob("*.safetensors"):
        weights.unlink()
    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(markers / "pickle-ran")))

    save(allowed / "three-labels", num_labels=3)
    save(outside / "elsewhere")
    (allowed / "escape").symlink_to(outside / "elsewhere", target_is_directory=True)
    save(allowed / "good")
    return {"allowed": allowed, "outside": outside, "markers": markers}


@pytest.fixture
def model_dirs(model_folders, monkeypatch):
    monkeypatch.setenv("GRADACC_MODEL_DIRS", str(model_folders["allowed"]))
    yield model_folders
    assert not list(model_folders["markers"].iterdir()), "code from a model folder ran"


# (model path relative to the fixture, what the refusal says)
REFUSALS = [
    ("allowed/not-a-model", "'not-a-model' is not a model folder: it has no config.json"),
    ("allowed/custom-code", "'custom-code' needs custom code to load; gradacc never runs remote or custom code."),
    ("allowed/pickle-only", "'pickle-only' has only pickle weights (pytorch_model.bin); gradacc loads safetensors only"),
    ("allowed/three-labels", "The model's classifier has 3 labels but the data has 2"),
]
# Confinement is for the app's visitors (and `train --confine`, which the app's launcher uses).
OUTSIDE = [
    ("outside/elsewhere", "is outside the allowed folders"),
    ("allowed/escape", "is outside the allowed folders"),  # a symlink is followed before the check
]


def model_path(folders, relative):
    where, name = relative.split("/")
    return str(folders[where] / name)


# ---- the command line ----------------------------------------------------------------------------

@pytest.mark.parametrize("relative,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_cli_refuses_a_bad_model_folder_with_one_error_line(relative, message, model_dirs, capsys, one_torch_thread):
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--model", model_path(model_dirs, relative))
    assert_one_error_line(code, out, err, 2, message)
    assert out == "", "refused while preparing: no run started, no progress line"


@pytest.mark.parametrize("relative,message", OUTSIDE, ids=[r[0] for r in OUTSIDE])
def test_cli_trusts_its_user_with_any_folder_but_confines_when_asked(relative, message, model_dirs, capsys,
                                                                     one_torch_thread):
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--model", model_path(model_dirs, relative))
    assert code == 0, err
    assert "completed after" in out
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--confine", "--model", model_path(model_dirs, relative))
    assert_one_error_line(code, out, err, 2, "--model '", message)


def test_cli_refuses_a_model_name_that_is_neither_a_path_nor_a_hub_id_at_once(capsys, network_attempts):
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--model", "!!garbage//model??")
    assert_one_error_line(code, out, err, 2, "--model must be a built-in model, a local folder or a hub id like "
                                             "org/name; got '!!garbage//model??', which is not a valid hub id")
    assert out == "" and network_attempts == [], "refused before any run or hub probe"


def test_cli_trains_a_good_model_folder(model_dirs, capsys, one_torch_thread):
    """The control: the same loader accepts a proper safetensors folder inside the allowed folder."""
    code, out, err = cli(capsys, "train", *TINY_ARGS, "-m", "8", "-k", "2", "--model", str(model_dirs["allowed"] / "good"))
    assert code == 0, err
    assert "completed after 3 optimizer steps" in out


@pytest.fixture
def network_attempts(monkeypatch):
    """Every name lookup this process tries from now on (each refused): an offline refusal must try none."""
    attempts = []

    def refuse(host, *args, **kwargs):
        attempts.append(host)
        raise socket.gaierror("this test allows no name lookup")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)  # socket.create_connection looks names up through it
    return attempts


def test_cli_refuses_a_hub_id_offline_without_trying_the_network(capsys, monkeypatch, network_attempts):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--model", "someone/no-such-model")
    assert_one_error_line(code, out, err, 2,
                          "--model 'someone/no-such-model' is a hub id, and the Hugging Face Hub cannot be reached")
    assert out == ""
    assert network_attempts == []


def test_cli_refuses_a_hub_id_when_hub_ids_are_disabled(capsys, monkeypatch):
    monkeypatch.setenv("GRADACC_ALLOW_HUB", "0")
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--model", "someone/no-such-model")
    assert_one_error_line(code, out, err, 2, "--model must be a built-in model", "hub ids are disabled on this deployment")


@pytest.fixture
def hanging_name_lookup(monkeypatch):
    """A network whose DNS never answers (captive Wi-Fi): getaddrinfo blocks until the test ends.
    Yields how many lookups began and how many have returned."""
    release, lookups = threading.Event(), {"began": 0, "returned": 0}

    def hang(*args, **kwargs):
        lookups["began"] += 1
        release.wait(60)
        lookups["returned"] += 1
        raise socket.gaierror("name lookup gave up")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "getaddrinfo", hang)
    yield lookups
    release.set()


def test_a_hub_id_is_refused_while_the_name_lookup_still_hangs(hanging_name_lookup, capsys):
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--model", "someone/no-such-model")
    assert_one_error_line(code, out, err, 2, "the Hugging Face Hub cannot be reached")
    # The probe asked for the hub's address and gave up on it (after hub.CONNECT_TIMEOUT_S) without an answer.
    assert hanging_name_lookup == {"began": 1, "returned": 0}


# ---- the app -------------------------------------------------------------------------------------

def start_with_model(at, name):
    at.selectbox(key="form.train.model_choice").set_value(OTHER_MODEL).run()
    at.text_input(key="form.train.model_custom").set_value(name).run()
    for field, value in TINY.items():
        at.number_input(key=f"form.train.{field}").set_value(value)
    at.run()
    assert not at.button(key="start").disabled, alerts(at)
    at.button(key="start").click().run()
    return run_until(at, lambda at: bool(at.error), RUN_TIMEOUT_S, "the run to fail")


# What the form can tell as the visitor types; a head with the wrong label count shows once the data is loaded.
FORM_REFUSALS = [r for r in REFUSALS if r[0] != "allowed/three-labels"] + OUTSIDE + [
    ("allowed/missing", "No model folder at"),
]


@pytest.mark.parametrize("relative,message", FORM_REFUSALS, ids=[r[0] for r in FORM_REFUSALS])
def test_app_refuses_a_bad_model_path_on_the_form_as_it_is_typed(relative, message, model_dirs, app_home):
    at = open_app()
    at.selectbox(key="form.train.model_choice").set_value(OTHER_MODEL).run()
    at.text_input(key="form.train.model_custom").set_value(model_path(model_dirs, relative)).run()
    shown = error_after(at, "form.train.model_custom")
    assert shown is not None and message in shown, alerts(at)
    assert at.button(key="start").disabled and not at.exception


@pytest.mark.parametrize("name,message", [
    ("!!garbage//model??", "Model must be a built-in model, a local folder or a hub id like org/name; got "
                           "'!!garbage//model??', which is not a valid hub id"),
    ("../../etc", "Model '../../etc' is outside the allowed folders"),
])
def test_app_refuses_a_name_that_is_no_model_before_start(name, message, app_home):
    at = open_app()
    at.selectbox(key="form.train.model_choice").set_value(OTHER_MODEL).run()
    at.text_input(key="form.train.model_custom").set_value(name).run()
    assert message in (error_after(at, "form.train.model_custom") or ""), alerts(at)
    assert at.button(key="start").disabled


def test_app_shows_why_a_model_folder_was_refused_at_start_and_stays_usable(model_dirs, app_home, one_torch_thread):
    at = start_with_model(open_app(), model_path(model_dirs, "allowed/three-labels"))
    message = "The model's classifier has 3 labels but the data has 2"
    status = at.error[0].value
    assert status.startswith("Failed: ") and message in status, status
    assert not at.exception
    assert not at.button(key="start").disabled, "the visitor can fix the model and start again"


def test_app_refuses_a_hub_id_offline_before_anything_loads(app_home, network_attempts, one_torch_thread):
    at = start_with_model(open_app(), "someone/no-such-model")
    assert "Model 'someone/no-such-model' is a hub id, and the Hugging Face Hub cannot be reached" in at.error[0].value
    from gradacc.app import server

    run = server.run_manager().get(at.session_state["run_id"])
    assert (run.status, run.started, run.ended["steps"]) == ("failed", None, 0)  # refused while preparing
    assert network_attempts == []  # HF_HUB_OFFLINE=1: not even a name lookup
    assert not at.button(key="start").disabled
