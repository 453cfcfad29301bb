"""Plan a model from its config alone: the model you have, not one this machine can train.

The model is built on the meta device (no weights), so its parameters are counted exactly and a 70B config plans
in seconds. Activations come from the architecture itself: a scaled-down copy of the same config class (same layer
types, attention implementation and dtype; 1 to 3 layers, width 64 to 128, a vocabulary of 256 to 1,024) is trained
for one forward and backward at a dozen sizes on this machine's CPU, the peak bytes alive above its parameters and
gradients measured (``gradacc.training.memory.peak``) in each phase of the pass (``architecture.PHASES``), and a
linear model per phase fitted on the terms that scale with the architecture (``architecture.FEATURES``: tokens ×
width, × layers, × feed-forward width, eager attention's batch × sequence² × heads, the logits' tokens × vocabulary,
the weights autocast copies, the largest gradient made whole), with non-negative coefficients and relative errors.
The fits are evaluated at the full config; the largest phase is the peak.

Per lever setting (full fine-tune or LoRA on the attention's projections; fp32, bf16 autocast with fp32 master
weights, pure bf16; AdamW, SGD with momentum, Adafactor; gradient checkpointing off or on; on P ranks, replicated
with DDP or sharded with FSDP, its gradients synced per window or per micro-batch) the
peak of a micro-batch of m in a window of k ≥ 2 is

    weights + gradients + optimizer state + max(activations + logits and loss, the optimizer step's temporaries)
    + framework overhead (+ DDP's buckets or FSDP's sharding buffers on P > 1)

and m is the largest power of two dividing the per-rank batch that fits the budget. Framework overhead is an
assumption, not a measurement (this machine has no GPU): FRAMEWORK_OVERHEAD_BYTES.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

from gradacc import paths
from gradacc.choices import GRAD_SYNCS, PER_MICRO_BATCH, PER_WINDOW
from gradacc.errors import GradaccError
from gradacc.labels import field_label
from gradacc.units import MB, format_bytes

# torch, transformers and gradacc.training.memory.architecture (which imports both) are imported inside the
# functions that build models: the CLI's `gradacc --help` and the Memory planner page import this module before
# torch loads (tests/core/test_layout.py).

PRECISIONS = ("fp32", "bf16", "bf16-pure")
PRECISION_LABELS = {"fp32": "fp32", "bf16": "bf16 autocast", "bf16-pure": "pure bf16"}
OPTIMIZERS = ("adamw", "sgd", "adafactor")
DEFAULT_LORA_RANK = 16
DDP = "ddp"  # on P ranks, the setting replicated (a row's ``sync``); FSDP's are GRAD_SYNCS
ATTENTIONS = ("sdpa", "eager")
# Framework overhead: the CUDA context (the driver's and the kernels' images) and the caching allocator's slack.
# ASSUMPTION, not measured here: ~500 MB is what a CUDA context takes with torch 2.x's lazy module loading on a
# recent GPU (PyTorch "CUDA semantics" notes: the context "can take several hundred MB"); the allocator's slack on
# top is workload-dependent, which this constant does not model.
FRAMEWORK_OVERHEAD_BYTES = 500 * MB
FRAMEWORK_OVERHEAD_SOURCE = "assumed: ~500 MB CUDA context (typical for torch 2.x, not measured on this machine)"

# The scaled-down copies measured per family: (layers, width, feed-forward × , vocabulary ×, sequence, micro-batch).
# Feed-forward and vocabulary keep the full model's ratio to the width (× the factor): which phase holds the peak
# (a layer's activations, or the logits and their gradient) then stays the one the full model has.
DESIGN = ((1, 64, 1, 1, 256, 1), (2, 64, 1, 1, 256, 1), (3, 64, 1, 1, 256, 1), (1, 128, 1, 1, 512, 1),
          (2, 128, 1, 0.5, 512, 1), (1, 64, 2, 1, 256, 1), (2, 64, 0.5, 1, 256, 2), (1, 64, 1, 0.5, 256, 1),
          (2, 64, 1, 2, 256, 2), (1, 64, 1, 1, 512, 1), (2, 64, 1, 1, 512, 1), (2, 128, 0.5, 1, 256, 4),
          (1, 128, 1, 1, 64, 1), (2, 128, 1, 2, 32, 1), (1, 64, 1, 2, 32, 2))
# A few tokens only: the peak is then the end of backward, where the largest parameters' gradients are made whole
# before they are added to the ones held (the embedding's, the output head's); the activations are gone by then.
GRADIENT_DESIGN = ((1, 64, 1, 1, 8, 1), (2, 128, 1, 1, 8, 1))
_FITS: dict[str, dict] = {}  # one fit per (family, settings) in this process
# Fits are also kept on disk (GRADACC_HOME/config-fits), keyed by the family's small config, the design, the settings
# and the torch and transformers versions: the bytes measured depend on nothing else (not on the machine's load), and
# measuring 12 settings × 17 copies is most of a plan's time. Bump FIT_FORMAT when the measurement or the fit changes.
FIT_FORMAT = 4  # 4: the forward fitted as two phases, the layers' and the head's with the loss


def load(source: str, confinement: paths.Confinement | None = None):
    """The config of ``source`` (a config.json, a folder holding one, or a hub id), or one line saying why not. A
    local path must lie inside ``confinement``'s model folders (default: the app's visitors')."""
    # here: transformers imports torch; the CLI and the page import this module before torch loads
    from gradacc.training.memory import architecture
    from gradacc.training.sources.hub import hub_reachable

    model = field_label("model")
    path = Path(source).expanduser()
    if not path.exists():
        looks_like_path = source.endswith(".json") or source.startswith((".", "/", "~")) or source.count("/") > 1
        if looks_like_path:
            raise GradaccError(f"{model} {source!r}: no such file or folder.", "model")
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes") or not hub_reachable():
            raise GradaccError(f"{model} {source!r}: the hub cannot be reached; give a folder or a config.json.",
                               "model")
    else:
        path = paths.visitors_unless(confinement).model_path(path)
        if path.is_dir() and not (path / "config.json").is_file():
            raise GradaccError(f"{model} {source!r}: the folder has no config.json.", "model")
    try:
        config = architecture.load_config(str(path / "config.json") if path.is_dir() else str(path))
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise GradaccError(f"{model} {source!r}: transformers cannot read this config ({first[:200]}).", "model")
    return config


def build_empty(config, source: str):
    """The model on the meta device, or one line saying why transformers cannot build it."""
    from gradacc.training.memory import architecture  # here: it imports torch (see the module's note)

    try:
        return architecture.empty_model(config)
    except Exception as error:  # transformers raises many kinds for a config it cannot build; all are bad input
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise GradaccError(f"{field_label('model')} {source!r}: transformers cannot build a model from this config "
                           f"({type(error).__name__}: {first[:200]}).", "model")


# ---- activations: measured on the family, fitted, scaled --------------------------------------------------

def fit_activations(config, *, precision: str, checkpointing: bool, lora_rank: int | None,
                    attention: str = "sdpa") -> dict:
    """{feature: bytes per unit} for ``config``'s family under these settings, from DESIGN's scaled-down copies;
    cached per (family, settings) in the process. Also ``points``: each copy's measured and fitted bytes."""
    # here: torch and what imports it measure; the CLI and the page import this module before torch loads
    import numpy as np
    import torch
    import transformers
    from scipy.optimize import nnls
    from gradacc.training.memory import architecture

    # the full model's ratios from its config: building it (on the meta device) takes seconds at 70B
    full_feed_forward, full_width, full_vocabulary = (architecture.feed_forward_of(config), int(config.hidden_size),
                                                      int(config.vocab_size))
    design, gradient_design = ([(layers, width, max(16, round(full_feed_forward / full_width * width * ff / 16) * 16),
                                 max(256, round(full_vocabulary / full_width * width * vocab / 64) * 64), sequence,
                                 batch) for layers, width, ff, vocab, sequence, batch in points]
                               for points in (DESIGN, GRADIENT_DESIGN))
    base = architecture.scaled_config(config, layers=1, width=64, feed_forward=128, vocabulary=256, positions=128)
    key = json.dumps([FIT_FORMAT, torch.__version__, transformers.__version__, base.to_json_string(), design,
                      precision, checkpointing, lora_rank, attention])
    if key in _FITS:
        return _FITS[key]
    stored = _fit_file(key)
    if stored.is_file():
        _FITS[key] = json.loads(stored.read_text(encoding="utf-8"))
        return _FITS[key]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows, phases, gradient_ratios, largest = [], [], [], []
    try:
        for index, (layers, width, feed_forward, vocabulary, sequence, batch) in enumerate(gradient_design + design):
            small = architecture.scaled_config(config, layers=layers, width=width, feed_forward=feed_forward,
                                               vocabulary=vocabulary, positions=512)
            small.use_cache = False
            model = architecture.build_small(small, precision=precision, checkpointing=checkpointing,
                                             lora_rank=lora_rank, attention=attention)
            shape = architecture.shape_of(model, small)
            measured = architecture.activation_phases(model, architecture.training_batch(small, batch, sequence),
                                                      precision)
            if index < len(gradient_design):
                gradient_ratios.append(max(measured) / shape.largest_trainable(lora_rank))
                continue
            features = shape.features(batch, sequence, lora_rank)
            if precision != "bf16":
                # no autocast copies to fit: autocast runs under bf16 only (pure bf16's weights are bf16 already).
                # Left in, the fit would take the weights as a stand-in for what they correlate with in the small
                # copies (pure bf16, checkpointed GPT-2's layers' forward: 0.6 byte a weight) and scale it up
                features["linear_parameters"] = 0
            rows.append([features[name] for name in architecture.FEATURES])
            phases.append(measured)
            largest.append(shape.largest_trainable(lora_rank))
    finally:
        torch.set_num_threads(threads)
    gradient = max(gradient_ratios)
    matrix, largest = np.array(rows, dtype=float), np.array(largest, dtype=float)
    phases = np.array(phases, dtype=float)
    target = phases.max(axis=1)
    coefficients = []
    # Each phase its own linear model (architecture.PHASES: the layers' forward, the head's forward and the loss, the
    # loss's backward, the output head's, the layers'); the peak is the largest. A sum of terms cannot be a largest
    # of moments, so a phase is cut where the moment holding its peak changes. Points whose peak is the end of
    # backward's (the gradients) say nothing of any.
    for phase in range(phases.shape[1]):
        values = phases[:, phase]
        keep = values > 1.02 * gradient * largest
        keep = keep if keep.sum() >= 4 else np.ones_like(keep)
        weights = 1.0 / values[keep]  # relative errors: the small copies differ in size by 10×
        solution, _ = nnls(matrix[keep] * weights[:, None], values[keep] * weights)
        coefficients.append(solution)
    fitted = np.maximum(np.max([matrix @ solution for solution in coefficients], axis=0), gradient * largest)
    fit = {"phase_coefficients": [dict(zip(architecture.FEATURES, solution.tolist())) for solution in coefficients],
           "gradient_phase": gradient,
           "points": [{"design": design, "measured": float(value), "fitted": float(guess)}
                      for design, value, guess in zip(design, target, fitted)],
           "largest_fit_error": float(np.max(np.abs(fitted - target) / target))}
    _FITS[key] = fit
    partial = stored.with_suffix(f".{os.getpid()}.part")  # whole or absent: another process may read it meanwhile
    partial.write_text(json.dumps(fit), encoding="utf-8")
    partial.replace(stored)
    return fit


def _fit_file(key: str) -> Path:
    folder = paths.home() / "config-fits"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def activation_terms(fit: dict, shape, micro_batch_size: int, sequence_length: int, precision: str,
                     lora_rank: int | None = None) -> dict:
    """{"activations", "logits"}: the fit evaluated at the full model (logits and loss are tokens × vocabulary)."""
    features = shape.features(micro_batch_size, sequence_length, lora_rank)
    if precision != "bf16":
        features["linear_parameters"] = 0  # autocast's copies: bf16 autocast only (fit_activations)
    phases = []
    for coefficients in fit["phase_coefficients"]:
        terms = {feature: coefficients[feature] * value for feature, value in features.items()}
        phases.append((sum(terms.values()), terms["tokens_vocab"]))
    passes, logits = max(phases)  # the higher phase, and what its logits and loss hold
    # The end of backward (the largest gradients made whole) when it is higher than the passes: shown as activations.
    passes = max(passes, fit["gradient_phase"] * shape.largest_trainable(lora_rank))
    return {"activations": passes - logits, "logits": logits}


# ---- the static terms, exact from the parameters -----------------------------------------------------------

def static_terms(shape, *, lora_rank: int | None, precision: str, optimizer: str) -> dict:
    """Weights, gradients, optimizer state and the optimizer step's temporaries, in bytes (one rank, unsharded).

    Weights: fp32 (4 bytes) for fp32 and bf16 autocast (the master weights), bf16 (2) for pure bf16; LoRA's adapters
    in the same dtype. Gradients in the weights' dtype, for the trainable parameters only. AdamW keeps two moments,
    SGD one momentum buffer, Adafactor a row and a column per matrix (no first moment, its default), all in the
    weights' dtype. The step: AdamW and SGD (torch's foreach kernels, the GPU default) make one temporary the size of
    the trainable parameters; Adafactor two the size of the largest one."""
    size = 2 if precision == "bf16-pure" else 4
    trainable = shape.lora_parameters(lora_rank) if lora_rank else shape.parameters
    factored = shape.lora_factored(lora_rank) if lora_rank else shape.factored
    state = {"adamw": 2 * trainable, "sgd": trainable, "adafactor": factored}[optimizer] * size
    step = 2 * (shape.largest_lora(lora_rank) if lora_rank else shape.largest_parameter) * size \
        if optimizer == "adafactor" else trainable * size
    return {"weights": (shape.parameters + (trainable if lora_rank else 0)) * size, "gradients": trainable * size,
            "optimizer_state": state, "step_temporaries": step, "trainable_parameters": trainable}


def fsdp_terms(static: dict, shape, processes: int, size: int, lora: bool = False,
               sync: str = PER_MICRO_BATCH) -> dict:
    """Per rank on ``processes`` FSDP ranks: weights, optimizer state and the step divided by P; the gradients and
    the sharding buffers as ``gradacc.analysis.sharding.per_rank`` has them for ``sync``. Per-micro-batch sync keeps
    the gradients sharded (÷ P) and reduce-scatters every group every micro-batch (G·b·(1 + 1/P) while it runs);
    per-window sync holds them whole for the window (N·b: they do not shrink with P) and reduce-scatters once, the
    last layer first (F·b / P). Either way the largest group's weights are gathered for its forward and backward."""
    if processes == 1:
        return {**static, "sharding_buffers": 0}
    if sync == DDP:
        # Every rank holds it all, and DDP's all-reduce buckets besides: a flat copy of the gradients (torch's
        # DistributedDataParallel docs, gradient_as_bucket_view: "the saved memory size will be equal to the total
        # gradients size" when set; its default, False, and Accelerate's and Trainer's, keep the copy; measured on 2
        # CPU ranks: tests/training/test_distributed.py).
        return {**static, "sharding_buffers": static["gradients"]}
    from gradacc.analysis import sharding  # here: the page imports this module before its charts' libraries

    trainable = static["trainable_parameters"]
    # the groups' trainable parameters: every parameter in a full fine-tune; under LoRA only the adapters, a layer's
    # share of them (the layers' weights are frozen: gathered, but no gradient to reduce-scatter)
    group, first = (trainable / shape.layers,) * 2 if lora else (shape.largest_group, shape.first_reduced)
    gradients = sharding.per_rank(sharding.Shape(trainable, group, first, 0), processes, 2, grad_bytes=size)[sync]
    return {**static, "weights": static["weights"] / processes, "gradients": gradients["grad_bytes"],
            "optimizer_state": static["optimizer_state"] / processes,
            "step_temporaries": static["step_temporaries"] / processes,
            "sharding_buffers": shape.largest_group * size + gradients["grad_peak_bytes"] - gradients["grad_bytes"]}


TERMS = ("weights", "gradients", "optimizer_state", "activations", "logits", "framework_overhead",
         "sharding_buffers")
TERM_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer_state": "optimizer state",
               "activations": "activations", "logits": "logits + loss", "framework_overhead": "framework overhead",
               "sharding_buffers": "sharding buffers", "step_temporaries": "optimizer step"}


def peak_terms(fit: dict, shape, setting: dict, micro_batch_size: int, sequence_length: int,
               processes: int = 1) -> dict:
    """The peak of one micro-batch under ``setting``, term by term, and ``peak`` their sum (the larger of the
    forward/backward phase and the optimizer step)."""
    size = 2 if setting["precision"] == "bf16-pure" else 4
    static = static_terms(shape, lora_rank=setting["lora_rank"], precision=setting["precision"],
                          optimizer=setting["optimizer"])
    terms = fsdp_terms(static, shape, processes, size, lora=bool(setting["lora_rank"]),
                       sync=setting.get("sync") or PER_MICRO_BATCH)
    terms |= activation_terms(fit, shape, micro_batch_size, sequence_length, setting["precision"],
                              setting["lora_rank"])
    terms["framework_overhead"] = FRAMEWORK_OVERHEAD_BYTES
    passes = terms["activations"] + terms["logits"]
    terms["step_temporaries"] = max(0.0, terms["step_temporaries"] - passes)  # only what the step adds on top
    terms["peak"] = sum(terms[name] for name in TERMS) + terms["step_temporaries"]
    return terms


def settings(lora_rank: int = DEFAULT_LORA_RANK, processes: int = 1) -> list[dict]:
    """Every lever setting; on P > 1 ranks each replicated (``sync`` DDP) and sharded with FSDP's two ways to sync
    the gradients (``sync`` per-window, per-micro-batch)."""
    return [{"lora_rank": rank, "precision": precision, "optimizer": optimizer, "gradient_checkpointing": ck,
             "sync": sync} for rank in (None, lora_rank) for precision in PRECISIONS for optimizer in OPTIMIZERS
            for ck in (False, True) for sync in ((DDP, *GRAD_SYNCS) if processes > 1 else (None,))]


def ways_label(sync: str | None) -> str:
    """How the ranks hold the model, in a row's words: "DDP", "FSDP per-window", "FSDP per-micro-batch"."""
    return "" if sync is None else "DDP" if sync == DDP else f"FSDP {sync}"


def setting_label(setting: dict) -> str:
    tuning = f"LoRA r{setting['lora_rank']}" if setting["lora_rank"] else "full"
    sync = ("" if not setting.get("sync") else " · DDP (replicated)" if setting["sync"] == DDP
            else f" · FSDP {setting['sync']} sync")
    return (f"{tuning} · {PRECISION_LABELS[setting['precision']]} · {setting['optimizer']} · "
            f"checkpointing {'on' if setting['gradient_checkpointing'] else 'off'}{sync}")


def accelerate_view(model) -> dict:
    """What ``accelerate estimate-memory`` says for the same model: its total size in fp32 and its "Training using
    Adam" figure (weights + gradients + Adam states, batch 1, no activations), from accelerate's own functions."""
    from accelerate.commands.estimate import estimate_training_usage  # here: accelerate imports torch
    from accelerate.utils import calculate_maximum_sizes

    total, _ = calculate_maximum_sizes(model)
    return {"total_bytes": total,
            "adam_fp32_bytes": max(estimate_training_usage(total, "float32").values()),
            "adam_bf16_bytes": max(estimate_training_usage(total, "bfloat16").values())}


def normalisation(model) -> dict:
    """How the pick's accumulation weighs its micro-batches for this model's loss. A causal LM's and a masked LM's
    losses are means over tokens: the window's gradient is that of its summed loss ÷ the window's tokens with a
    label, not the mean of its micro-batches' means (micro-batches hold unequal tokens). Each way of training in the
    words of the audit's catalogue (gradacc.training.audit.causes), so the plan and ``gradacc audit`` agree:
    ``kind`` (a LossKind), ``items``, ``loss_normalization`` (gradacc train's), ``trainer``, ``loop``."""
    from gradacc.training.audit import causes, losses  # here: they import torch (see the module's note)

    # a masked LM's labels line up with its logits, -100 where nothing is predicted: a token classifier's loss
    kind = losses.model_kind(model, None) or losses.TOKEN
    if kind == losses.CAUSAL:
        trainer = ('the model\'s own loss, which Trainer divides by the window\'s num_items_in_batch; set '
                   'model.loss_type = "ForCausalLM" before building the Trainer, so it counts labels[..., 1:]')
    else:
        trainer = f"compute_loss_func=gradacc.audit.{causes.LOSS_FUNCS[kind]}"
    return {"kind": str(kind), "items": f"tokens: {causes.ITEMS[kind]}", "loss_normalization": "exact",
            "trainer": trainer,
            "loop": ("before the window's first backward count window_items, the sum over its micro-batches of "
                     f"{causes.ITEMS[kind]}; per micro-batch loss = {causes.SUMMED_LOSS[kind]} / window_items; "
                     "loss.backward() (not the model's mean loss / k)")}


def plan(source: str, *, budget_mb: float, sequence_length: int, target_effective_batch: int, processes: int = 1,
         lora_rank: int = DEFAULT_LORA_RANK, attention: str = "sdpa", config=None,
         confinement: paths.Confinement | None = None) -> dict:
    """Every setting of ``settings()`` for the model ``source`` names: m, k and the peak term by term; the rows that
    fit first (fewest levers, then the largest m), the accelerate view beside it; ``reason``: one line when none
    fits (the smallest footprint and what would fit it)."""
    # here: it imports torch (see the module's note)
    from gradacc.training.memory import architecture
    from gradacc.training.run.engine import quiet_libraries

    quiet_libraries()
    _check(budget_mb, sequence_length, target_effective_batch, processes, lora_rank, attention)
    config = load(source, confinement) if config is None else config
    model = build_empty(config, source)
    shape = architecture.shape_of(model, config)
    if shape.max_positions and sequence_length > shape.max_positions:
        raise GradaccError(f"{field_label('max_seq_length')} {sequence_length} is longer than the model's "
                           f"max_position_embeddings ({shape.max_positions}).", "max_seq_length")
    per_rank_batch, left = divmod(target_effective_batch, processes)
    if left or not per_rank_batch:
        raise GradaccError(f"{field_label('target_effective_batch')} {target_effective_batch} must be a multiple of "
                           f"the number of GPUs ({processes}).", "target_effective_batch")
    budget = budget_mb * MB
    rows = []
    for setting in settings(lora_rank, processes):
        fit = fit_activations(config, precision=setting["precision"], checkpointing=setting["gradient_checkpointing"],
                              lora_rank=setting["lora_rank"], attention=attention)
        best, m = None, 1
        # per-window sync needs a window (k ≥ 2): at k = 1 it is per-micro-batch sync
        largest_m = per_rank_batch // 2 if setting["sync"] == PER_WINDOW else per_rank_batch
        while m <= largest_m and per_rank_batch % m == 0:
            terms = peak_terms(fit, shape, setting, m, sequence_length, processes)
            if terms["peak"] <= budget:
                best = (m, terms)
            m *= 2
        least = peak_terms(fit, shape, setting, 1, sequence_length, processes)
        rows.append({**setting, "fits": best is not None, "micro_batch_size": best[0] if best else None,
                     "grad_accum_steps": per_rank_batch // best[0] if best else None,
                     "terms": best[1] if best else least, "least_bytes": least["peak"],
                     "fit_error": fit["largest_fit_error"]})
    rows.sort(key=lambda row: (not row["fits"], _levers(row), -(row["micro_batch_size"] or 0), row["least_bytes"]))
    result = {"model": source, "model_type": config.model_type, "config_class": type(config).__name__,
              "parameters": shape.parameters, "shape": _shape_dict(shape), "budget_mb": budget_mb,
              "sequence_length": sequence_length, "target_effective_batch": target_effective_batch,
              "processes": processes, "attention": attention, "rows": rows,
              "framework_overhead": {"bytes": FRAMEWORK_OVERHEAD_BYTES, "source": FRAMEWORK_OVERHEAD_SOURCE},
              "accelerate": accelerate_view(model), "normalisation": normalisation(model), "reason": None}
    if not any(row["fits"] for row in rows):
        result["reason"] = _nothing_fits(rows, shape, config, budget, sequence_length, processes, attention)
    return result


def _levers(row: dict) -> int:
    """Levers pulled. Sharding (FSDP) counts as one (DDP, where it fits, gathers nothing), and per-micro-batch sync
    as one more: it sends k times the gradients per window."""
    return (bool(row["lora_rank"]) + (row["precision"] != "fp32") + (row["optimizer"] != "adamw")
            + bool(row["gradient_checkpointing"]) + (row["sync"] in GRAD_SYNCS) + (row["sync"] == PER_MICRO_BATCH))


def _nothing_fits(rows, shape, config, budget, sequence_length, processes, attention) -> str:
    smallest = min(rows, key=lambda row: row["least_bytes"])
    fit = fit_activations(config, precision=smallest["precision"], checkpointing=smallest["gradient_checkpointing"],
                          lora_rank=smallest["lora_rank"], attention=attention)
    ways = []
    if not smallest["lora_rank"]:
        ways.append("LoRA")
    for more in (2 ** n for n in range(1, 11)):
        if more > processes and peak_terms(fit, shape, smallest, 1, sequence_length, more)["peak"] <= budget:
            ways.append(f"{more} GPUs sharded (FSDP)")
            break
    shorter = sequence_length // 2
    while shorter >= 16:
        if peak_terms(fit, shape, smallest, 1, shorter, processes)["peak"] <= budget:
            ways.append(f"a sequence of {shorter} tokens")
            break
        shorter //= 2
    return (f"no setting fits {budget / MB:,.0f} MB: the smallest footprint is {format_bytes(smallest['least_bytes'])} "
            f"({setting_label(smallest)}, m = 1 at {sequence_length} tokens); "
            + ("what would fit: " + ", or ".join(ways) if ways else "a larger budget is the only way") + ".")


def _shape_dict(shape) -> dict:
    return {name: getattr(shape, name) for name in ("parameters", "layers", "width", "feed_forward", "heads",
                                                    "key_value_heads", "vocabulary", "max_positions")}


def _check(budget_mb, sequence_length, target_effective_batch, processes, lora_rank, attention) -> None:
    for name, number in (("max_seq_length", sequence_length), ("target_effective_batch", target_effective_batch),
                         ("processes", processes), ("lora_rank", lora_rank)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise GradaccError(f"{field_label(name)} must be a whole number of at least 1; got {number!r}.", name)
    if isinstance(budget_mb, (str, bool)) or not budget_mb or budget_mb <= 0 or math.isnan(budget_mb):
        raise GradaccError(f"{field_label('budget_mb')} must be a number more than 0; got {budget_mb!r}.",
                           "budget_mb")
    if attention not in ATTENTIONS:
        raise GradaccError(f"{field_label('attention')} must be one of {', '.join(ATTENTIONS)}; got {attention!r}.",
                           "attention")


# ---- the check: predicted against measured, on models this machine trains ------------------------------------

def check_prediction(config, setting: dict, micro_batch_size: int, sequence_length: int,
                     attention: str = "sdpa") -> dict:
    """Build ``config`` for real (small enough for this CPU), measure the peak of a window of 2 micro-batches and
    an optimizer step (``architecture.window_peak``), and compare it with the plan's peak less the framework
    overhead (a GPU's, which a CPU has not)."""
    # here: it trains a model (see the module's note)
    import torch
    from gradacc.training.memory import architecture

    fit = fit_activations(config, precision=setting["precision"], checkpointing=setting["gradient_checkpointing"],
                          lora_rank=setting["lora_rank"], attention=attention)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = architecture.build_small(config, precision=setting["precision"],
                                         checkpointing=setting["gradient_checkpointing"],
                                         lora_rank=setting["lora_rank"], attention=attention)
        shape = architecture.shape_of(architecture.empty_model(config, attention=attention), config)
        batch = architecture.training_batch(config, micro_batch_size, sequence_length)
        activations = architecture.activation_peak(model, batch, setting["precision"])
        measured = architecture.window_peak(model, setting["optimizer"], batch, setting["precision"])
    finally:
        torch.set_num_threads(threads)
    terms = peak_terms(fit, shape, setting, micro_batch_size, sequence_length)
    predicted = terms["peak"] - terms["framework_overhead"]
    passes = terms["activations"] + terms["logits"]
    return {"parameters": shape.parameters, "measured": measured, "predicted": predicted,
            "error": (predicted - measured) / measured, "measured_activations": activations,
            "predicted_activations": passes, "activation_error": (passes - activations) / activations}


# ---- what the page and the CLI show ------------------------------------------------------------------------

GPU_PRESETS_GB = (16, 24, 40, 48, 80, 141)  # the memory of common GPUs, in GiB as their makers count it
GIB = 1024 ** 3


def gpu_budget_mb(gigabytes: float) -> float:
    """A GPU's memory in GiB as the planner's budget (MB of 10⁶ bytes, as every gradacc budget)."""
    return gigabytes * GIB / MB


def shown_rows(result: dict) -> list[dict]:
    """The plan as a table: one row per setting, the terms in GB, fitting settings first."""
    rows = []
    for row in result["rows"]:
        terms = row["terms"]
        rows.append({"tuning": f"LoRA r{row['lora_rank']}" if row["lora_rank"] else "full",
                     "precision": PRECISION_LABELS[row["precision"]], "optimizer": row["optimizer"],
                     "checkpointing": "on" if row["gradient_checkpointing"] else "off",
                     **({"ranks": ways_label(row["sync"])} if result["processes"] > 1 else {}),
                     "m": row["micro_batch_size"], "k": row["grad_accum_steps"],
                     "peak (GB)": round(terms["peak"] / 1e9, 2) if row["fits"] else None,
                     "m = 1 needs (GB)": round(row["least_bytes"] / 1e9, 2),
                     **{f"{TERM_LABELS[name]} (GB)": round(terms[name] / 1e9, 3)
                        for name in (*TERMS, "step_temporaries")}})
    return rows


def stacked_terms(row: dict) -> dict[str, float]:
    """{term label: GB} of one plan row, the terms that add up to its peak (for a stacked bar)."""
    terms = row["terms"]
    return {TERM_LABELS[name]: terms[name] / 1e9 for name in (*TERMS, "step_temporaries")}


def plan_upload(uploaded: bytes | None, source: str, **options) -> dict:
    """``plan`` for an uploaded config.json (its bytes) or, without one, ``source`` (a hub id or a folder)."""
    if uploaded is None:
        return plan(source, **options)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_bytes(uploaded)
        # a file of our own making, not a visitor's path: read wherever the temporary folder is
        result = plan(str(path), **{**options, "confinement": paths.TRUST_USER})
    return result | {"model": "the uploaded config.json"}
