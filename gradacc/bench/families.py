"""Transformers issue #47688 by model family: Trainer's library default, and gradacc's check, on models it was
never shown.

For each family a tiny random model is built in memory from its config class (no download), with that
family's own default dropout settings, and written with ``save_pretrained`` (its tokenizer too) into a
temporary folder: the path a person takes with their own model. ``gradacc check`` then runs on it with the
Trainer backend, one window of m·k examples (equal windows), and reports three relative errors of the
accumulated gradient against the full-batch gradient: ``exact`` and ``naive`` (gradacc's compute_loss_func)
and ``library_default`` (no compute_loss_func: what Trainer does on its own).

In transformers 5 Trainer skips its own ÷k for a model whose forward takes ``**kwargs`` and passes it
``num_items_in_batch``; a head that ignores it (a classifier) gets k× the gradient, a causal LM whose loss
uses it gets the right one; a forward without ``**kwargs`` gets Trainer's ÷k. The table says which is which.

Encoders and decoder-only classifiers learn builtin-sentiment through tiny-bert's WordPiece tokenizer; causal
LMs learn builtin-text through tiny-gpt's byte-level BPE; each model's vocabulary is its tokenizer's.
A family whose check is refused (the model is not deterministic at dropout 0) or fails says why in its row.

The audit column (``families_audit``): gradacc.audit on the same saved model with its dropout on, in a Trainer with
the fix gradacc names and in the Accelerate recipe, where accumulation is right: "exact" both ways, or a false alarm.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import plotly.graph_objects as go
import torch
import transformers

from gradacc import paths
from gradacc.analysis import equivalence
from gradacc.analysis.equivalence import EXACT_LIMIT, library_default_verdict
from gradacc.bench import report
from gradacc.bench import families_moe
from gradacc.bench.families_audit import SavedFamily, audit_family
from gradacc.config import RunConfig
from gradacc.errors import GradaccError, one_line
from gradacc.training.run.engine import quiet_libraries
from gradacc.training.sources import models

ENCODER, DECODER_CLASSIFIER, CAUSAL_LM = "encoder", "decoder-only classifier", "causal LM"
# One tiny shape in each family's own words: 2 layers, width 32, 2 heads, feed-forward 64, 128 positions.
_BERT_LIKE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=128)
_LLAMA_LIKE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                   intermediate_size=64, max_position_embeddings=128)
_GPT2 = dict(n_embd=32, n_layer=2, n_head=2, n_inner=64, n_positions=128)
# name: (kind, config class, model class, shape). Each family's dropout settings are left at its defaults.
FAMILIES = {
    "bert": (ENCODER, "BertConfig", "BertForSequenceClassification", _BERT_LIKE),
    "roberta": (ENCODER, "RobertaConfig", "RobertaForSequenceClassification", _BERT_LIKE),
    "distilbert": (ENCODER, "DistilBertConfig", "DistilBertForSequenceClassification",
                   dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128)),
    "electra": (ENCODER, "ElectraConfig", "ElectraForSequenceClassification", dict(_BERT_LIKE, embedding_size=32)),
    "deberta-v2": (ENCODER, "DebertaV2Config", "DebertaV2ForSequenceClassification", _BERT_LIKE),
    "mpnet": (ENCODER, "MPNetConfig", "MPNetForSequenceClassification", _BERT_LIKE),
    "gpt2-classifier": (DECODER_CLASSIFIER, "GPT2Config", "GPT2ForSequenceClassification", _GPT2),
    "llama-classifier": (DECODER_CLASSIFIER, "LlamaConfig", "LlamaForSequenceClassification", _LLAMA_LIKE),
    "qwen2-classifier": (DECODER_CLASSIFIER, "Qwen2Config", "Qwen2ForSequenceClassification", _LLAMA_LIKE),
    "gpt2": (CAUSAL_LM, "GPT2Config", "GPT2LMHeadModel", _GPT2),
    "llama": (CAUSAL_LM, "LlamaConfig", "LlamaForCausalLM", _LLAMA_LIKE),
    "opt": (CAUSAL_LM, "OPTConfig", "OPTForCausalLM",
            dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64, word_embed_proj_dim=32,
                 max_position_embeddings=128)),
    "gpt-neox": (CAUSAL_LM, "GPTNeoXConfig", "GPTNeoXForCausalLM", _BERT_LIKE),
    "phi": (CAUSAL_LM, "PhiConfig", "PhiForCausalLM", _LLAMA_LIKE),
}
# --quick (the tests): one family of each kind, at the full run's settings, so its rows can be compared.
QUICK_FAMILIES = ("distilbert", "gpt2-classifier", "gpt2")
SETTINGS = dict(backend="trainer", micro_batch_size=2, grad_accum_steps=4, max_seq_length=32, seed=42)
# The Equivalence page's table ("Trainer's default, by model family"): a full run's rows, written by
# `python -m gradacc.bench.families bench-out/families.json` (tests rerun some families and compare).
PAGE_TABLE = Path(__file__).resolve().parents[1] / "app" / "trainer_default_by_family.json"


def build(family: str, folder: Path) -> None:
    """A tiny random model of ``family`` and its tokenizer, written into ``folder`` with save_pretrained."""
    quiet_libraries()  # no progress bars from save_pretrained
    kind, config_class, model_class, shape = FAMILIES[family]
    causal = kind == CAUSAL_LM
    tokenizer = models.tiny_gpt_tokenizer() if causal else models.tiny_bert_tokenizer()
    # Special tokens inside the tokenizer's vocabulary (not the family's defaults, e.g. GPT-2's 50256).
    special = dict(pad_token_id=tokenizer.pad_token_id,
                   bos_token_id=tokenizer.bos_token_id if causal else tokenizer.cls_token_id,
                   eos_token_id=tokenizer.eos_token_id if causal else tokenizer.sep_token_id)
    labels = {} if causal else dict(num_labels=2, id2label={0: "negative", 1: "positive"},
                                    label2id={"negative": 0, "positive": 1})
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), **special, **labels, **shape)
    torch.manual_seed(SETTINGS["seed"])
    getattr(transformers, model_class)(config).save_pretrained(str(folder))
    # Only what every family's forward takes (not all of them know token_type_ids).
    saved = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer,
                                                 model_input_names=["input_ids", "attention_mask"],
                                                 **{name: getattr(tokenizer, name) for name in
                                                    ("pad_token", "unk_token", "bos_token", "eos_token", "cls_token",
                                                     "sep_token", "mask_token") if getattr(tokenizer, name)})
    saved.save_pretrained(str(folder))


def check_family(family: str, home: Path) -> dict:
    """``gradacc check`` on the Trainer backend for one family: the row of the table."""
    kind = FAMILIES[family][0]
    row = {"family": family, "kind": kind, "model_class": FAMILIES[family][2]}
    folder = home / family
    try:
        build(family, folder)
        config = RunConfig(model=str(folder), **SETTINGS)
        result = equivalence.check(config, cases=("equal_windows",), confinement=paths.TRUST_USER)
    except GradaccError as error:
        return {**row, "refused": error.message}
    except Exception as error:  # noqa: BLE001 - the row says why this family could not be checked
        return {**row, "failed": one_line(error)}
    window = result["cases"]["equal_windows"]
    row.update({name: window[f"{name}_rel_error"] for name in ("exact", "naive", "library_default")})
    kind, config_class, model_class, _ = FAMILIES[family]
    row.update(audit_family(SavedFamily(folder, config_class, model_class, causal=kind == CAUSAL_LM), SETTINGS))
    return row


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    families = list(QUICK_FAMILIES if quick else FAMILIES)
    result = report.envelope("families", quick, threads, {
        **SETTINGS, "families": families, "transformers": transformers.__version__, "case": "equal_windows",
        "compared": "accumulated gradient before the first optimizer step vs the full-batch gradient of the window"})
    home = Path(tempfile.mkdtemp(prefix="gradacc-families-"))
    rows = []
    try:
        for family in families:
            report.progress(f"{family}: check on the Trainer backend, m={SETTINGS['micro_batch_size']}, "
                            f"k={SETTINGS['grad_accum_steps']}")
            rows.append(check_family(family, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    result["rows"] = rows
    report.progress("moe: a tiny Mixtral's router loss, stock Trainer and the fix"
                    + ("" if quick else f", and on {families_moe.PROCESSES} processes (torchrun, gloo)"))
    result["moe"] = families_moe.moe_rows(quick, threads)
    result["notes"] = moe_notes(result["moe"])
    checked = [r for r in rows if "exact" in r]
    worst = max((r["exact"] for r in checked), default=float("nan"))
    result["goals"] = {
        "exact_on_every_family": report.goal(
            worst, f"exact ≤ {EXACT_LIMIT:g} on every family", len(checked) == len(rows) and worst <= EXACT_LIMIT),
        "no_false_verdicts": report.goal(
            sum(1 for r in checked if r["exact"] > EXACT_LIMIT), "0 families where check calls exact wrong",
            all(r["exact"] <= EXACT_LIMIT for r in checked)),
        "no_false_alarm_of_the_audit_with_dropout_on": report.goal(
            sum(1 for r in checked for way in AUDIT_WAYS if r.get(way) != "exact"),
            "0 verdicts other than exact (Trainer with the fix, the Accelerate recipe)",
            all(r.get(way) == "exact" for r in checked for way in AUDIT_WAYS)),
        "moe_router_term_named_and_its_fix_exact": report.goal(
            sum(1 for r in result["moe"]["rows"] if not moe_row_right(r, SETTINGS["grad_accum_steps"])),
            "0 MoE rows where the audit misses the router term's k (k·P) or the fix is not exact",
            all(moe_row_right(r, SETTINGS["grad_accum_steps"]) for r in result["moe"]["rows"])),
    }
    return report.finish(result, started)


AUDIT_WAYS = ("audit_trainer_fixed", "audit_accelerate_recipe")


def moe_expected_scale(row: dict, k: int) -> float:
    """The router term's scale a stock Trainer gives: k, and k·P with average_tokens_across_devices (#48690)."""
    if row["way"] != "stock Trainer":
        return 1.0
    return k * (row["processes"] if row["average_tokens_across_devices"] else 1)


def moe_row_right(row: dict, k: int) -> bool:
    """The router term judged as the row's settings make it. Without average_tokens_across_devices on P processes
    each process divides its main loss by its own tokens: the main loss's own verdict leads there, the router
    term's is in its check."""
    if row.get("router_scale") is None:
        return False
    expected = moe_expected_scale(row, k)
    verdict = "exact" if expected == 1 else "router_loss_k_times_too_large"
    # where the main loss is off, its error reaches the router weights: the router term's scale is looser there
    tolerance = 1e-3 if abs(row["main_scale"] - 1) <= 1e-3 else 1e-2
    return row["router_verdict"] == verdict and abs(row["router_scale"] - expected) <= tolerance * expected


def moe_notes(moe: dict) -> list[str]:
    """The MoE rows as lines under the table (their columns are not the families')."""
    notes = []
    for r in moe["rows"]:
        where = f"moe, {r['way']}, {r.get('processes', '-')} process(es)" + (
            f", average_tokens_across_devices={r['average_tokens_across_devices']}" if r.get("processes", 1) > 1
            else "")
        if r.get("router_scale") is None:
            notes.append(f"{where}: {r.get('failed', 'no router term judged')[-300:]}")
            continue
        notes.append(f"{where}: router term {r['router_scale']:.4g}× the micro-batches' mean, main "
                     f"{r['main_scale']:.4g}×; verdict {r['verdict']} (router term: {r['router_verdict']}); audit {r['audit_s']:.2f} s, "
                     f"window {r['window_s']:.2f} s")
    gap = moe["window_gap"]
    notes.append(f"moe, the window's router loss {gap['window_loss']:.4g} vs its micro-batches' mean "
                 f"{gap['micro_batch_mean_loss']:.4g}; their gradients' cosine {gap['cosine_all_weights']:.3f} (router "
                 f"weights {gap['cosine_router_weights']:.3f})")
    return notes


def audit_cell(row: dict) -> str:
    """The audit column: its verdict in a Trainer with the fix / in the Accelerate recipe, dropout on."""
    return " / ".join(str(row.get(way, "-")) for way in AUDIT_WAYS)


def verdict(row: dict, k: int) -> str:
    """Trainer's library default on this row, in words; a family not checked: why."""
    if "exact" not in row:
        return row.get("refused") or row.get("failed", "")
    return library_default_verdict(row["library_default"], k)


def page_table(result: dict) -> dict:
    """What the Equivalence page shows of a full run: settings, transformers version, one row per family."""
    keep = ("family", "kind", "model_class", "exact", "naive", "library_default", "refused", "failed", *AUDIT_WAYS)
    return {"made_by": "python -m gradacc bench families", "settings": result["settings"],
            "rows": [{key: row[key] for key in keep if key in row} for row in result["rows"]]}


def figure(result: dict):
    rows = [r for r in result["rows"] if "exact" in r]
    figure = go.Figure()
    for name, colour in (("exact", "#2ca02c"), ("naive", "#d62728"), ("library_default", "#7f7f7f")):
        figure.add_trace(go.Bar(x=[r["family"] for r in rows], y=[max(r[name], 1e-12) for r in rows], name=name,
                                marker_color=colour, customdata=[r[name] for r in rows],
                                hovertemplate="%{x}: %{customdata:.2e}<extra>" + name + "</extra>"))
    settings = result["settings"]
    figure.update_layout(
        title=f"Trainer (transformers {settings['transformers']}), m={settings['micro_batch_size']}, "
              f"k={settings['grad_accum_steps']}: relative error of the accumulated gradient",
        barmode="group", yaxis=dict(title="‖g_acc − g_full‖ / ‖g_full‖ (log)", type="log"),
        legend=dict(orientation="h", y=-0.25))
    return figure


def table(result: dict) -> tuple[list[str], list[list]]:
    k = result["settings"]["grad_accum_steps"]
    headers = ["family", "kind", "exact", "naive", "library default", "Trainer's default",
               "audit, dropout on (Trainer + fix / Accelerate recipe)"]
    rows = []
    for r in result["rows"]:
        if "exact" in r:
            rows.append([r["family"], r["kind"], f"{r['exact']:.2e}", f"{r['naive']:.2e}",
                         f"{r['library_default']:.2e}", verdict(r, k), audit_cell(r)])
        else:
            rows.append([r["family"], r["kind"], "-", "-", "-", verdict(r, k), "-"])
    return headers, rows


if __name__ == "__main__":  # python -m gradacc.bench.families bench-out/families.json: refresh the page's table
    full = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    if full["quick"] or len(full["rows"]) != len(FAMILIES):
        sys.exit("error: give the JSON of a full run (python -m gradacc bench families), not --quick")
    PAGE_TABLE.write_text(json.dumps(page_table(full), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {PAGE_TABLE}")
