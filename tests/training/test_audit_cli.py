"""``gradacc audit``: a user's script run unchanged under ``gradacc audit [--strict] -- python train.py`` (every
Trainer, TRL trainer and Accelerate loop it runs audited, a CI step's exit status), bad input in one line, and
``gradacc audit --model`` on saved models with the standard 🤗 collator (the causal-LM miscount shows)."""

import json
import subprocess
import sys

import pytest
import torch

from audit_support import bert, gpt2, tokenizer
from gradacc.cli import main
from support import ROOT

SCRIPTS = ROOT / "tests" / "training" / "audit_scripts"


def gradacc_audit(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "gradacc", "audit", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def test_a_users_script_is_audited_unchanged_and_strict_fails_the_ci_step_on_a_wrong_verdict():
    """GPT-2's stock Trainer (0.87×: items miscounted), a BERT Accelerate loop and TRL's SFTTrainer: three verdicts,
    one line each; --strict exits 3. With the fix named, every verdict is exact and --strict exits 0."""
    wrong = gradacc_audit("--strict", "--", sys.executable, str(SCRIPTS / "train_all.py"), "--with-sft")
    lines = [line for line in wrong.stdout.splitlines() if line.startswith("gradacc audit")]
    assert wrong.returncode == 3, wrong.stdout + wrong.stderr[-3000:]
    assert len(lines) == 3, wrong.stdout
    assert lines[0].startswith("gradacc audit (trainer, GPT2LMHeadModel): gradient items miscounted")
    assert lines[1].startswith("gradacc audit (accelerate, BertForSequenceClassification): exact")
    assert lines[2].startswith("gradacc audit (trainer, Qwen2ForCausalLM): exact")
    assert wrong.stderr.count("gradacc audit (") == 0  # each verdict said once, by the command
    fixed = gradacc_audit("--strict", "--json", "--", sys.executable, str(SCRIPTS / "train_all.py"), "--fixed")
    verdicts = [json.loads(line) for line in fixed.stdout.splitlines() if line.startswith('{"')]
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr[-3000:]
    assert [v["gradient"] for v in verdicts] == ["exact", "exact"] and all(v["ok"] for v in verdicts)


@pytest.mark.parametrize("strict, script, status, said", [
    (True, "crash.py", 1, "exited with status 1, before any optimizer step was audited"),
    (True, "idle.py", 4, "nothing audited: the script stepped no Trainer, no Accelerate loop and no optimizer"),
    (False, "idle.py", 0, "nothing audited: the script stepped no Trainer, no Accelerate loop and no optimizer")])
def test_a_script_that_crashes_or_never_steps_gets_one_line_and_strict_never_passes_it(strict, script, status, said):
    """A CI gate fails on what it did not check (4); without --strict the status is the script's own."""
    result = gradacc_audit(*(["--strict"] if strict else []), "--", sys.executable, str(SCRIPTS / script),
                           timeout=120)
    assert result.returncode == status
    ours = [line for line in result.stderr.splitlines() if line.startswith("gradacc audit")]
    assert len(ours) == 1 and said in ours[0], result.stderr


def audit_lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("gradacc audit")]


@pytest.mark.parametrize("flags, status, said", [
    ([], 3, "gradacc audit (loop, LlamaForCausalLM): gradient weighted by micro-batch, not by item"),
    (["--fixed"], 0, "gradacc audit (loop, LlamaForCausalLM): exact"),
    (["--model", "nanogpt"], 4, "gradacc audit (loop, GPT): not judged — the batch holds no labels, so the loss "
                                "cannot be recomputed from the model's output: pass loss_fn="),
    (["--model", "nanogpt", "--own-loss-fn", "--fixed"], 0, "gradacc audit (loop, GPT): exact"),
    (["--model", "nanogpt", "--never-step"], 4, "gradacc audit (loop, GPT): not judged — the loop ran 8 forwards of "
                                                "the model with gradients on and optimizer.step() never ran")])
def test_a_plain_pytorch_loop_is_audited_unchanged(flags, status, said):
    """loss = model(**batch).loss / k over texts of uneven lengths is wrong (3); its fix is exact (0); nanoGPT's
    model(x, y) has no labels to judge by, said in one line, and --strict fails it (4) until the script gives the
    loss_fn; a loop that never steps is not passed either."""
    result = gradacc_audit("--strict", "--", sys.executable, str(SCRIPTS / "plain_loop.py"), *flags, timeout=120)
    assert result.returncode == status, result.stdout + result.stderr[-3000:]
    lines = audit_lines(result)
    assert len(lines) == 1 and lines[0].startswith(said), result.stdout


def test_a_plain_loop_on_two_processes_with_ddp_is_audited_over_both():
    """nanoGPT's DDP loop (require_backward_grad_sync on the window's last micro-batch) under torchrun: the window's
    items counted on both ranks, one all-reduce per window, exact; the verdict said once."""
    result = gradacc_audit("--strict", "--json", "--", sys.executable, "-m", "torch.distributed.run",
                           "--nproc_per_node", "2", str(SCRIPTS / "plain_loop.py"), "--fixed", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    [verdict] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"')]
    assert verdict["gradient"] == "exact" and verdict["num_processes"] == 2, verdict["line"]
    sync = next(c for c in verdict["checks"] if c["name"] == "sync")
    assert sync["ok"] and sync["detail"] == "gradients all-reduced in 1 of 4 micro-batches"


def test_two_copies_that_share_no_gradient_are_said_with_no_false_factor():
    """accelerate launch --multi_gpu on a machine without GPUs starts two copies, each training alone: one line
    says so and names the launch that works on a CPU; the gradient itself is judged as the one process it is."""
    result = gradacc_audit("--strict", "--json", "--", sys.executable, "-m", "accelerate.commands.launch",
                           "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                           "--dynamo_backend", "no", str(SCRIPTS / "accelerate_loop.py"), timeout=180)
    assert result.returncode == 3, result.stdout + result.stderr[-3000:]
    verdicts = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"')]
    assert verdicts and all(v["gradient"] == "exact" and v["num_processes"] == 1 for v in verdicts)
    processes = next(c for c in verdicts[0]["checks"] if c["name"] == "processes")
    assert processes["detail"] == "2 processes launched, each training alone: no gradients are shared"
    assert "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 train.py" in processes["fix"]
    said = gradacc_audit("--", sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                         "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                         str(SCRIPTS / "accelerate_loop.py"), timeout=180)
    assert said.returncode == 0 and len(audit_lines(said)) == 1, said.stdout


def test_no_script_or_a_missing_program_is_one_line(capsys):
    assert main(["audit", "--"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: give the command that trains after --")
    assert main(["audit", "--", "no-such-program-gradacc"]) == 127
    err = capsys.readouterr().err.strip()
    assert err.startswith("gradacc audit: could not start 'no-such-program-gradacc'") and len(err.splitlines()) == 1
    assert main(["audit", "--model", "tiny-bert", "--", "python", "train.py"]) == 2
    assert "not both" in capsys.readouterr().err


def save(model, folder):
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def test_model_audits_a_stock_trainer_with_the_standard_collator_so_the_causal_lm_miscount_shows(capsys, tmp_path):
    from transformers import BertForSequenceClassification, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = save(GPT2LMHeadModel(gpt2()), tmp_path / "gpt2")
    assert main(["audit", "--model", folder, "-m", "4", "-k", "4", "--max-seq-length", "32", "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["gradient"] == "items_miscounted" and verdict["fit"]["scale"] < 0.99, verdict["line"]
    assert verdict["counted_items"] - verdict["window_items"] == 16  # each text's first token, 4 × 4 texts
    folder = save(BertForSequenceClassification(bert(num_labels=2)), tmp_path / "bert")
    assert main(["audit", "--model", folder, "-k", "2", "--max-seq-length", "32", "--strict"]) == 3
    assert capsys.readouterr().out.startswith("gradacc audit (trainer, BertForSequenceClassification): gradient k× "
                                              "too large")
    assert main(["audit", "--model", str(tmp_path / "missing"), "-k", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model") and len(err.splitlines()) == 1


def test_a_users_grpo_script_is_audited_unchanged_against_its_loss_types_objective():
    """GRPOTrainer is a Trainer: the command attaches to it. dapo with two windows per generation: the scale and
    the fix in one line, and --strict fails the step (tests/training/test_audit_grpo.py checks the figures)."""
    result = gradacc_audit("--strict", "--", sys.executable, str(SCRIPTS / "train_grpo.py"), "--loss-type", "dapo",
                           "-k", "2", "--steps-per-generation", "4")
    [line] = audit_lines(result)
    assert result.returncode == 3, result.stdout + result.stderr[-3000:]
    assert line.startswith("gradacc audit (trainer, Qwen2ForCausalLM): gradient scaled by the generation batch's "
                           "token count: the step is "), line
    assert "Fix: GRPOConfig(steps_per_generation=2) (= gradient_accumulation_steps)" in line
