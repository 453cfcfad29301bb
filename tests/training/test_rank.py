"""A rank of the app's runs on several processes: ``python -m gradacc.training.run.rank CONFIG.json``, a module of the
training layer (not the command line), started by accelerate launch as ``gradacc.training.run.launch`` does.

Bad input answers in one line per rank without starting anything; one sharded run on 2 ranks through the launcher
(FSDP's gloo threads are what ``distributed.exit_rank`` is for) completes with rank 0's events only. The rank that
dies mid-run is tests/training/test_fsdp.py's (tests/training/dying_rank.py runs this module).
"""

import json
import os
import subprocess
import sys
import threading

import pytest

from gradacc.config import RunConfig
from gradacc.events import Recorder, schema_problems
from gradacc.training.run import launch
from support import ROOT

RANK = "gradacc.training.run.rank"
LAUNCH_COMMAND = launch.command  # the real one (a test replaces it)


def run_rank(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """One rank alone (no launcher: world size 1), as the launcher starts each."""
    return subprocess.run([sys.executable, "-m", RANK, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=180)


def test_a_config_file_that_cannot_be_read_is_one_error_line_and_exit_2(tmp_path):
    missing = run_rank(str(tmp_path / "none.json"))
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr.startswith("error: rank 0: Could not read the config file ")
    assert len(missing.stderr.strip().splitlines()) == 1
    usage = run_rank()
    assert (usage.returncode, usage.stderr) == (2, "error: rank 0: usage: python -m gradacc.training.run.rank "
                                                   "CONFIG.json\n")


def test_a_bad_setting_ends_the_run_on_rank_0s_stdout_and_in_one_error_line(tmp_path, gradacc_home):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(RunConfig(micro_batch_size=0).to_dict()))
    result = run_rank(str(config))
    assert result.returncode == 2, result.stderr[-2000:]
    ended = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["event"], e["status"], e["field"]) for e in ended] == [("run_ended", "failed", "micro_batch_size")]
    assert result.stderr == f"error: rank 0: {ended[0]['reason']}\n"


def test_a_rank_keeps_a_visitors_local_paths_in_the_visitors_folders(tmp_path, gradacc_home):
    """The app's runs are a visitor's: a model folder outside GRADACC_MODEL_DIRS is refused, as in the app."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps(RunConfig(model=str(outside)).to_dict()))
    result = run_rank(str(config), env={"GRADACC_MODEL_DIRS": str(tmp_path / "models")})
    assert result.returncode == 2, result.stderr[-2000:]
    ended = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["event"], e["field"]) for e in ended] == [("run_ended", "model")]
    assert ended[0]["reason"] == f"Model '{outside}' is outside the allowed folders ({tmp_path / 'models'})."


def test_the_deployments_memory_cap_reaches_the_rank(tmp_path, gradacc_home):
    """The launcher passes GRADACC_MAX_RUN_MEMORY_MB on; a bad value is refused in its name."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(RunConfig().to_dict()))
    result = run_rank(str(config), env={"GRADACC_MAX_RUN_MEMORY_MB": "lots"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "error: rank 0: GRADACC_MAX_RUN_MEMORY_MB must be a number greater than 0; got 'lots'.\n"


def test_two_sharded_ranks_through_the_launcher_complete_with_rank_0s_events(gradacc_home):
    recorder = Recorder()
    config = RunConfig(fsdp=True, num_processes=2, train_samples=32, eval_samples=8, epochs=1, micro_batch_size=4,
                       grad_accum_steps=2, max_seq_length=32, dropout=0.0)
    ended = launch.train(config, recorder, threading.Event())
    assert ended["status"] == "completed", ended["reason"]
    assert [e["event"] for e in recorder.events] == ["run_started", "step", "step", "eval", "run_ended"]
    assert [problem for e in recorder.events for problem in schema_problems(e)] == []
    started = recorder.of("run_started")[0]
    assert (started["config"]["num_processes"], started["config"]["fsdp"], started["effective_batch"]) == (2, True, 16)


def test_the_launcher_starts_its_ranks_in_the_training_layer_not_through_the_command_line():
    words = LAUNCH_COMMAND("run.json", 2, 29500)
    assert words[words.index("-m", words.index("--main_process_port")):] == ["-m", RANK, "run.json"]
