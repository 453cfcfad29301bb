"""Every check that needs ranks, in one 2-process launch (process start and imports cost more than the runs).

Run by tests/test_distributed.py as ``torchrun --nproc_per_node 2 tests/training/distributed_worker.py OUT``; each rank
writes what it saw to ``OUT.rank<r>.json``.
"""

import contextlib
import io
import json
import sys
from pathlib import Path

from gradacc.training import distributed
from gradacc.cli import main
from gradacc.config import RunConfig
from gradacc.training.run.engine import train
from gradacc.analysis.equivalence import check
from gradacc.events import Recorder

BACKENDS = ("pytorch", "accelerate", "trainer")
SMALL = dict(train_samples=64, eval_samples=16, epochs=1, micro_batch_size=4, grad_accum_steps=2, max_seq_length=32,
             dropout=0.0, num_processes=2)


def run(backend: str, **overrides) -> list[dict]:
    options = {"sync_each_micro_batch": overrides.pop("sync_each_micro_batch", False)}
    recorder = Recorder()
    train(RunConfig(**{**SMALL, "backend": backend, **overrides}), recorder, **options)
    return recorder.events


def main_check(*args: str) -> dict:
    """``python -m gradacc check`` under this launch: rank 0 prints the report, the others nothing."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["check", *args])
    return {"code": code, "stdout": out.getvalue()}


def audited_accelerate_loop(sync_each_batch: bool) -> dict:
    """A hand-written ``accelerator.accumulate`` loop (k=2, DDP on 2 ranks) with gradacc.audit one line before it."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import GradientAccumulationPlugin
    from transformers import BertConfig, BertForSequenceClassification

    from gradacc.audit import audit_accelerate

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    plugin = GradientAccumulationPlugin(num_steps=2, sync_each_batch=sync_each_batch)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin, cpu=True)
    torch.manual_seed(0)  # the same weights on both ranks
    model = BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    generator = torch.Generator().manual_seed(1 + distributed.rank())  # each rank its own micro-batches
    window = [{"input_ids": torch.randint(1, 64, (4, 6 + 2 * i), generator=generator),
               "labels": torch.randint(0, 2, (4,), generator=generator)} for i in range(2)]
    audit = audit_accelerate(accelerator, model, optimizer)  # one line before the loop
    for batch in window:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
    return audit.verdict.as_dict()


def audited_trainer(fixed: bool) -> dict:
    """A stock Trainer on a tiny BERT (k=2, 2 ranks) with gradacc.audit's callback: its default, or the fix."""
    import tempfile

    import torch
    from transformers import (BertConfig, BertForSequenceClassification, PrinterCallback, Trainer,
                              TrainingArguments)

    from gradacc.audit import audit_trainer, token_mean_loss

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    generator = torch.Generator().manual_seed(0)
    examples = [{"input_ids": torch.randint(1, 64, (8,), generator=generator), "labels": torch.tensor(i % 2)}
                for i in range(32)]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             max_steps=1, report_to="none", use_cpu=True, disable_tqdm=True, save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=examples,
                      compute_loss_func=token_mean_loss if fixed else None)
    trainer.remove_callback(PrinterCallback)
    audit = audit_trainer(trainer)
    trainer.train()
    return audit.verdict.as_dict()


def ddp_bucket_bytes() -> dict:
    """Bytes alive after a first backward (LiveBytes: every storage counted once), beyond the parameters: without
    DDP, under DDP's default buckets, and with gradient_as_bucket_view=True; and what the planner says DDP adds."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from gradacc.analysis import config_plan
    from gradacc.training.memory.peak import LiveBytes

    seen = {}
    for way in ("alone", "ddp", "bucket_view"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
        with LiveBytes() as live:
            live.hold(list(model.parameters()))
            start = live.current
            wrapped = model if way == "alone" else DistributedDataParallel(
                model, gradient_as_bucket_view=way == "bucket_view")
            wrapped(torch.randn(8, 64)).square().mean().backward()
            seen[way] = live.current - start
    gradients = sum(p.numel() * p.element_size() for p in model.parameters())
    static = {"gradients": gradients}
    seen["gradients"] = gradients
    seen["planned"] = config_plan.fsdp_terms(static, None, 2, 4, sync=config_plan.DDP)["sharding_buffers"]
    return seen


def audited_grpo(loss_type: str, steps_per_generation: int | None, router_term: str | None = None) -> dict:
    """The user's GRPO script (audit_scripts/train_grpo.py), k = 2, on 2 ranks with gradacc.audit: the verdict, and
    what each of this rank's micro-batches was given (its completion tokens, the generation's count). ``router_term``:
    on a tiny Mixtral whose router loss TRL adds, "trl" as TRL 1.16 adds it (coef · aux_loss ÷ k per micro-batch),
    "whole" as TRL did before that ÷ k."""
    import importlib.util

    import torch
    from transformers import PrinterCallback

    from gradacc.audit import audit_trainer

    spec = importlib.util.spec_from_file_location("train_grpo", Path(__file__).parent / "audit_scripts" /
                                                  "train_grpo.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    moe = {}
    if router_term:
        from transformers import MixtralForCausalLM

        from audit_support import mixtral, whole_router_term

        def build():
            # output_router_logits off in the config (TRL asks for them in its training forwards all the same):
            # generating with them on fails in transformers' load-balancing loss once a prompt is padded.
            config = mixtral(0.02)
            config.output_router_logits = False
            return MixtralForCausalLM(config)

        moe = {"build": build,
               "trainer_class": whole_router_term(script.GRPOTrainer) if router_term == "whole" else script.GRPOTrainer}
    trainer = script.trainer(loss_type, 2, steps_per_generation, max_grad_norm=0.0, **moe)
    trainer.remove_callback(PrinterCallback)
    given, compute = [], trainer._compute_loss

    def recording(model, inputs):
        if model.training and torch.is_grad_enabled():
            given.append({"tokens": float(inputs["completion_mask"].sum()),
                          "generation_tokens": float(inputs["num_items_in_batch"])})
        return compute(model, inputs)

    trainer._compute_loss = recording
    audit = audit_trainer(trainer)
    trainer.train()
    return {"verdict": audit.verdict.as_dict(), "given": given}


def main_audit(*args: str) -> dict:
    """``python -m gradacc audit`` under this launch: every rank audits, rank 0 prints the report."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["audit", *args])
    return {"code": code, "stdout": out.getvalue()}


def work() -> dict:
    seen = {"rank": distributed.rank(), "runs": {}, "uneven_runs": {}, "checks": {}}
    for backend in BACKENDS:
        seen["runs"][backend] = run(backend)
        seen["runs"][f"{backend}_without_no_sync"] = run(backend, sync_each_micro_batch=True)
        # 70 examples: the ranks' last round is filled from the start, the last window is short.
        seen["uneven_runs"][backend] = run(backend, train_samples=70)
    for backend in ("accelerate", "trainer"):
        seen["checks"][backend] = check(RunConfig(backend=backend, micro_batch_size=4, grad_accum_steps=2,
                                                  max_seq_length=32, num_processes=2), cases=("equal_windows",))
    seen["audits"] = {"accumulate": audited_accelerate_loop(False), "sync_each_batch": audited_accelerate_loop(True),
                      "trainer_default": audited_trainer(False), "trainer_fixed": audited_trainer(True)}
    seen["cli_audit"] = main_audit("--model", "tiny-bert", "-m", "4", "-k", "2", "--max-seq-length", "32", "--json")
    seen["ddp_bucket_bytes"] = ddp_bucket_bytes()
    seen["grpo"] = {"dapo": audited_grpo("dapo", None), "dapo_spg4": audited_grpo("dapo", 4),
                    "bnpo": audited_grpo("bnpo", None), "moe": audited_grpo("dapo", None, router_term="trl"),
                    "moe_whole": audited_grpo("dapo", None, router_term="whole")}
    seen["cli_check"] = main_check("--backend", "pytorch", "-m", "4", "-k", "2", "--max-seq-length", "32", "--json")
    return seen


if __name__ == "__main__":
    result = work()
    with open(f"{sys.argv[1]}.rank{distributed.rank()}.json", "w", encoding="utf-8") as file:
        json.dump(result, file)
    distributed.exit_rank(0)  # as a launched run ends: no interpreter teardown for gloo's threads to abort in
