"""The memory budget: measured need, refusal before step 1 and mid-run, the fit, the deployment limit, the CLI."""

import threading

import pytest
import torch

from gradacc import cli
from gradacc.cli import options as cli_options
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.events import Recorder
from gradacc.serving.limits import Limits
from gradacc.serving.manager import RunManager
from gradacc.serving.store import RunStore
from gradacc.training.memory import budget, measure
from gradacc.training.run.engine import train
from gradacc.training.run.job import prepare
from gradacc.units import MB, format_bytes

SMALL = dict(train_samples=256, eval_samples=16, dropout=0.0, max_steps=3)


def measured_need(config: RunConfig) -> budget.Need:
    job = prepare(config.check(), lambda event: None, threading.Event())
    return budget.measure_need(job.model, job.train_examples, job.collate, job.config, job.device, job.precision)


@pytest.fixture(scope="module")
def need64():
    return measured_need(RunConfig(micro_batch_size=64, grad_accum_steps=1, **SMALL))


def budget_between(need, low_m, high_m) -> float:
    """A budget in MB that m=low_m fits and m=high_m does not."""
    return (need.total(low_m) + need.total(high_m)) / 2 / MB


@pytest.mark.parametrize("backend", ["pytorch", "accelerate", "trainer"])
def test_a_run_that_does_not_fit_is_refused_before_step_1_with_its_numbers(need64, backend):
    config = RunConfig(backend=backend, micro_batch_size=64, grad_accum_steps=1,
                       memory_budget_mb=budget_between(need64, 16, 32), **SMALL)
    recorder = Recorder()
    ended = train(config, recorder)
    assert ended["status"] == "failed" and not recorder.of("step") and not recorder.of("run_started")
    details = ended["out_of_memory"]
    assert details["fit"] == {"micro_batch_size": 16, "grad_accum_steps": 4}
    assert details["need_bytes"] == pytest.approx(need64.total(64))
    assert ended["reason"].startswith(
        f"out of memory: micro-batch 64 needs {format_bytes(need64.total(64))} "
        f"(static {format_bytes(need64.static['total'])} + activations 64 × {format_bytes(need64.activations(64) / 64)})"
        f" of a {config.memory_budget_mb:,.0f} MB budget; m=16 with k=4 keeps the effective batch 64 within it")
    assert "on the CPU the budget is enforced from measured bytes" in ended["reason"]


def test_fit_with_accumulation_keeps_the_effective_batch_and_stays_within_the_budget(need64):
    budget_mb = budget_between(need64, 16, 32)
    refused = train(RunConfig(micro_batch_size=64, grad_accum_steps=1, memory_budget_mb=budget_mb, **SMALL))
    fit = refused["out_of_memory"]["fit"]
    recorder = Recorder()
    ended = train(RunConfig(memory_budget_mb=budget_mb, **fit, **SMALL), recorder)
    assert ended["status"] == "completed"
    started = recorder.of("run_started")[0]
    assert started["effective_batch"] == 64 and started["memory_need"]["cap_bytes"] == budget_mb * MB
    for step in recorder.of("step"):  # every measured micro-batch really fitted
        assert started["static_memory"]["total"] + step["activation_bytes"] <= budget_mb * MB


def test_the_need_is_measured_with_the_longest_sequence_and_predicts_a_full_micro_batch(need64):
    # The probe measures 1 and 2 examples; the line must predict what the run's first micro-batch measures.
    recorder = Recorder()
    config = RunConfig(micro_batch_size=64, grad_accum_steps=1, max_seq_length=need64.sequence_length,
                       **SMALL).replace(max_steps=1)
    train(config, recorder)
    # The data is pre-shuffled: the longest examples are not all in the first micro-batch, so it can be
    # shorter than the probe's longest sequence, never longer.
    assert recorder.of("step")[0]["activation_bytes"] <= need64.activations(64) * 1.01


def test_a_later_longer_micro_batch_fails_the_run_mid_way_and_keeps_what_was_logged():
    """Dynamic padding: micro-batches from the 3rd on are padded 4x longer than anything the probe saw."""
    from transformers import DataCollatorWithPadding

    from gradacc.training.sources import models

    tokenizer = models.tiny_bert_tokenizer()
    short = DataCollatorWithPadding(tokenizer, padding="max_length", max_length=16, return_tensors="pt")
    long = DataCollatorWithPadding(tokenizer, padding="max_length", max_length=64, return_tensors="pt")
    calls = {"n": 0}

    def collate(examples):
        calls["n"] += 1
        # Calls 1-2: the budget's probe; 3-4: the first window; later: longer.
        return (short if calls["n"] <= 4 else long)(examples)

    config = RunConfig(micro_batch_size=8, grad_accum_steps=2, max_seq_length=64, **SMALL)
    probe_job = prepare(config.check(), lambda event: None, threading.Event())
    need = budget.measure_need(probe_job.model, probe_job.train_examples, short, probe_job.config, probe_job.device,
                               probe_job.precision)
    # Room for twice the activations of m=8 at 16 tokens; at 64 tokens they are more than 4x larger.
    config = config.replace(memory_budget_mb=(need.static["total"] + 2 * need.activations(8)) / MB)
    recorder = Recorder()
    ended = train(config, recorder, collate=collate)
    assert ended["status"] == "failed" and len(recorder.of("step")) == 1 and ended["steps"] == 1
    assert ended["reason"].startswith("out of memory at micro-batch 3 (8 × 64 tokens): micro-batch 8 needs")
    assert ended["out_of_memory"]["activation_bytes"] > need.activations(8)


def test_a_real_out_of_memory_error_is_reported_with_the_measured_need(need64, monkeypatch):
    """What CUDA does when the capped allocator refuses, raised here on the CPU (no GPU on this machine)."""
    from transformers import BertForSequenceClassification

    original = BertForSequenceClassification.forward
    calls = {"n": 0}

    def forward(self, *args, **kwargs):
        calls["n"] += torch.is_grad_enabled()  # not the no-grad passes that test whether the dropout took
        if calls["n"] > 3:  # past the budget's two probes and the first micro-batch
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BertForSequenceClassification, "forward", forward)
    config = RunConfig(micro_batch_size=64, grad_accum_steps=1, memory_budget_mb=need64.total(64) * 2 / MB, **SMALL)
    ended = train(config)
    assert ended["status"] == "failed"
    assert ended["reason"].startswith("out of memory (the CUDA allocator refused): micro-batch 64 needs")
    assert ended["out_of_memory"]["cap_source"] == "budget"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here or on CI)")
def test_on_cuda_the_allocator_is_capped_at_the_budget_and_a_run_within_it_completes(monkeypatch):
    monkeypatch.setenv("GRADACC_DEVICE", "cuda")
    config = RunConfig(micro_batch_size=64, grad_accum_steps=1, **SMALL)
    need = measured_need(config)
    assert need.device_bytes > 0  # cuBLAS's workspace at least: a real device needs more than the tensors
    fraction = {}
    original = torch.cuda.set_per_process_memory_fraction
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda value, device=None: (fraction.setdefault("values", []).append(value),
                                                    original(value, device)))
    # 1.2 x what it was measured to need, workspaces included: the real allocator lets it finish (before the
    # workspaces were counted, a real H200 refused tiny-bert at 1.5 x and at 4 x).
    recorder = Recorder()
    ended = train(config.replace(memory_budget_mb=need.total(64) * 1.2 / MB), recorder)
    assert ended["status"] == "completed", ended["reason"]
    measured = recorder.of("run_started")[0]["memory_need"]
    total = torch.cuda.get_device_properties(0).total_memory
    assert fraction["values"] == [pytest.approx((measured["outside_bytes"] + measured["cap_bytes"]) / total), 1.0]
    peak = max(step["cuda_peak_bytes"] for step in recorder.of("step"))
    assert peak <= measured["outside_bytes"] + measured["cap_bytes"]


def test_an_out_of_memory_message_names_the_cuda_workspaces_and_fits_around_them():
    config = RunConfig(micro_batch_size=64, grad_accum_steps=1).check()
    error = budget.out_of_memory(micro_batch_size=64, static_bytes=3 * MB, activation_bytes=64 * 0.5 * MB,
                                 fixed_bytes=0.0, cap=budget.Cap(60 * MB, "budget"), config=config,
                                 device_type="cuda", device_bytes=20 * MB)
    # 3 + 20 + 32 = 55 MB fits 60 MB: no error would be raised, but the numbers must add up in the line.
    assert "needs 55.0 MB (static 3.0 MB + activations 64 × 500.0 kB + CUDA workspaces 20.0 MB)" in str(error)
    tight = budget.out_of_memory(micro_batch_size=64, static_bytes=3 * MB, activation_bytes=64 * 0.5 * MB,
                                 fixed_bytes=0.0, cap=budget.Cap(40 * MB, "budget"), config=config,
                                 device_type="cuda", device_bytes=20 * MB)
    # 40 - 3 - 20 = 17 MB for activations: m=32 (16 MB) fits, m=64 (32 MB) does not.
    assert "m=32 with k=2 keeps the effective batch 64 within it" in str(tight)
    assert tight.details["device_bytes"] == 20 * MB
    hopeless = budget.out_of_memory(micro_batch_size=64, static_bytes=3 * MB, activation_bytes=64 * 0.5 * MB,
                                    fixed_bytes=0.0, cap=budget.Cap(20 * MB, "budget"), config=config,
                                    device_type="cuda", device_bytes=20 * MB)
    assert "alone are 3.0 MB, and CUDA workspaces 20.0 MB" in str(hopeless)


def test_static_need_counts_each_optimizers_own_state():
    config = RunConfig().check()
    job = prepare(config, lambda event: None, threading.Event())
    parameters = measure.static_bytes(job.model)["parameters"]
    states = {name: budget.static_need(job.model, config.replace(optimizer=name), job.device)["optimizer_state"]
              for name in ("adamw", "adamw-fused", "sgd", "adafactor")}
    tensors = len(list(job.model.parameters()))
    assert 2 * parameters <= states["adamw"] <= 2 * parameters + 4 * tensors  # two moments + a step count each
    assert states["adamw-fused"] == states["adamw"]
    assert states["sgd"] == parameters  # one momentum buffer
    assert 0 < states["adafactor"] < parameters / 10  # factored second moments only
    # The dry step left the model's own optimizer untouched: nothing allocated on the real parameters.
    assert all(p.grad is None for p in job.model.parameters())


def test_the_budget_is_a_run_setting_with_a_clear_message():
    assert RunConfig(memory_budget_mb=700).check().memory_budget_mb == 700.0
    for bad in (0, -5, float("nan"), "lots", True):
        with pytest.raises(GradaccError, match=r"^Memory budget \(MB\) must be a number greater than 0") as error:
            RunConfig(memory_budget_mb=bad).check()
        assert error.value.field == "memory_budget_mb"


def test_cli_out_of_memory_exits_1_and_a_bad_budget_exits_2(capsys):
    assert cli.main(["train", "-m", "64", "-k", "1", "--memory-budget-mb", "3", "--max-steps", "2",
                     "--train-samples", "128", "--eval-samples", "8"]) == cli_options.EXIT_FAILED
    assert "error: out of memory: micro-batch 64 needs" in capsys.readouterr().err
    assert cli.main(["train", "--memory-budget-mb", "-1"]) == cli_options.EXIT_BAD_INPUT
    assert "error: --memory-budget-mb must be a number greater than 0" in capsys.readouterr().err


# ---- the deployment's limit (GRADACC_MAX_RUN_MEMORY_MB) ----------------------------------------------

def test_the_deployment_limit_is_read_in_limits():
    assert Limits.from_env({}).max_run_memory_mb is None
    limits = Limits.from_env({"GRADACC_MAX_RUN_MEMORY_MB": "6000"})
    assert limits.max_run_memory_mb == 6000 and "runs up to 6,000 MB of memory" in limits.describe()
    with pytest.raises(GradaccError, match="GRADACC_MAX_RUN_MEMORY_MB must be a number"):
        Limits.from_env({"GRADACC_MAX_RUN_MEMORY_MB": "lots"})


def test_a_run_asking_for_far_too_much_is_refused_before_it_allocates_and_the_server_stays_up(tmp_path):
    """m=4096 (its need is measured from 1 and 2 examples) against a 40 MB deployment limit."""
    manager = RunManager(RunStore(tmp_path / "runs.db"), max_run_memory_mb=40, max_run_seconds=0, recover=False)
    try:
        greedy = RunConfig(micro_batch_size=4096, grad_accum_steps=1, train_samples=4096, eval_samples=8, epochs=1)
        rss_before = measure.rss_bytes()
        run_id = manager.submit(greedy, "visitor")
        assert manager.wait(run_id, timeout=120)
        run = manager.get(run_id)
        details = run.ended["out_of_memory"]
        assert run.status == "failed" and not run.of("step")
        assert run.reason.startswith("out of memory: micro-batch 4096 needs")
        assert "but this deployment allows a run at most 40 MB (GRADACC_MAX_RUN_MEMORY_MB)" in run.reason
        assert details["need_bytes"] > 20 * 40 * MB  # far too much ...
        assert measure.rss_bytes() - rss_before < details["activation_bytes"] / 4  # ... and never allocated
        # The server goes on: the next visitor's run trains.
        small = manager.submit(RunConfig(**SMALL), "next visitor")
        assert manager.wait(small, timeout=120) and manager.get(small).status == "completed"
    finally:
        manager.shutdown()


def test_the_cli_applies_the_deployment_limit_too(monkeypatch, capsys):
    monkeypatch.setenv("GRADACC_MAX_RUN_MEMORY_MB", "1")
    assert cli.main(["train", "--max-steps", "1", "--train-samples", "64", "--eval-samples", "8"]) == cli_options.EXIT_FAILED
    assert "but this deployment allows a run at most 1 MB (GRADACC_MAX_RUN_MEMORY_MB)" in capsys.readouterr().err
