"""Bad numbers through the CLI and the app: zero, negative, fractional, absurd, NaN and inf; deployment caps;
micro-batches larger than the data or than memory.

Engine-level validation is in test_config.py; here every such value must come back as one ``error:`` line
and exit 2 from ``python -m gradacc``, and as a message next to its widget (Start disabled, no exception) in
the app. Out of memory is a fault of the run, not of the input: exit 1 and a run status naming the fix.
"""

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from app_support import error_after, metric, open_app, run_until, set_numbers
from attack_support import TINY, TINY_ARGS, assert_one_error_line, cli, sabotage
from support import ROOT

RUN_TIMEOUT_S = 120  # the first run in a process also imports torch and transformers
GOOD = {"micro_batch_size": 8, "grad_accum_steps": 4, "epochs": 1, "learning_rate": 1e-3, "max_seq_length": 64,
        "train_samples": 2000}


# ---- the command line --------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["-m", "0"], "--micro-batch-size must be a whole number from 1 to 4096; got 0."),
    (["-m", "-5"], "--micro-batch-size must be a whole number from 1 to 4096; got -5."),
    (["-m", "2.5"], "--micro-batch-size must be a whole number from 1 to 4096; got 2.5."),
    (["-m", str(10**12)], f"--micro-batch-size must be a whole number from 1 to 4096; got {10**12}."),
    (["-k", "0"], "--grad-accum-steps must be a whole number from 1 to 4096; got 0."),
    (["-k", "-3"], "--grad-accum-steps must be a whole number from 1 to 4096; got -3."),
    (["--epochs", "0"], "--epochs must be a whole number from 1 to 1000; got 0."),
    (["--epochs", str(10**9)], f"--epochs must be a whole number from 1 to 1000; got {10**9}."),
    (["--epochs", "1e9"], "--epochs must be a whole number from 1 to 1000; got 1000000000."),
    (["--max-steps", "0"], "--max-steps must be a whole number from 1 to 10,000,000; got 0."),
    (["--max-steps", str(10**12)], f"--max-steps must be a whole number from 1 to 10,000,000; got {10**12}."),
    (["--lr", "0"], "--lr must be greater than 0 and at most 10; got 0."),
    (["--lr", "-0.001"], "--lr must be greater than 0 and at most 10; got -0.001."),
    (["--lr", "nan"], "--lr must be a finite number; got nan."),
    (["--lr", "inf"], "--lr must be a finite number; got inf."),
    (["--lr=-inf"], "--lr must be a finite number; got -inf."),
    (["--max-seq-length", "4"], "--max-seq-length must be a whole number from 8 to 512; got 4."),
    (["--max-seq-length", "100000"], "--max-seq-length must be a whole number from 8 to 512; got 100000."),
    (["--max-seq-length", "-1"], "--max-seq-length must be a whole number from 8 to 512; got -1."),
    (["--train-samples", "0"], "--train-samples must be a whole number from 1 to 10,000,000; got 0."),
    (["--seed", "abc"], "--seed must be a whole number from 0 to 4,294,967,295; got 'abc'."),
])
def test_cli_refuses_a_bad_number_with_one_error_line_and_exit_2(args, message, capsys):
    # Each bad value comes after the small-run options, so it is the one argparse keeps.
    code, out, err = cli(capsys, "train", *TINY_ARGS, *args)
    assert_one_error_line(code, out, err, 2, message)
    assert out == "", "refused before any run starts"


def test_cli_refuses_sgd_on_a_pretrained_model_without_a_learning_rate_of_its_own(capsys):
    # The recipe for a folder or hub id holds AdamW's rate only: SGD never silently takes it.
    code, out, err = cli(capsys, "train", *TINY_ARGS, "--model", "org/name", "--optimizer", "sgd")
    assert_one_error_line(code, out, err, 2, "--lr: sgd needs one of its own, and the recipe for a pretrained model "
                                             "(a folder or hub id) has none for it (its 5e-05 is AdamW's); set one.")
    assert out == ""


def test_cli_check_names_its_own_flag_for_a_window_too_large(capsys):
    code, out, err = cli(capsys, "check", "-m", "4", "-k", "3", "--samples", "24")
    assert_one_error_line(code, out, err, 2,
                          "--samples must be a whole number from 1 to m×k = 12 (one accumulation window); got 24.")


def test_cli_refuses_a_micro_batch_larger_than_the_data(capsys, one_torch_thread):
    code, out, err = cli(capsys, "train", *TINY_ARGS, "-m", "64")
    assert_one_error_line(code, out, err, 2, "--micro-batch-size must be at most the 48 training examples; got 64.")


@pytest.mark.parametrize("variable,value,args,message", [
    ("GRADACC_MAX_EPOCHS", "3", ["--epochs", "1000"], "--epochs must be at most 3 on this deployment; got 1000."),
    ("GRADACC_MAX_TRAIN_SAMPLES", "100", ["--train-samples", "5000"],
     "--train-samples must be at most 100 on this deployment; got 5000."),
])
def test_cli_applies_the_deployment_caps(variable, value, args, message, capsys, monkeypatch):
    monkeypatch.setenv(variable, value)
    code, out, err = cli(capsys, "train", *TINY_ARGS, *args)
    assert_one_error_line(code, out, err, 2, message)


def test_cli_an_enormous_max_steps_is_capped_by_the_epochs(capsys, one_torch_thread):
    code, out, err = cli(capsys, "train", *TINY_ARGS, "-m", "8", "-k", "2", "--max-steps", "9999999")
    assert code == 0, err
    assert "completed after 3 optimizer steps" in out  # ceil(ceil(48/8)/2): the epoch ends the run


def test_cli_out_of_memory_during_the_run_is_one_error_line_and_exit_1(capsys, monkeypatch, one_torch_thread):
    def out_of_memory(output):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    sabotage(monkeypatch, out_of_memory, after_forwards=2)
    code, out, err = cli(capsys, "train", *TINY_ARGS, "-m", "8", "-k", "2")
    assert_one_error_line(code, out, err, 1, "error: out of memory at micro-batch size 8: lower the micro-batch size",
                          "Memory planner")


REAL_OOM_CHILD = textwrap.dedent("""
    import resource, sys
    import psutil, torch
    from transformers import BertForSequenceClassification  # the lazy imports, before the cap
    from gradacc import cli
    from gradacc.training.sources.models import tiny_bert_tokenizer

    tiny_bert_tokenizer()
    torch.set_num_threads(1)
    cap = psutil.Process().memory_info().vms + int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))  # this process may not grow by more than that
    sys.exit(cli.main(sys.argv[2:]))
""")


def test_cli_a_micro_batch_larger_than_memory_really_runs_out_and_is_handled(tmp_path):
    """A real allocation failure, not a simulated one: the child's address space is capped 1.5 GB above what
    it has after importing, and 512 examples of 512 tokens need more than that in one forward pass."""
    words = " ".join(f"word{i % 50}" for i in range(600))
    data = tmp_path / "long.csv"
    data.write_text("text,label\n" + "".join(f'"{words} {i}",{i % 2}\n' for i in range(640)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADACC_HOME": str(tmp_path / "home"),
           "GRADACC_DATA_DIRS": str(tmp_path), "GRADACC_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
           # tokenizers' thread pool would reserve address space of its own, and Rust aborts when it cannot
           "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, "-c", REAL_OOM_CHILD, str(1_500_000_000), "train",
                             "--dataset", str(data), "-m", "512", "-k", "1", "--epochs", "1",
                             "--max-seq-length", "512", "--train-samples", "512", "--eval-samples", "16"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert_one_error_line(result.returncode, result.stdout, result.stderr, 1,
                          "error: out of memory at micro-batch size 512: lower the micro-batch size")
    assert "failed after 0 optimizer steps" in result.stdout


# ---- the app -------------------------------------------------------------------------------------

@pytest.mark.parametrize("field,values,message", [
    ("micro_batch_size", [0, -4, 10**12], "Micro-batch size (m) must be a whole number from 1 to 4096"),
    ("grad_accum_steps", [0, -2, 10**9], "Accumulation steps (k) must be a whole number from 1 to 4096"),
    ("epochs", [0, -1, 10**6], "Epochs must be a whole number from 1 to 1000"),
    ("learning_rate", [0.0, -1e-3, 1e9], "Learning rate must be greater than 0 and at most 10"),
    ("max_seq_length", [4, -1, 100000], "Max sequence length (tokens) must be a whole number from 8 to 512"),
    ("train_samples", [0, -100], "Training samples must be a whole number from 1 to 10,000,000"),
])
def test_app_refuses_a_bad_number_next_to_its_field(field, values, message, app_home):
    at = open_app()
    for value in values:
        set_numbers(at, "train", {field: value})
        assert not at.exception, [e.value for e in at.exception]
        shown = error_after(at, f"form.train.{field}")
        assert shown is not None and message in shown, (value, shown)
        assert at.button(key="start").disabled, value
    set_numbers(at, "train", {field: GOOD[field]})
    assert error_after(at, f"form.train.{field}") is None
    assert not at.button(key="start").disabled, "a good value makes the form usable again"


def test_app_nan_and_inf_learning_rates_never_reach_a_run(app_home):
    at = open_app()
    recipe_rate = at.number_input(key="form.train.learning_rate").value
    for value in (math.nan, math.inf, -math.inf):
        set_numbers(at, "train", {"learning_rate": value})
        assert not at.exception
        shown = at.number_input(key="form.train.learning_rate").value
        assert math.isfinite(shown) and math.isfinite(at.session_state["train_config"].learning_rate)
        # Refused beside the field, or, as the field may be emptied (an emptied rate is the recipe's again), read
        # as empty and back at the recipe's rate: never the non-finite value.
        refused = "Learning rate must be" in (error_after(at, "form.train.learning_rate") or "")
        assert refused and at.button(key="start").disabled or shown == recipe_rate == \
            at.session_state["train_config"].learning_rate


def test_app_refuses_a_fractional_micro_batch_instead_of_rounding_it(app_home):
    at = open_app()
    set_numbers(at, "train", {"micro_batch_size": 2.5, "grad_accum_steps": 4})
    assert not at.exception
    assert error_after(at, "form.train.micro_batch_size") == \
        "Micro-batch size (m) must be a whole number from 1 to 4096; got 2.5."
    assert metric(at, "Effective batch") == "—" and at.button(key="start").disabled
    set_numbers(at, "train", {"micro_batch_size": 3})
    assert error_after(at, "form.train.micro_batch_size") is None and metric(at, "Effective batch") == "12"


def test_app_refuses_a_micro_batch_larger_than_the_data(app_home):
    at = open_app()
    set_numbers(at, "train", {"train_samples": 48, "micro_batch_size": 64})
    assert "Micro-batch size (m) must be at most the 48 training examples; got 64." in \
        error_after(at, "form.train.micro_batch_size")
    assert at.button(key="start").disabled


def test_app_caps_epochs_and_samples_at_the_deployment_limits(app_home, monkeypatch):
    monkeypatch.setenv("GRADACC_MAX_EPOCHS", "3")
    monkeypatch.setenv("GRADACC_MAX_TRAIN_SAMPLES", "100")
    at = open_app()
    set_numbers(at, "train", {"epochs": 50, "train_samples": 100, "eval_samples": 50})
    assert "Epochs must be at most 3 on this deployment; got 50." in error_after(at, "form.train.epochs")
    set_numbers(at, "train", {"epochs": 3, "train_samples": 10**6})
    assert "Training samples must be at most 100 on this deployment" in error_after(at, "form.train.train_samples")
    assert at.button(key="start").disabled
    set_numbers(at, "train", {"train_samples": 100})
    assert not at.error and not at.button(key="start").disabled


def test_app_out_of_memory_fails_the_run_with_the_fix_and_the_page_stays_usable(app_home, monkeypatch,
                                                                                 one_torch_thread):
    def out_of_memory(output):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    sabotage(monkeypatch, out_of_memory, after_forwards=2)  # the first window (k=2) completes
    at = open_app()
    set_numbers(at, "train", {**TINY, "micro_batch_size": 8})
    at.button(key="start").click().run()
    run_until(at, lambda at: bool(at.error), RUN_TIMEOUT_S, "the run to fail")
    status = at.error[0].value
    assert status.startswith("Failed: out of memory at micro-batch size 8: lower the micro-batch size"), status
    assert "Memory planner" in status
    assert not at.button(key="start").disabled


def test_other_pages_refuse_absurd_numbers_without_an_exception(app_home):
    at = open_app("equivalence")
    m_range, k_range = "Micro-batch size (m) must be a whole number", "Accumulation steps (k) must be a whole number"
    for m, k, field, message in ((0, 4, "micro_batch_size", f"{m_range} from 1 to 4096; got 0."),
                                 (4, -1, "grad_accum_steps", f"{k_range} from 1 to 4096; got -1."),
                                 (10**9, 4, "micro_batch_size", f"{m_range} from 1 to 4096; got 1000000000.")):
        set_numbers(at, "equivalence", {"micro_batch_size": m, "grad_accum_steps": k})
        assert not at.exception
        assert [e.value for e in at.error] == [message], (m, k)  # this one reason, and no other
        assert error_after(at, f"form.equivalence.{field}") == message, (m, k)
        assert at.button(key="run_check").disabled
    at = open_app("planner")
    for length in (0, -16, 100000):
        set_numbers(at, "planner", {"max_seq_length": length})
        assert not at.exception
        assert "Max sequence length (tokens) must be a whole number from 8 to 512" in error_after(at, "form.planner.max_seq_length")
        assert at.button(key="measure").disabled
