"""Every check that needs ranks, in one 2-process launch (process start and imports cost more than the runs).

Run by tests/test_distributed.py as ``torchrun --nproc_per_node 2 tests/training/distributed_worker.py OUT``; each rank
writes what it saw to ``OUT.rank<r>.json``.
"""

import contextlib
import io
import json
import sys

from gradacc.training import distributed
from gradacc.cli import main
from gradacc.config import RunConfig
from gradacc.training.engine import train
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
    seen["cli_check"] = main_check("--backend", "pytorch", "-m", "4", "-k", "2", "--max-seq-length", "32", "--json")
    return seen


if __name__ == "__main__":
    result = work()
    with open(f"{sys.argv[1]}.rank{distributed.rank()}.json", "w", encoding="utf-8") as file:
        json.dump(result, file)
