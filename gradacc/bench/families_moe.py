"""``bench families``' MoE rows: a tiny Mixtral causal LM (4 experts, top 2, ``output_router_logits=True``,
``router_aux_loss_coef`` = 0.02) trained one step by a stock ``Trainer`` (m = 2, k = 4), with gradacc.audit: on one
process, and on two (torchrun, gloo on the CPU) with and without ``average_tokens_across_devices`` (transformers
#48690: the loss, router term included, multiplied by the processes). Each way with the stock settings and with the
fix the audit names (each forward adds the router loss at the config's coefficient ÷ k, ÷ k·P under
``average_tokens_across_devices``). Each row: the audit's verdict, the router term's scale on the router weights
(1: the micro-batches' mean), the main loss's scale, how far off the router weights' gradient is, and the audit's
seconds against the window's.

Beside them, what no accumulation gives: on the first window's micro-batches, the gradient of the micro-batches'
mean router loss against the gradient of the router loss of the window's tokens taken as one batch (cosine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import DataCollatorForLanguageModeling, PrinterCallback, Trainer, TrainingArguments

from gradacc.audit import audit_trainer
from gradacc.training import distributed
from gradacc.training.audit import router
from gradacc.training.compat import transformers as compat
from gradacc.training.run.launch import free_port
from gradacc.training.sources import builtin_data, models

COEFFICIENT = 0.02
SETTINGS = dict(micro_batch_size=2, grad_accum_steps=4, max_seq_length=32, seed=42)
PROCESSES = 2
LAUNCH_TIMEOUT_S = 600
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds gradacc/


def _model(tokenizer):
    config = transformers.MixtralConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, num_local_experts=4,
        num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=COEFFICIENT)
    torch.manual_seed(SETTINGS["seed"])
    return transformers.MixtralForCausalLM(config)


def _examples(tokenizer, count: int) -> list[dict]:
    texts = builtin_data.make_text(count, seed=0)
    encoded = tokenizer(texts, truncation=True, max_length=SETTINGS["max_seq_length"])
    return [{"input_ids": ids} for ids in encoded["input_ids"]]


def trainer_row(fixed: bool, average_tokens: bool = True) -> dict:
    """Two stock Trainer steps, the first audited, in this process (one rank of a launch, or alone)."""
    m, k = SETTINGS["micro_batch_size"], SETTINGS["grad_accum_steps"]
    processes = distributed.world_size()
    tokenizer = models.tiny_gpt_tokenizer()
    model = _model(tokenizer)
    if fixed:  # the audit's fix: each forward adds 1/(k·P) of the router loss under average_tokens, else 1/k
        model.router_aux_loss_coef = model.config.router_aux_loss_coef / (k * (processes if average_tokens else 1))
    with tempfile.TemporaryDirectory(prefix="gradacc-families-moe-") as output_dir:
        args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=m, gradient_accumulation_steps=k,
                                 max_steps=2, seed=SETTINGS["seed"], report_to="none", save_strategy="no",
                                 disable_tqdm=True, use_cpu=True, average_tokens_across_devices=average_tokens)
        trainer = Trainer(model=model, args=args, train_dataset=_examples(tokenizer, 2 * m * k * processes),
                          data_collator=DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False))
        trainer.remove_callback(PrinterCallback)
        window = _WindowClock()
        trainer.add_callback(window)
        audit = audit_trainer(trainer)
        trainer.train()
    verdict = audit.verdict
    router = verdict.router
    return {"way": "the fix" if fixed else "stock Trainer", "processes": processes,
            "average_tokens_across_devices": average_tokens, "verdict": str(verdict.gradient),
            "router_verdict": str(router.cause) if router else None,
            "router_scale": router.fit.scale if router else None, "main_scale": router.main_scale if router else None,
            "router_weights_off": router.off_on_router_weights if router else None,
            "audit_s": verdict.audit_seconds, "reference_s": verdict.reference_seconds,
            "window_s": window.seconds, **({} if verdict.ok else {"line": verdict.line})}


class _WindowClock(transformers.TrainerCallback):
    """The second window's seconds, its micro-batches' forwards and backwards (the first carries lazy set-up, and
    the audit's replay of it): what the audit's cost is compared with."""

    def __init__(self):
        self.started, self.seconds, self.windows = None, None, 0

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.windows += 1
        if self.windows == 2:
            self.seconds = time.perf_counter() - self.started


def window_gap() -> dict:
    """The gradient of the micro-batches' mean router loss against that of the window's tokens as one batch."""
    m, k = SETTINGS["micro_batch_size"], SETTINGS["grad_accum_steps"]
    tokenizer = models.tiny_gpt_tokenizer()
    model = _model(tokenizer)
    collate = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)
    examples = _examples(tokenizer, m * k)
    sums = []
    for i in range(k):
        batch = collate(examples[i * m:(i + 1) * m])
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        sums.append(router.expert_sums(out.router_logits, model.num_experts_per_tok, batch["attention_mask"]))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    gate = compat.router_parameter_names(model)

    def gradient(loss):
        grads = torch.autograd.grad(loss, [p for _, p in named], retain_graph=True, allow_unused=True)
        return {n: (g if g is not None else torch.zeros_like(p)).double().reshape(-1)
                for (n, p), g in zip(named, grads)}

    mean = sum(router.load_balancing(s) for s in sums) / k
    window = router.load_balancing(torch.stack(sums).sum(dim=0))
    micro, whole = gradient(mean), gradient(window)

    def cosine(names):
        a = torch.cat([micro[n] for n in names])
        b = torch.cat([whole[n] for n in names])
        return float(a @ b / (a.norm() * b.norm()))

    return {"micro_batch_mean_loss": float(mean), "window_loss": float(window),
            "cosine_all_weights": cosine([n for n, _ in named]), "cosine_router_weights": cosine(sorted(gate))}


def moe_rows(quick: bool, threads: int) -> dict:
    """The MoE rows: one process here (stock, fix); two processes launched (with and without
    average_tokens_across_devices, stock and fix), unless ``quick``; and the window gap."""
    rows = [trainer_row(False), trainer_row(True)]
    if not quick:
        rows += _launch(threads)
    return {"rows": rows, "window_gap": window_gap(), "router_aux_loss_coef": COEFFICIENT,
            "model": "MixtralForCausalLM, 2 layers, width 32, 4 experts, top 2"}


def _launch(threads: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="gradacc-bench-moe-") as folder:
        out = Path(folder) / "rows.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "ACCELERATE_USE_CPU": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(PROCESSES),
                   "--master_port", str(free_port()), "-m", "gradacc.bench.families_moe", str(out)]
        finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=LAUNCH_TIMEOUT_S)
        if finished.returncode != 0:
            return [{"way": "two processes", "failed": finished.stderr[-2000:]}]
        return json.loads(out.read_text(encoding="utf-8"))


def _rank_main(out: str) -> None:
    rows = [trainer_row(fixed, average) for average in (True, False) for fixed in (False, True)]
    if distributed.is_main_process():
        Path(out).write_text(json.dumps(rows), encoding="utf-8")
    distributed.exit_rank(0)


if __name__ == "__main__":
    _rank_main(sys.argv[1])
