"""The command line: exit codes, one-line errors, JSON events."""

import json
import os
import re
import subprocess
import sys

import pytest

from attack_support import assert_one_error_line, cli
from support import ROOT

SMALL = ["--train-samples", "48", "--eval-samples", "16", "--epochs", "1", "--max-seq-length", "32"]


def gradacc(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gradacc", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def test_train_json_emits_one_event_per_line_in_order_and_metrics_out_keeps_them(tmp_path):
    # One real process for both flags: starting one (importing torch) is most of this test's time.
    out = tmp_path / "events.jsonl"
    result = gradacc("train", "-m", "8", "-k", "2", "--json", "--metrics-out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["event"] for e in lines]
    assert kinds[0] == "run_started" and kinds[-1] == "run_ended"
    assert kinds.count("step") == 3 and kinds.count("eval") == 1
    assert lines[0]["effective_batch"] == 16
    assert lines[-1]["status"] == "completed"
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines


# Every bad number is refused in test_attack_numbers.py, bad data and models in test_attack_data/models.py;
# here the two refusals that are neither.
@pytest.mark.parametrize("args,message", [
    (["--backend", "jax"], "argument --backend: invalid choice: 'jax'"),
    (["--model", "/etc"], "'etc' is not a model folder: it has no config.json"),  # the CLI trusts, and checks
])
def test_bad_input_is_one_error_line_and_exit_2(args, message, capsys):
    code, out, err = cli(capsys, "train", *args, *SMALL)  # in-process: no seconds spent importing torch again
    assert_one_error_line(code, out, err, 2, message)


def test_bad_input_exits_2_from_a_real_process_too():
    result = gradacc("train", "-m", "0", *SMALL)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: --micro-batch-size must be a whole number from 1 to 4096; got 0."]


def test_check_json_has_the_main_pair_and_every_case():
    result = gradacc("check", "--backend", "pytorch", "-m", "4", "-k", "2", "--json", "--max-seq-length", "32")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["exact_rel_error"] < 1e-5
    assert set(report["cases"]) == {"equal_windows", "short_last_window", "token_level", "language_model"}
    assert all({"naive_rel_error", "exact_rel_error"} <= set(c) for c in report["cases"].values())


def test_task_flag_and_the_language_model_defaults():
    from gradacc.cli import build_parser
    from gradacc.cli.options import config_from_args

    parse = build_parser().parse_args
    lm = config_from_args(parse(["train", "--model", "tiny-gpt"]))
    assert lm.dataset == "builtin-text" and lm.task is None  # the task is inferred when the run prepares
    assert config_from_args(parse(["train"])).dataset == "builtin-sentiment"
    assert config_from_args(parse(["train", "--model", "tiny-bert", "--task", "causal-lm"])).dataset == "builtin-text"
    assert config_from_args(parse(["check", "--model", "tiny-gpt", "--task", "causal-lm"])).task == "causal-lm"
    with pytest.raises(SystemExit) as bad:
        parse(["train", "--task", "translation"])
    assert bad.value.code == 2


def test_plan_ranks_the_lever_settings_and_says_in_one_line_when_none_fits(capsys):
    code, out, _ = cli(capsys, "plan", "--model", "tiny-bert", "--max-seq-length", "16", "--memory-budget-mb", "1",
                       "--target-effective-batch", "8")
    assert code == 1  # nothing fits: as a run that does not fit
    assert len([line for line in out.splitlines() if line.startswith(("off ", "on "))]) == 12
    assert out.strip().splitlines()[-2].startswith("--memory-budget-mb 1 is too small for every setting: even a "
                                                   "micro-batch of 1 with the lightest (checkpointing on")


def test_plan_picks_with_the_runs_optimizer_and_says_why(capsys):
    args = ["plan", "--model", "tiny-bert", "--max-seq-length", "16", "--target-effective-batch", "8"]
    # 3 MB: AdamW's state alone does not fit tiny-bert; SGD and Adafactor do, only when allowed.
    code, out, _ = cli(capsys, *args, "--memory-budget-mb", "3")
    assert "pick: nothing with adamw fits; --change-optimizer lets the pick use another one" in out
    code, out, _ = cli(capsys, *args, "--memory-budget-mb", "3", "--change-optimizer")
    pick = next(line for line in out.splitlines() if line.startswith("pick: "))
    assert "adamw" not in pick.split(".")[0] and "needs" not in pick and "learning rate" in pick
    # Only an optimizer with a rate measured for tiny-bert is offered, and it comes with that rate.
    from gradacc.recipes import recipe_for

    chosen = pick.split(".")[0].split(" · ")[-1].split(",")[0]
    own = recipe_for("tiny-bert").learning_rate_for(chosen)
    assert own is not None and f"trains at its own learning rate, {own:g}, measured for tiny-bert's recipe" in pick
    train_line = next(line for line in out.splitlines() if line.startswith("train it with: python -m gradacc train "))
    assert f"--optimizer {chosen} --lr {own:g}" in train_line


def test_plan_on_several_processes_shows_each_ranks_memory_replicated_and_sharded(capsys):
    code, out, _ = cli(capsys, "plan", "--model", "tiny-bert", "--max-seq-length", "16", "--memory-budget-mb", "3",
                       "--target-effective-batch", "8", "--change-optimizer", "--processes", "2")
    assert code == 0
    section = out[out.index("on 2 processes, per rank:"):].splitlines()
    assert [line.split("  ")[0] for line in section[2:5]] == [
        "replicated (DDP)", "sharded (FSDP), per-window sync", "sharded (FSDP), per-micro-batch sync"]
    assert section[5].startswith(("Both ways", "Per-window sync does not fit", "No accumulation", "Neither"))
    assert_one_error_line(*cli(capsys, "plan", "--memory-budget-mb", "10", "--target-effective-batch", "8",
                               "--processes", "0"), 2, "--processes must be a whole number of at least 1")


def test_plan_refuses_a_bad_budget_with_its_flag(capsys):
    # Refused before the model is measured (seconds): the flag, not the page's label.
    assert_one_error_line(*cli(capsys, "plan", "--memory-budget-mb", "0", "--target-effective-batch", "8"), 2,
                          "--memory-budget-mb must be more than 0")
    assert_one_error_line(*cli(capsys, "plan", "--memory-budget-mb", "10", "--target-effective-batch", "0"), 2,
                          "--target-effective-batch must be a whole number of at least 1")


def test_plan_counts_the_runs_optimizer_steps_and_proposes_the_epochs_that_learn(capsys):
    from gradacc.analysis.learning_steps import advise

    code, out, _ = cli(capsys, "plan", "--max-seq-length", "16", "--memory-budget-mb", "100",
                       "--target-effective-batch", "256")
    assert code == 0
    lines = out.splitlines()
    m, k = map(int, re.search(r"m=(\d+), k=(\d+)", next(line for line in lines if line.startswith("pick: "))).groups())
    found = advise("tiny-bert", 2000, m, k)  # what the page says for the same pick
    assert found["epochs"] > 2 and f"steps: {found['text']}" in lines  # the recipe's 2 epochs are too few
    train_line = next(line for line in lines if line.startswith("train it with: python -m gradacc train "))
    assert f"--micro-batch-size {m} --grad-accum-steps {k} --epochs {found['epochs']} --train-samples 2000" \
        in train_line
    # Data the run trains longer on: its own epochs kept where they give enough.
    code, out, _ = cli(capsys, "plan", "--max-seq-length", "16", "--memory-budget-mb", "100",
                       "--target-effective-batch", "256", "--epochs", "20", "--train-samples", "1000")
    assert "1,000 training examples at 256 a step" in out and "in the 20 epochs of the run" in out
    assert "--epochs 20" in out
