"""A model's memory from its config alone: parameters on the meta device, activations measured on a scaled-down copy.

- ``empty_model(config)``: the model built on the meta device (shapes and dtypes, no weights: a 70B config takes
  seconds and no memory); ``trust_remote_code`` is never set, so only transformers' own classes are built.
- ``shape_of(model, config)``: the numbers memory scales with: parameters (all, of linear layers, the largest one),
  layers, width, feed-forward width, heads, key/value heads, vocabulary.
- ``measure_activations(config, ...)``: the same config class, layer types, attention implementation and dtype, with
  fewer layers (1 to 3), a smaller width and vocabulary, trained for one forward and backward on this machine's CPU;
  the peak bytes alive above its parameters and gradients (``peak.LiveBytes``) is its activation memory.
- ``FEATURES``: the terms the activation memory is fitted on (``gradacc.analysis.config_plan``): tokens × width,
  tokens × layers × width, tokens × feed-forward width (with and without × layers), batch × sequence² × heads (with
  and without × layers: eager attention's scores), tokens × vocabulary (the logits and the loss), linear-layer
  parameters (autocast's low-precision copies of the weights) and the largest parameter (its gradient, made whole
  before it is added to the one held).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

from gradacc.training import process_state
from gradacc.training.memory.peak import LiveBytes

FEATURES = ("tokens_width", "tokens_layers_width", "tokens_ff", "tokens_layers_ff", "scores", "scores_layers",
            "tokens_vocab", "linear_parameters", "largest_parameter")
# LoRA goes on the attention's projections (PEFT's default for most families), rank r, scale 2.
LORA_SCOPE = ("attn", "attention")


@dataclass(frozen=True)
class Shape:
    """What memory scales with, for one model."""

    parameters: int
    linear_parameters: int
    largest_parameter: int
    layers: int
    width: int
    feed_forward: int
    heads: int
    key_value_heads: int
    vocabulary: int
    max_positions: int | None
    lora_targets: tuple[tuple[int, int], ...]  # (in, out) of each linear layer LoRA wraps
    factored: int  # what Adafactor keeps per element: a row and a column per matrix, the whole of a vector
    largest_group: int  # parameters of the largest FSDP group: one layer, or what the layers leave to the root
    first_reduced: int  # parameters of the group backward reduces first: the last layer

    def lora_parameters(self, rank: int) -> int:
        return sum(rank * (fan_in + fan_out) for fan_in, fan_out in self.lora_targets)

    def lora_factored(self, rank: int) -> int:
        return sum(2 * rank + fan_in + fan_out for fan_in, fan_out in self.lora_targets)

    def largest_trainable(self, rank: int | None) -> int:
        return self.largest_lora(rank) if rank else self.largest_parameter

    def largest_lora(self, rank: int) -> int:
        return max((rank * max(fan_in, fan_out) for fan_in, fan_out in self.lora_targets), default=0)

    def features(self, micro_batch_size: int, sequence_length: int, lora_rank: int | None = None) -> dict[str, float]:
        """FEATURES at this shape; the largest parameter is the largest trainable one (a LoRA adapter's under LoRA:
        frozen weights make no gradient)."""
        tokens = micro_batch_size * sequence_length
        scores = micro_batch_size * sequence_length ** 2 * self.heads
        return {"tokens_width": tokens * self.width, "tokens_layers_width": tokens * self.layers * self.width,
                "tokens_ff": tokens * self.feed_forward, "tokens_layers_ff": tokens * self.layers * self.feed_forward,
                "scores": scores, "scores_layers": scores * self.layers, "tokens_vocab": tokens * self.vocabulary,
                "linear_parameters": self.linear_parameters, "largest_parameter": self.largest_trainable(lora_rank)}


def model_class(config: PretrainedConfig):
    """An encoder (BERT, RoBERTa: not ``is_decoder``) as its masked LM, a decoder as its causal LM; both put logits
    over the vocabulary on every token."""
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        return AutoModelForMaskedLM
    return AutoModelForCausalLM if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModelForMaskedLM


def load_config(source: str) -> PretrainedConfig:
    """A config.json file, or a folder or hub id holding one; never remote code."""
    if source.endswith(".json"):
        return AutoConfig.for_model(**_read_json(source))
    return AutoConfig.from_pretrained(source, trust_remote_code=False)


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def empty_model(config: PretrainedConfig, dtype=torch.float32, attention: str | None = None) -> torch.nn.Module:
    """The model on the meta device: parameters with shapes and dtypes, nothing allocated."""
    extra = {"attn_implementation": attention} if attention else {}
    with torch.device("meta"):
        return model_class(config).from_config(config, dtype=dtype, trust_remote_code=False, **extra)


def feed_forward_of(config: PretrainedConfig) -> int:
    for name in ("intermediate_size", "n_inner", "ffn_dim"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    return 4 * int(config.hidden_size)


def _key_value_heads(config: PretrainedConfig) -> int:
    return int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def is_lora_target(name: str, module: torch.nn.Module) -> bool:
    """A linear layer inside the attention (a module whose path names attn or attention)."""
    parents = name.lower().split(".")[:-1]
    return _fan(module) is not None and any(word in part for part in parents for word in LORA_SCOPE)


def _fan(module: torch.nn.Module) -> tuple[int, int] | None:
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):  # GPT-2's linear layers: weight (in, out)
        return int(module.weight.shape[0]), int(module.nf)
    return None


def shape_of(model: torch.nn.Module, config: PretrainedConfig) -> Shape:
    """The shape of a (meta or real) model built from ``config``; parameters counted once (tied weights too)."""
    seen, parameters, largest, factored = set(), 0, 0, 0
    for parameter in model.parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            parameters += parameter.numel()
            largest = max(largest, parameter.numel())
            rows_columns = parameter.shape[-2] + parameter.shape[-1] if parameter.dim() >= 2 else 1
            factored += rows_columns * (parameter.numel() // (parameter.shape[-2] * parameter.shape[-1])) \
                if parameter.dim() >= 2 else parameter.numel()
    layer_lists = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList) and len(module)]
    blocks = max(layer_lists, key=lambda blocks: sum(p.numel() for p in blocks.parameters()), default=None)
    layer = max((sum(p.numel() for p in block.parameters()) for block in blocks), default=0) if blocks else 0
    last_layer = sum(p.numel() for p in blocks[-1].parameters()) if blocks else 0
    in_blocks = sum(p.numel() for p in blocks.parameters()) if blocks else 0
    linear, targets = 0, []
    for name, module in model.named_modules():
        fan = _fan(module)
        if fan is not None:
            linear += fan[0] * fan[1]
            if is_lora_target(name, module):
                targets.append(fan)
    return Shape(parameters=parameters, linear_parameters=linear, largest_parameter=largest,
                 layers=int(config.num_hidden_layers), width=int(config.hidden_size),
                 feed_forward=feed_forward_of(config), heads=int(config.num_attention_heads),
                 key_value_heads=_key_value_heads(config), vocabulary=int(config.vocab_size),
                 max_positions=getattr(config, "max_position_embeddings", None), lora_targets=tuple(targets), factored=factored,
                 largest_group=max(layer, parameters - in_blocks), first_reduced=last_layer)


def scaled_config(config: PretrainedConfig, *, layers: int, width: int, feed_forward: int, vocabulary: int,
                  positions: int) -> PretrainedConfig:
    """The same config class with fewer layers, a smaller width, feed-forward and vocabulary; the ratio of key/value
    heads to heads kept (at most 8 heads), token ids moved inside the small vocabulary."""
    heads, kv = int(config.num_attention_heads), _key_value_heads(config)
    group = max(1, heads // kv)
    small_kv = max(1, min(kv, 8 // group)) if group <= 8 else 1
    small_heads = small_kv * group if group <= 8 else 8
    width = -(-width // (2 * small_heads)) * 2 * small_heads  # whole, even heads (rotary embeddings need even)
    values = config.to_dict()
    for name in ("layer_types", "_name_or_path", "architectures", "auto_map", "transformers_version", "model_type"):
        values.pop(name, None)
    values.update(hidden_size=width, num_hidden_layers=layers, num_attention_heads=small_heads, vocab_size=vocabulary,
                  max_position_embeddings=positions, tie_word_embeddings=getattr(config, "tie_word_embeddings", False))
    if "num_key_value_heads" in values:
        values["num_key_value_heads"] = small_kv
    if values.get("head_dim") is not None:
        values["head_dim"] = width // small_heads
    for name in ("intermediate_size", "n_inner", "ffn_dim"):
        if name in values or name == "intermediate_size" and not any(n in values for n in ("n_inner", "ffn_dim")):
            values[name] = feed_forward
    for name in ("n_embd", "n_layer", "n_head", "n_positions"):
        values.pop(name, None)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                 "cls_token_id"):
        if values.get(name) is not None:
            values[name] = 0
    values.pop("rope_scaling", None) if values.get("rope_scaling") else None
    small = type(config)(**values)
    small._attn_implementation = getattr(config, "_attn_implementation", None)
    return small


class _LoRA(torch.nn.Module):
    """A frozen linear layer plus B·A (rank r, B starting at zero), as PEFT's LoRA computes it."""

    def __init__(self, base: torch.nn.Module, rank: int):
        super().__init__()
        fan_in, fan_out = _fan(base)
        self.base = base
        weight = next(base.parameters())
        self.lora_a = torch.nn.Parameter(torch.randn(rank, fan_in, dtype=weight.dtype) / math.sqrt(fan_in))
        self.lora_b = torch.nn.Parameter(torch.zeros(fan_out, rank, dtype=weight.dtype))
        self.scale = 2.0

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def add_lora(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """Freeze every weight and wrap the attention's linear layers with a rank-``rank`` LoRA (trainable)."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    targets = [(name, module) for name, module in model.named_modules() if is_lora_target(name, module)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, _LoRA(module, rank))
    return model


def build_small(config: PretrainedConfig, *, precision: str, checkpointing: bool, lora_rank: int | None,
                attention: str, seed: int = 0) -> torch.nn.Module:
    """A real (small) model of ``config`` in training mode with the levers applied: pure bf16 weights for
    ``precision == "bf16-pure"``, gradient checkpointing (non-reentrant), LoRA of rank ``lora_rank``."""
    dtype = torch.bfloat16 if precision == "bf16-pure" else torch.float32
    with process_state.guard(generator=True):  # the planner page fits beside visitors' seeded builds
        torch.manual_seed(seed)
        model = model_class(config).from_config(config, dtype=dtype, attn_implementation=attention,
                                                trust_remote_code=False)
    if lora_rank:
        add_lora(model, lora_rank)
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if lora_rank:
            model.enable_input_require_grads()
    model.train()
    return model


def training_batch(config: PretrainedConfig, micro_batch_size: int, sequence_length: int, seed: int = 0) -> dict:
    """Random token ids, every position a label (no padding: the planner plans full-length sequences)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, int(config.vocab_size), (micro_batch_size, sequence_length), generator=generator)
    return {"input_ids": ids, "labels": ids.clone()}


def autocast_for(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu",
                                                                                                   enabled=False)


def activation_peak(model: torch.nn.Module, batch: dict, precision: str) -> int:
    return max(activation_phases(model, batch, precision))


# The phases of one forward and backward whose peaks the config planner fits apart: the layers' forward, up to the
# output head's input; the head's forward and the loss (logits, their fp32 copy and log-softmax); the loss's backward
# up to the logits' gradient (logits-sized tensors side by side); the output head's backward (its weight gradient
# made whole, beside the logits' gradient); the layers' backward (with checkpointing, one layer recomputed beside the
# checkpoints). Each moment is one sum of terms; where two take turns holding one phase's peak across the small
# copies, no linear fit follows both. So the forward is cut at the head: checkpointed, on the CPU, a layer's
# attention scores (sdpa's math path in fp32, whenever attention dropout is on: the CPU flash kernel has none) hold
# it at long sequences, the logits and loss at short ones; fitted as one, the largest parameter (the embedding) stood
# in for the logits and scaled wrongly (GPT-2 28M pure bf16, m=1: +32 %). The head's two backward moments likewise:
# which holds the peak depends on tokens × vocabulary against width × vocabulary.
PHASES = ("layers_forward", "head_forward", "loss_backward", "head_backward", "layers_backward")


def activation_phases(model: torch.nn.Module, batch: dict, precision: str) -> tuple[int, ...]:
    """Peak bytes alive in each of PHASES during one forward and backward, above what was alive before it (the
    parameters and the gradients, allocated before it: the window's second micro-batch, which adds to gradients
    already held)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    for parameter in trainable:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    live = LiveBytes()
    head = model.get_output_embeddings()

    def mark_at(phases_done: int):
        return lambda *_: live.mark() if len(live.phase_peaks) == phases_done else None

    def on_logits(module, inputs, output) -> None:  # None: a forward hook's return value replaces the output
        if output.requires_grad:  # the logits' gradient computed: the loss's backward ends, the head's begins
            output.register_hook(mark_at(2))

    # the head called: the layers' forward ends, the head's and the loss's begins (None: the inputs stay as they are)
    head_input_hook = head.register_forward_pre_hook(mark_at(0))
    logits_hook = head.register_forward_hook(on_logits)
    # a full backward hook is set up by the module's forward: registered before it
    head_hook = head.register_full_backward_hook(mark_at(3))
    try:
        with live:
            live.hold([*model.parameters(), *(p.grad for p in trainable)])
            start = live.current
            with autocast_for(precision):
                loss = model(**batch).loss
            live.mark()
            loss.backward()
            del loss
    finally:
        head_input_hook.remove()
        logits_hook.remove()
        head_hook.remove()
    peaks = live.phase_peaks + [live.peak] * (len(PHASES) - len(live.phase_peaks))
    return tuple(peak - start for peak in peaks[:len(PHASES)])


def make_optimizer(model: torch.nn.Module, name: str) -> torch.optim.Optimizer:
    """The planner's optimizers as a GPU run gets them: torch's foreach kernels (the CUDA default) for AdamW and SGD
    with momentum; transformers' Adafactor with its defaults (no first moment)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.01, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(trainable, lr=1e-3, momentum=0.9, foreach=True)
    from transformers.optimization import Adafactor  # here: only the Adafactor setting needs it

    return Adafactor(trainable, lr=1e-4, scale_parameter=False, relative_step=False, warmup_init=False)


def window_peak(model: torch.nn.Module, optimizer_name: str, batch: dict, precision: str,
                grad_accum_steps: int = 2) -> int:
    """Peak bytes alive over one whole window (k micro-batches forward and backward, the optimizer step, zero_grad)
    of a model that has already taken a step (its optimizer state allocated): what a GPU's peak allocated memory
    would read for the same tensors."""
    optimizer = make_optimizer(model, optimizer_name)

    def window():
        for _ in range(grad_accum_steps):
            with autocast_for(precision):
                loss = model(**batch).loss / grad_accum_steps
            loss.backward()
            del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    window()
    state = [value for values in optimizer.state.values() for value in values.values() if torch.is_tensor(value)]
    with LiveBytes() as live:
        live.hold([*model.parameters(), *state])
        window()
    return live.peak
