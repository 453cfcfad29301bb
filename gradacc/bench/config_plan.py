"""``python -m gradacc bench config-plan``: the config planner's predicted peak against the peak measured, on models
this machine can train.

For each family (GPT-2, Llama, Qwen2, BERT; Mixtral at one size) at two sizes of a few to tens of millions of parameters, under fp32, bf16
autocast and pure bf16, gradient checkpointing off and on, and two (micro-batch, sequence) shapes, the model is
built for real and trained for a window of 2 micro-batches and an AdamW step (torch's foreach kernels, as on a
GPU); the peak bytes alive (``gradacc.training.memory.peak.LiveBytes``) is set against what
``gradacc.analysis.config_plan`` predicts from the config alone (its fit on the family's scaled-down copies),
less the framework overhead a CPU does not have. The activation phase (one forward and backward above the
parameters and gradients) is compared on its own too: in many windows the optimizer step holds the peak.
"""

from __future__ import annotations

import time

import plotly.graph_objects as go
from transformers import BertConfig, GPT2Config, LlamaConfig, MixtralConfig, Qwen2Config

from gradacc.analysis import config_plan
from gradacc.bench import report

FAMILIES = {
    "gpt2-5M": (GPT2Config, dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=512)),
    "gpt2-28M": (GPT2Config, dict(n_layer=6, n_embd=512, n_head=8, vocab_size=16384, n_positions=512)),
    "llama-7M": (LlamaConfig, dict(num_hidden_layers=4, hidden_size=256, intermediate_size=688, num_attention_heads=8,
                                   num_key_value_heads=4, vocab_size=8192, max_position_embeddings=512)),
    "llama-33M": (LlamaConfig, dict(num_hidden_layers=6, hidden_size=512, intermediate_size=1376,
                                    num_attention_heads=8, num_key_value_heads=2, vocab_size=16000,
                                    max_position_embeddings=512)),
    "qwen2-7M": (Qwen2Config, dict(num_hidden_layers=4, hidden_size=256, intermediate_size=704, num_attention_heads=8,
                                   num_key_value_heads=2, vocab_size=8192, max_position_embeddings=512)),
    "qwen2-22M": (Qwen2Config, dict(num_hidden_layers=8, hidden_size=384, intermediate_size=1024,
                                    num_attention_heads=6, num_key_value_heads=2, vocab_size=16000,
                                    max_position_embeddings=512)),
    # an encoder (its masked-LM head) and a mixture of experts (4 experts, 2 a token)
    "bert-5M": (BertConfig, dict(num_hidden_layers=4, hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                                 vocab_size=8192, max_position_embeddings=512)),
    "bert-26M": (BertConfig, dict(num_hidden_layers=6, hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                                  vocab_size=16384, max_position_embeddings=512)),
    "mixtral-11M": (MixtralConfig, dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512,
                                        num_attention_heads=8, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, vocab_size=8192, max_position_embeddings=512)),
}
SETTINGS = (("fp32", False), ("fp32", True), ("bf16", False), ("bf16-pure", True))
SHAPES = ((1, 256), (4, 128))
QUICK = {"models": ["gpt2-5M", "llama-7M"], "settings": [("fp32", False)], "shapes": [(2, 64)]}
GOAL = 0.10


def config_of(name: str):
    cls, values = FAMILIES[name]
    extra = {"bos_token_id": 0, "eos_token_id": 0} if cls is GPT2Config else {}
    return cls(**values, **extra) if cls is BertConfig else cls(**values, **extra, use_cache=False)


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else {"models": list(FAMILIES), "settings": list(SETTINGS), "shapes": list(SHAPES)}
    result = report.envelope("config-plan", quick, threads, {**size, "optimizer": "adamw (foreach)",
                                                              "window": "2 micro-batches + step"})
    points = []
    for name in size["models"]:
        config = config_of(name)
        for precision, checkpointing in size["settings"]:
            setting = {"lora_rank": None, "precision": precision, "optimizer": "adamw",
                       "gradient_checkpointing": checkpointing}
            for micro_batch_size, sequence_length in size["shapes"]:
                report.progress(f"{name} {precision} checkpointing {'on' if checkpointing else 'off'} "
                                f"m={micro_batch_size} s={sequence_length}")
                checked = config_plan.check_prediction(config, setting, micro_batch_size, sequence_length)
                points.append({"model": name, "precision": precision, "gradient_checkpointing": checkpointing,
                               "micro_batch_size": micro_batch_size, "sequence_length": sequence_length, **checked})
    result["points"] = points
    worst = max(abs(p["error"]) for p in points)
    worst_activations = max(abs(p["activation_error"]) for p in points)
    result["goals"] = {
        "largest error of the predicted window peak": report.goal(worst, f"within {GOAL:.0%}", worst <= GOAL),
        "largest error of the predicted activation phase": report.goal(worst_activations, f"within {GOAL:.0%}",
                                                                       worst_activations <= GOAL)}
    return report.finish(result, started)


def figure(result: dict):
    fig = go.Figure()
    labels = [f"{p['model']} {p['precision']} ck={'on' if p['gradient_checkpointing'] else 'off'} "
              f"m={p['micro_batch_size']} s={p['sequence_length']}" for p in result["points"]]
    fig.add_bar(x=labels, y=[100 * p["error"] for p in result["points"]], name="window peak")
    fig.add_bar(x=labels, y=[100 * p["activation_error"] for p in result["points"]], name="activation phase")
    fig.update_layout(title="Config planner: predicted − measured, % of measured", barmode="group",
                      yaxis_title="error (%)")
    return fig


def table(result: dict) -> tuple[list[str], list[list]]:
    headers = ["model", "params", "precision", "ckpt", "m", "seq", "peak measured MB", "predicted MB", "error",
               "activations measured MB", "predicted MB", "error"]
    rows = [[p["model"], f"{p['parameters'] / 1e6:.1f}M", p["precision"], "on" if p["gradient_checkpointing"] else "off",
             p["micro_batch_size"], p["sequence_length"], f"{p['measured'] / 1e6:.1f}", f"{p['predicted'] / 1e6:.1f}",
             f"{p['error']:+.1%}", f"{p['measured_activations'] / 1e6:.1f}",
             f"{p['predicted_activations'] / 1e6:.1f}", f"{p['activation_error']:+.1%}"] for p in result["points"]]
    return headers, rows
