"""TRL's GRPO loss types under gradient accumulation: does each optimizer step apply the gradient of its window's
documented objective?

For each ``loss_type`` the installed TRL accepts, each k (``gradient_accumulation_steps``) and
``steps_per_generation`` ∈ {k, 2k}, a real ``trl.GRPOTrainer`` trains a tiny Qwen2 (built locally, 1 layer,
hidden 16, a word-level vocabulary of 64; its LM head given a bias towards EOS so completions end at uneven lengths)
for 2 optimizer steps on the CPU, with a toy reward (a completion's length in characters). Per micro-batch the
trainer's own inputs are recorded (prompt and completion ids and masks, advantages, the old log-probs where TRL
stores them, ``num_items_in_batch``); just before each ``optimizer.step()`` (``on_pre_optimizer_step``) the gradient
in the parameters' ``.grad`` is taken — the gradient the step applies — and the truth is computed beside it: a float64
copy of the same weights replays each micro-batch's forward (dropout is 0, so a replay is the forward the run made),
its per-token log-probs go through ``gradacc.training.audit.grpo``'s documented window objective (written out by hand
from ``GRPOConfig.loss_type``'s help, nothing of TRL's loss code), and autograd gives its gradient t.

Per step: scale s = g·t / t·t and residual ‖g − s·t‖ / ‖t‖. "exact": |s − 1| < 1e-4 and residual < 1e-4; "scaled":
the same direction (residual < 1e-4) at another scale; "differs": another direction. Gradient clipping is off
(``max_grad_norm=0``: a clipped step is a rescaled one and would hide the loss's own scale); ``beta=0`` on the grid,
``num_iterations=1``, no vLLM. With steps_per_generation = 2k one generation feeds both steps, so the second step's
ratios π_θ/π_old differ from 1 (the learning rate is large on purpose), so the clip can act (not counted here).

Each run also has ``gradacc.audit.audit_trainer``: its verdict on the first step (cause, scale, its seconds against
TRL's ``step_time`` for the window) is recorded beside the truth's; the recording and the replay above are the
audit's own code (``gradacc.training.compat.trl.grpo_inputs``, ``gradacc.training.audit.grpo_audit.replayed``).

Beside the grid, the full run has ``dapo`` with ``mask_truncated_completions=True`` (TRL #6439: truncated completions
out of the loss and of its token count), ``grpo`` and ``dapo`` with ``beta=0.04`` (the KL term to a reference TRL
loads from a saved copy of the policy without its EOS bias, × the importance ratio: ``use_bias_correction_kl``'s
default), and each ``bnpo`` step is also compared with the window's token mean (what
``bnpo`` is by design not). Each row names the upstream thread (huggingface/trl) it confirms or refutes.
"""

from __future__ import annotations

import math
import re
import tempfile
import time

import plotly.graph_objects as go
import torch
import transformers
import trl
from datasets import Dataset
from transformers import PrinterCallback, Qwen2Config, Qwen2ForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from gradacc.audit import audit_trainer
from gradacc.bench import report
from gradacc.bench.words import VOCAB, WORDS, tokenizer
from gradacc.training.audit import grpo, grpo_audit
from gradacc.training.compat import trl as compat_trl
from gradacc.training.run.engine import quiet_libraries

MICRO_BATCH, GENERATIONS, MAX_COMPLETION, PROMPTS = 4, 4, 8, 32
LEARNING_RATE, SEED, EOS_BIAS, BETA = 0.03, 0, 2.5, 0.04
# loss_types None: every loss type the installed TRL accepts. variants: (loss_type, k, extra GRPOConfig fields), each
# run at steps_per_generation k and 2k beside the plain grid.
FULL = dict(ks=(1, 2, 4), loss_types=None, steps=2,
            variants=(("dapo", 2, {"mask_truncated_completions": True}), ("grpo", 2, {"beta": BETA}),
                      ("dapo", 2, {"beta": BETA})))
QUICK = dict(ks=(1,), loss_types=("grpo", "dr_grpo", "dapo"), steps=2, variants=())
EXACT = 1e-4

# Which upstream thread each loss type's rows speak to (https://github.com/huggingface/trl/...).
ISSUES = {
    "dapo": "#5619/#6024", "cispo": "#5619/#6024", "vespo": "#5619/#6024",
    "grpo": "#3021", "dr_grpo": "#3021", "bnpo": "#3021", "sapo": "#3021", "luspo": "#3021",
}
TRUNCATED_ISSUE = "#6439"


def accepted_loss_types() -> list[str]:
    """The loss types the installed TRL names in ``GRPOConfig.loss_type``'s help ("Supported values are ...")."""
    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    supported = help_text.split("Supported values are", 1)[1].split(".", 1)[0]
    return re.findall(r"'([a-z_]+)'", supported)


def prompts(count: int) -> list[str]:
    generator = torch.Generator().manual_seed(7)
    return [" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (2 + i % 3,), generator=generator).tolist())
            for i in range(count)]


def tiny_qwen2() -> Qwen2ForCausalLM:
    """Qwen2, 1 layer, no dropout; its LM head has a bias with EOS raised, so completions stop at uneven lengths
    (uneven token counts per micro-batch are what tells the normalisers apart)."""
    config = Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=128, attention_dropout=0.0, vocab_size=VOCAB,
                         pad_token_id=0, bos_token_id=2, eos_token_id=3, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    head = torch.nn.Linear(config.hidden_size, VOCAB, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[config.eos_token_id] = EOS_BIAS
    model.lm_head = head
    return model


def with_reference(model: Qwen2ForCausalLM, folder: str) -> None:
    """TRL builds the KL reference from the policy's ``_name_or_path``: point it at a saved Qwen2 with the policy's
    weights but a plain LM head (no EOS bias), so the KL term is not 0 from the first step."""
    reference = Qwen2ForCausalLM(model.config)
    reference.load_state_dict({k: v for k, v in model.state_dict().items() if k != "lm_head.bias"})
    path = f"{folder}/reference"
    reference.save_pretrained(path)
    model.config._name_or_path = path


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


class RecordingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that keeps, per micro-batch, the inputs its loss was computed from (detached copies of what the
    audit reads: gradacc.training.compat.trl.GRPO_INPUTS)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded = []

    def _compute_loss(self, model, inputs):
        self.recorded.append({key: value.detach().clone() for key, value in compat_trl.grpo_inputs(inputs).items()})
        return super()._compute_loss(model, inputs)


class StepJudge(TrainerCallback):
    """Before each optimizer step: the gradient in ``.grad`` against the gradient of the window's documented
    objective, recomputed in float64 from the recorded micro-batches."""

    def __init__(self, trainer: RecordingGRPOTrainer, loss_type: str, truth_model: Qwen2ForCausalLM):
        self.trainer, self.loss_type = trainer, loss_type
        self.truth_model = truth_model.double()  # the weights are loaded from the run's at each step
        self.settings = grpo_audit.settings(trainer.args)
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        model = self.trainer.model
        window, self.trainer.recorded = self.trainer.recorded, []
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        applied = torch.cat([(params[n].grad if params[n].grad is not None else torch.zeros_like(params[n]))
                             .detach().double().flatten() for n in names])
        self.truth_model.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
        truth_params = dict(self.truth_model.named_parameters())
        batches = [self._replayed(inputs, args.temperature) for inputs in window]
        truth = self._gradient(grpo.window_objective(self.loss_type, batches, self.settings), names, truth_params)
        extra = {}
        if self.loss_type == "bnpo":  # local by design: how far that is from the window's token mean, measured
            token_mean = grpo.dapo_window([self._replayed(inputs, args.temperature) for inputs in window],
                                          self.settings)
            versus = compare(applied, self._gradient(token_mean, names, truth_params))
            extra["vs_window_token_mean"] = {"scale": versus["scale"], "residual": versus["residual"]}
        tokens = [int(inputs["completion_mask"].sum()) for inputs in window]
        generation_tokens = sorted({int(inputs["num_items_in_batch"]) for inputs in window})
        self.steps.append({**compare(applied, truth), "micro_batches": len(window), "window_tokens": sum(tokens),
                           "generation_batch_tokens": generation_tokens,
                           "off_policy": any("old_per_token_logps" in inputs for inputs in window), **extra})

    @staticmethod
    def _gradient(objective, names, truth_params) -> torch.Tensor:
        grads = torch.autograd.grad(objective, [truth_params[n] for n in names], allow_unused=True)
        return torch.cat([(g if g is not None else torch.zeros_like(truth_params[n])).flatten()
                          for n, g in zip(names, grads)])

    def _replayed(self, inputs: dict, temperature: float) -> grpo.MicroBatch:
        """The micro-batch through the float64 copy, its stored log-probs and advantages in float64 too."""
        return grpo_audit.replayed(self.truth_model, {key: value.double() if value.is_floating_point() else value
                                                      for key, value in inputs.items()}, temperature)


def compare(applied: torch.Tensor, truth: torch.Tensor) -> dict:
    norm = float(truth.norm())
    if norm == 0.0 or not math.isfinite(norm):
        return {"scale": None, "residual": None, "verdict": "no signal", "truth_norm": norm}
    scale = float(applied @ truth / (truth @ truth))
    residual = float((applied - scale * truth).norm() / norm)
    if residual >= EXACT:
        verdict = "differs"
    else:
        verdict = "exact" if abs(scale - 1.0) < EXACT else "scaled"
    return {"scale": scale, "residual": residual, "verdict": verdict, "truth_norm": norm}


def one_run(loss_type: str, k: int, steps_per_generation: int, steps: int, output_dir: str,
            extra: dict | None = None) -> list[dict]:
    torch.manual_seed(SEED)
    model = tiny_qwen2()
    extra = dict(extra or {})
    if extra.get("beta"):
        with_reference(model, output_dir)
    config = GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=MICRO_BATCH, gradient_accumulation_steps=k,
        steps_per_generation=steps_per_generation, num_generations=GENERATIONS, max_completion_length=MAX_COMPLETION,
        loss_type=loss_type, importance_sampling_level="sequence" if loss_type == "luspo" else "token",
        max_steps=steps, learning_rate=LEARNING_RATE, max_grad_norm=0.0, num_iterations=1, seed=SEED,
        report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=1, bf16=False,
        activation_checkpointing=False, **{"beta": 0.0, **extra})
    trainer = RecordingGRPOTrainer(model=model, args=config, processing_class=tokenizer(), reward_funcs=reward,
                                   train_dataset=Dataset.from_dict({"prompt": prompts(PROMPTS)}))
    trainer.remove_callback(PrinterCallback)
    judge = StepJudge(trainer, loss_type, tiny_qwen2())
    trainer.add_callback(judge)
    audit = audit_trainer(trainer)  # the audit's verdict on the first step, beside the truth's
    trainer.train()
    said = audit.verdict
    # What the audit cost against what the window cost (TRL's step_time: generation, forwards and backwards).
    window_seconds = next((entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry), None)
    judge.steps[0]["audit"] = {"cause": str(said.gradient), "scale": said.fit.scale if said.fit else None,
                               "line": said.line, "seconds": said.audit_seconds, "window_seconds": window_seconds}
    variant = ", ".join(f"{key}={value}" for key, value in (extra or {}).items())
    return [{"loss_type": loss_type, "variant": variant, "k": k, "steps_per_generation": steps_per_generation,
             "step": i + 1, **step, "issues": verdict_on_issues(loss_type, k, steps_per_generation, step["verdict"],
                                                                  truncated="mask_truncated_completions" in extra)}
            for i, step in enumerate(judge.steps)]


def verdict_on_issues(loss_type: str, k: int, steps_per_generation: int, verdict: str, truncated: bool = False) -> str:
    """What the row says about the upstream thread its loss type belongs to (huggingface/trl)."""
    thread = ISSUES.get(loss_type, "—")
    if verdict == "no signal":
        return f"{thread}: no signal (zero advantages)"
    if loss_type in ("dapo", "cispo", "vespo"):
        if verdict == "exact":
            fixed = f"{TRUNCATED_ISSUE} fix holds (truncated tokens out of the count too); " if truncated else ""
            return f"{fixed}#5619 fixed at steps_per_generation = k"
        if steps_per_generation != k:
            return ("#5619 open at steps_per_generation ≠ k: #6024/#5890's k/spg rescale gives the window's token mean "
                    "only on average over the generation, not per step")
        return "#5619/#6024: not fixed even at steps_per_generation = k"
    if verdict == "exact":
        if loss_type == "bnpo":
            return f"{thread}: bnpo is its documented local mean exactly (by design not the window's token mean)"
        return f"{thread}: not a normalisation bug here (the documented aggregate, exactly)"
    return f"{thread}: a normalisation difference ({verdict})"


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    accepted = accepted_loss_types()
    loss_types = [t for t in (size["loss_types"] or accepted) if t in accepted]
    result = report.envelope("grpo", quick, threads, {
        "ks": list(size["ks"]), "variants": [[t, k, extra] for t, k, extra in size["variants"]], "steps_per_generation": "k and 2k", "optimizer_steps": size["steps"],
        "loss_types": loss_types, "accepted_by_trl": accepted, "micro_batch": MICRO_BATCH,
        "num_generations": GENERATIONS, "max_completion_length": MAX_COMPLETION, "learning_rate": LEARNING_RATE,
        "trl": trl.__version__, "transformers": transformers.__version__, "exact_below": EXACT})
    quiet_libraries()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gradacc-bench-grpo-") as output_dir:
        for loss_type in loss_types:
            for k in size["ks"]:
                for spg in (k, 2 * k):
                    report.progress(f"{loss_type}, k={k}, steps_per_generation={spg}")
                    rows.extend(one_run(loss_type, k, spg, size["steps"], output_dir))
        for loss_type, k, extra in size["variants"]:
            if loss_type in loss_types:
                for spg in (k, 2 * k):
                    report.progress(f"{loss_type} with {extra}, k={k}, steps_per_generation={spg}")
                    rows.extend(one_run(loss_type, k, spg, size["steps"], output_dir, extra))
    result["rows"] = rows
    unknown = [t for t in accepted if t not in grpo.WINDOW_OBJECTIVES]
    result["notes"] = ["truth: float64 replay (dropout 0) through gradacc.training.audit.grpo's documented window "
                       "objective; gradient taken before optimizer.step(), clipping off"]
    if unknown:
        result["notes"].append("loss types TRL accepts without a documented objective here: " + ", ".join(unknown))
    judged = [r for r in rows if r["verdict"] != "no signal"]
    result["goals"] = {"every step judged (a non-zero truth)": report.goal(
        len(judged), f"= {len(rows)} steps", len(judged) == len(rows))}
    return report.finish(result, started)


def figure(result: dict):
    rows = [r for r in result["rows"] if r["scale"] is not None]
    figure = go.Figure()
    for step in sorted({r["step"] for r in rows}):
        chosen = [r for r in rows if r["step"] == step]
        figure.add_trace(go.Bar(x=[f"{r['loss_type']}{' (' + r['variant'] + ')' if r.get('variant') else ''}<br>"
                                   f"k={r['k']}, spg={r['steps_per_generation']}" for r in chosen],
                                y=[r["scale"] for r in chosen], name=f"step {step}"))
    figure.add_hline(y=1.0, line_dash="dash", annotation_text="the window's documented objective")
    figure.update_layout(title="TRL GRPOTrainer: the step's gradient ÷ its window's documented objective's, by loss "
                               "type", yaxis_title="scale g·t / t·t", barmode="group")
    return figure


def table(result: dict) -> tuple[list[str], list[list]]:
    headers = ["loss_type", "k", "steps_per_generation", "step", "scale", "residual", "verdict", "window tokens",
               "generation tokens", "bnpo vs window token mean: scale, residual", "audit (step 1): verdict, scale, "
               "seconds / window seconds", "issue"]
    rows = [[r["loss_type"] + (f" ({r['variant']})" if r.get("variant") else ""), r["k"], r["steps_per_generation"],
             r["step"],
             None if r["scale"] is None else f"{r['scale']:.6f}", r["residual"], r["verdict"], r["window_tokens"],
             ",".join(map(str, r["generation_batch_tokens"])), _versus(r.get("vs_window_token_mean")),
             _audit(r.get("audit")), r["issues"]]
            for r in result["rows"]]
    return headers, rows


def _versus(entry: dict | None) -> str | None:
    return None if entry is None else f"{entry['scale']:.4f}, {entry['residual']:.2e}"


def _audit(entry: dict | None) -> str | None:
    if entry is None:
        return None
    scale = "—" if entry["scale"] is None else f"{entry['scale']:.6f}"
    window = "?" if entry["window_seconds"] is None else f"{entry['window_seconds']:.3f}"
    return f"{entry['cause']}, {scale}, {entry['seconds']:.3f} / {window}"
