"""The CUDA paths, as tests: run them on a machine with an NVIDIA GPU (``pytest -m cuda``, or
``python scripts/cuda_checks.py``, which runs exactly these and keeps their figures). Skipped without CUDA, as on
CI and the development machines. What they assert is what one H200 showed (BENCHMARKS.md, section "cuda: one
H200, once"); each test records its figures with ``record_property`` (in the JUnit XML the runner writes).

The suite pins GRADACC_DEVICE=cpu; these tests ask for the GPU themselves. The two older CUDA-only tests (the
allocator capped at the budget, the CUDA peak measured) are in test_budget.py and test_memory.py, marked too.
"""

import math

import pytest
import torch

from gradacc.choices import BACKENDS
from gradacc.config import RunConfig
from gradacc.events import Recorder
from gradacc.units import MB

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here or on CI)")]

EXACT_TOLERANCE = 1e-5  # the CPU's; the H200 measured 9.4e-7 at most


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setenv("GRADACC_DEVICE", "cuda")


def trained(config: RunConfig) -> Recorder:
    from gradacc.training.run.engine import train

    recorder = Recorder()
    train(config, recorder)
    return recorder


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_precision_completes_on_cuda_and_autocast_holds_fewer_activation_bytes(on_cuda, backend,
                                                                                     record_property):
    activations = {}
    for precision in ("fp32", "bf16", "fp16"):  # fp16 with a grad scaler
        recorder = trained(RunConfig(backend=backend, precision=precision, micro_batch_size=8, grad_accum_steps=4,
                                     train_samples=128, eval_samples=32, epochs=1))
        ended, steps = recorder.ended, recorder.of("step")
        assert ended["status"] == "completed", f"{precision}: {ended['reason']}"
        assert recorder.of("run_started")[0]["device"].startswith("cuda")
        assert steps and all(math.isfinite(s["loss"]) for s in steps)
        peaks = [s["cuda_peak_bytes"] for s in steps]
        assert all(peak is not None and peak > 0 for peak in peaks), peaks
        activations[precision] = max(s["activation_bytes"] for s in steps)
        record_property(f"{precision}_loss", [steps[0]["loss"], steps[-1]["loss"]])
        record_property(f"{precision}_cuda_peak_bytes", max(peaks))
    record_property("activation_bytes", activations)
    assert activations["bf16"] < activations["fp32"] and activations["fp16"] < activations["fp32"]


@pytest.mark.parametrize("model, backend", [("tiny-bert", b) for b in BACKENDS] + [("tiny-gpt", "pytorch")])
def test_exact_weights_give_the_full_batch_gradient_on_cuda(on_cuda, model, backend, record_property):
    from gradacc.analysis.equivalence import check

    report = check(RunConfig(model=model, backend=backend, micro_batch_size=4, grad_accum_steps=3), samples=10)
    errors = {case: (result["exact_rel_error"], result["naive_rel_error"]) for case, result in report["cases"].items()}
    record_property("exact_and_naive_rel_error", errors)
    assert errors, "no case was checked"
    assert {case: exact for case, (exact, _) in errors.items() if not exact <= EXACT_TOLERANCE} == {}
    assert errors["short_last_window"][1] > 0.3  # naive ÷k is visibly wrong where windows differ


def test_activations_follow_m_not_k_on_the_real_allocator(on_cuda, record_property):
    from gradacc.bench import memory as memory_bench

    size = dict(memory_bench.QUICK, max_seq_length=64)
    points = memory_bench.measure_all([(8, 4), (32, 1), (8, 1), (8, 2)], size, threads=1)
    by_point = {(p["micro_batch_size"], p["grad_accum_steps"]): p for p in points}
    record_property("points", [{k: p[k] for k in ("micro_batch_size", "grad_accum_steps", "activation_bytes",
                                                 "cuda_peak_bytes")} for p in points])
    assert all(p["cuda_peak_bytes"] for p in points)
    ratio = by_point[(8, 4)]["activation_bytes"] / by_point[(32, 1)]["activation_bytes"]
    assert abs(ratio - memory_bench.RATIO_GOAL) <= memory_bench.RATIO_TOLERANCE, ratio
    assert len({by_point[(8, k)]["activation_bytes"] for k in (1, 2, 4)}) == 1  # k changes nothing held


def test_a_memory_budget_on_the_real_allocator_ends_every_run_cleanly(on_cuda, record_property):
    """Below the measured need the run is refused before step 1; far above it, it completes. Between, the
    allocator's segments decide (see BENCHMARKS.md): a refusal there must still be a clean failed run."""
    import threading

    from gradacc.training.memory import budget
    from gradacc.training.run.job import prepare

    config = RunConfig(micro_batch_size=64, grad_accum_steps=1, max_seq_length=128, train_samples=256,
                       eval_samples=16, dropout=0.0, max_steps=3)
    job = prepare(config.check(), lambda event: None, threading.Event())
    need = budget.measure_need(job.model, job.train_examples, job.collate, job.config, job.device,
                               job.precision).total(64)
    del job
    torch.cuda.empty_cache()
    outcomes = {}
    for factor in (0.8, 1.2, 3.0):
        ended = trained(config.replace(memory_budget_mb=need * factor / MB)).ended
        outcomes[factor] = (ended["status"], ended["steps"], ended["reason"])
        assert ended["status"] in ("completed", "failed")
        if ended["status"] == "failed":
            assert ended["reason"].startswith("out of memory") and "out_of_memory" in ended, ended["reason"]
    record_property("need_bytes", need)
    record_property("outcomes", outcomes)
    assert outcomes[0.8][:2] == ("failed", 0)
    assert outcomes[3.0][0] == "completed", outcomes[3.0]


def test_the_levers_cut_activations_on_cuda_as_on_the_cpu(on_cuda, record_property):
    from gradacc.bench import levers as levers_bench

    rows = {row["row"]: row for row in levers_bench.measure_model("tiny-bert", 32, 64, 1, 1, torch.device("cuda"))["rows"]}
    record_property("rows", {name: {"activations_vs_baseline": row["activations_vs_baseline"],
                                    "cuda_peak_bytes": row["cuda_peak_bytes"]} for name, row in rows.items()})
    assert rows["accumulation"]["activations_vs_baseline"] == pytest.approx(0.25, abs=0.03)
    assert rows["+ checkpointing"]["activations_vs_baseline"] < rows["accumulation"]["activations_vs_baseline"]
    assert rows["combined"]["activations_vs_baseline"] < rows["+ checkpointing"]["activations_vs_baseline"]
    assert all(row["cuda_peak_bytes"] for row in rows.values())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP across processes needs 2 GPUs (NCCL, one per rank)")
def test_fsdp_on_two_gpus_gives_the_full_batch_gradient_both_ways_with_p_and_k_measured(tmp_path, record_property):
    """tests/training/fsdp_worker.py (test_fsdp.py's checks on the CPU) on 2 GPUs: NCCL, Accelerate's own FSDP path
    (no CPU switch), each rank on cuda:LOCAL_RANK. The same figures: ×P gradient bytes held per window, ×k bytes
    sent per micro-batch, the check at the GPU's tolerance for both sync choices."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from support import ROOT, free_port

    out = tmp_path / "seen"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GRADACC_DEVICE": "cuda"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                             str(free_port()), str(ROOT / "tests" / "training" / "fsdp_worker.py"), str(out)],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(Path(f"{out}.rank0.json").read_text())
    runs = seen["runs"]
    for name, events in runs.items():
        assert events[-1]["status"] == "completed", (name, events[-1]["reason"])
        assert events[0]["device"].startswith("cuda"), name
    ratios = {}
    for backend in ("pytorch", "accelerate", "trainer"):
        window = [e for e in runs[f"{backend} per-window"] if e["event"] == "step"][1]["sharding"]
        each = [e for e in runs[f"{backend} per-micro-batch"] if e["event"] == "step"][1]["sharding"]
        ratios[backend] = (window["grad_bytes"][0] / each["grad_bytes"][0],
                           each["grad_comm_bytes"][0] / window["grad_comm_bytes"][0])
    comparison = seen["check"]["grad_sync"]
    record_property("grad_bytes_and_comm_ratios", ratios)
    record_property("check_rel_errors", {sync: comparison[sync]["rel_error"] for sync in ("per-window",
                                                                                          "per-micro-batch")})
    for held, sent in ratios.values():
        assert held == pytest.approx(2, rel=0.01) and sent == 2
    assert comparison["per-window"]["rel_error"] <= EXACT_TOLERANCE
    assert comparison["per-micro-batch"]["rel_error"] <= EXACT_TOLERANCE
    assert all(case["exact_rel_error"] <= EXACT_TOLERANCE for case in seen["check"]["cases"].values())
