"""The CUDA paths, checked and measured once on a machine with an NVIDIA GPU (CI and the CPUs here have none).

    python scripts/cuda_checks.py [--out FOLDER]

Writes FOLDER/cuda_checks.json (rewritten after every section, so a run cut short keeps what it measured):
- the two CUDA-only tests (allocator capped at the budget, CUDA peak measured), with the budget and memory tests;
- every backend at fp32, bf16 and fp16 (fp16 with a grad scaler): status, final loss, eval F1, CUDA peak;
- the memory budget on the real allocator: budgets from 0.8x to 3x the measured need of m=64, and what the
  allocator's own peak was beside the need the budget predicted;
- gradient equivalence on the GPU (naive and exact, every case, every backend, and the causal LM);
- activation bytes and CUDA peak across m at one effective batch and across k at one m (memory bench points);
- the levers (checkpointing, bf16, Adafactor) with CUDA peaks and times (levers bench rows for tiny-bert).
Each section runs on its own: one that fails is recorded with its error and the next one runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADACC_HOME", tempfile.mkdtemp(prefix="gradacc-cuda-"))
os.environ["HF_HUB_OFFLINE"] = "1"

RESULTS: dict = {"sections": {}}


def run_section(name: str, check, out: Path) -> None:
    """Run one check; record its result or its error and its seconds; save everything measured so far."""
    started = time.perf_counter()
    print(f"== {name}", flush=True)
    try:
        result = {"ok": True, "result": check()}
    except Exception as error:  # a failing section is a finding, not the end of the checks
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    result["seconds"] = round(time.perf_counter() - started, 2)
    RESULTS["sections"][name] = result
    (out / "cuda_checks.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"   {name}: {'ok' if result['ok'] else result['error']} ({result['seconds']} s)", flush=True)


def final(recorder) -> dict:
    """What one run ended with, from its events."""
    steps = recorder.of("step")
    evals = recorder.of("eval")
    peaks = [s["cuda_peak_bytes"] for s in steps if s.get("cuda_peak_bytes") is not None]
    ended = recorder.of("run_ended")[-1]
    return {"status": ended["status"], "reason": ended.get("reason"), "steps": ended.get("steps"),
            "first_loss": steps[0]["loss"] if steps else None, "last_loss": steps[-1]["loss"] if steps else None,
            "eval_f1": evals[-1].get("eval_f1") if evals else None,
            "max_cuda_peak_bytes": max(peaks) if peaks else None,
            "max_activation_bytes": max((s["activation_bytes"] or 0) for s in steps) if steps else None,
            "wall_s": round(ended.get("wall_s") or 0, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "cuda-out")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    RESULTS["machine"] = {"python": platform.python_version(), "torch": torch.__version__,
                          "cuda_available": torch.cuda.is_available(),
                          "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                          "cuda_total_bytes": (torch.cuda.get_device_properties(0).total_memory
                                               if torch.cuda.is_available() else None)}
    import accelerate
    import transformers
    RESULTS["machine"].update(transformers=transformers.__version__, accelerate=accelerate.__version__)
    print(json.dumps(RESULTS["machine"]), flush=True)

    from gradacc.analysis import equivalence
    from gradacc.bench import levers as levers_bench
    from gradacc.bench import memory as memory_bench
    from gradacc.config import RunConfig
    from gradacc.events import Recorder
    from gradacc.training import budget
    from gradacc.training.engine import quiet_libraries, train
    from gradacc.training.job import pick_device, prepare
    from gradacc.units import MB

    quiet_libraries()
    device = pick_device()
    RESULTS["machine"]["gradacc_device"] = str(device)

    def tests():
        # The suite pins GRADACC_DEVICE=cpu; the two CUDA tests ask for the GPU themselves.
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra",
                               "tests/training/test_memory.py", "tests/training/test_budget.py"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
        return {"returncode": done.returncode, "summary": done.stdout.strip().splitlines()[-1:]}

    def precisions():
        runs = {}
        for backend in ("pytorch", "accelerate", "trainer"):
            for precision in ("fp32", "bf16", "fp16"):
                recorder = Recorder()
                train(RunConfig(backend=backend, precision=precision, micro_batch_size=8, grad_accum_steps=4,
                                train_samples=512, eval_samples=64, epochs=1), recorder)
                runs[f"{backend}/{precision}"] = final(recorder)
                print(f"   {backend}/{precision}: {runs[f'{backend}/{precision}']}", flush=True)
        return runs

    def budget_sweep():
        config = RunConfig(micro_batch_size=64, grad_accum_steps=1, max_seq_length=128, train_samples=512,
                           eval_samples=16, dropout=0.0, max_steps=3)
        job = prepare(config.replace().validate(), lambda event: None, threading.Event())
        need = budget.measure_need(job, job.precision)
        del job
        torch.cuda.empty_cache()
        unbounded = Recorder()
        train(config, unbounded)
        rows = {"need": need.to_dict(), "need_total_bytes": need.total(64), "uncapped": final(unbounded)}
        for factor in (0.8, 1.0, 1.05, 1.2, 1.5, 2.0, 3.0):
            recorder = Recorder()
            train(config.replace(memory_budget_mb=need.total(64) * factor / MB), recorder)
            rows[f"budget {factor}x need"] = final(recorder)
            print(f"   {factor}x: {rows[f'budget {factor}x need']}", flush=True)
        return rows

    def equivalence_checks():
        reports = {}
        for backend in ("pytorch", "accelerate", "trainer"):
            reports[backend] = equivalence.check(RunConfig(backend=backend, micro_batch_size=4, grad_accum_steps=3),
                                                 samples=10)
        reports["tiny-gpt"] = equivalence.check(RunConfig(model="tiny-gpt", micro_batch_size=4, grad_accum_steps=3),
                                                samples=10)
        return reports

    def activations():
        size = dict(memory_bench.FULL, max_seq_length=128, fresh_process=False)
        points = [(m, size["effective_batch"] // m) for m in memory_bench.micro_batches(size["effective_batch"])]
        points += [(size["fixed_m"], k) for k in size["ks"]]
        return {"size": size, "points": memory_bench.measure_all(points, size, threads=1)}

    def lever_rows():
        return levers_bench.measure_model("tiny-bert", 32, 128, 5, 3, device)

    for name, check in (("tests", tests), ("precisions", precisions), ("budget on the real allocator", budget_sweep),
                        ("gradient equivalence", equivalence_checks), ("activations across m and k", activations),
                        ("levers", lever_rows)):
        run_section(name, check, out)
    print(json.dumps({name: s["ok"] for name, s in RESULTS["sections"].items()}), flush=True)
    return 0 if all(s["ok"] for s in RESULTS["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
