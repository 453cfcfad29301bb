"""The command line: exit codes, one-line errors, JSON events."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradacc.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--train-samples", "48", "--eval-samples", "16", "--epochs", "1", "--max-seq-length", "32"]


def gradacc(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gradacc", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def test_train_json_emits_one_event_per_line_in_order():
    result = gradacc("train", "-m", "8", "-k", "2", "--json", *SMALL)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["event"] for e in lines]
    assert kinds[0] == "run_started" and kinds[-1] == "run_ended"
    assert kinds.count("step") == 3 and kinds.count("eval") == 1
    assert lines[0]["effective_batch"] == 16
    assert lines[-1]["status"] == "completed"


def test_metrics_out_keeps_the_events(tmp_path):
    out = tmp_path / "events.jsonl"
    result = gradacc("train", "-m", "16", "-k", "1", "--metrics-out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    assert "completed after 3 optimizer steps" in result.stdout
    assert [json.loads(l)["event"] for l in out.read_text().splitlines()][-1] == "run_ended"


@pytest.mark.parametrize("args,message", [
    (["-m", "0"], "--micro-batch-size must be a whole number from 1"),
    (["-m", "2.5"], "--micro-batch-size must be a whole number from 1 to 4096; got 2.5."),
    (["-k", "-1"], "--grad-accum-steps must be a whole number from 1"),
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--lr", "0"], "--lr must be greater than 0"),
    (["--backend", "jax"], "invalid choice"),
    (["--model", "/etc"], "outside the allowed folders"),
])
def test_bad_input_is_one_error_line_and_exit_2(args, message, capsys):
    # In-process (a subprocess per case would spend seconds importing torch); main() is the entry point.
    try:
        code = main(["train", *args, *SMALL])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2
    error_lines = captured.err.strip().splitlines()
    assert len(error_lines) == 1 and error_lines[0].startswith("error: ")
    assert message in error_lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_bad_input_exits_2_from_a_real_process_too():
    result = gradacc("train", "-m", "0", *SMALL)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: --micro-batch-size must be a whole number from 1 to 4096; got 0."]


def test_check_json_has_the_main_pair_and_every_case():
    result = gradacc("check", "--backend", "pytorch", "-m", "4", "-k", "2", "--json", "--max-seq-length", "32")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["exact_rel_error"] < 1e-5
    assert set(report["cases"]) == {"equal_windows", "short_last_window", "token_level"}
    assert all({"naive_rel_error", "exact_rel_error"} <= set(c) for c in report["cases"].values())
