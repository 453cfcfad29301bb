"""Every FSDP check that needs ranks, in one 2-process launch (starting processes costs more than these runs).

Run by tests/training/test_fsdp.py as ``torchrun --nproc_per_node 2 tests/training/fsdp_worker.py OUT``; each rank
writes what it saw to ``OUT.rank<r>.json``, then leaves as a launched gradacc rank does (``distributed.exit_rank``).
"""

import sys
import json

from gradacc.analysis.equivalence import check
from gradacc.choices import BACKENDS, GRAD_SYNCS
from gradacc.config import RunConfig
from gradacc.events import Recorder
from gradacc.training import distributed
from gradacc.training.run.engine import train

# tiny-bert, 2 ranks × m=4 × k=2: 32 examples, two optimizer steps per run.
SMALL = dict(train_samples=32, eval_samples=8, epochs=1, micro_batch_size=4, grad_accum_steps=2, max_seq_length=32,
             dropout=0.0, num_processes=2)


def run(**overrides) -> list[dict]:
    recorder = Recorder()
    train(RunConfig(**{**SMALL, **overrides}), recorder)
    return recorder.events


def work() -> dict:
    seen = {"runs": {}}
    for backend in BACKENDS:
        for grad_sync in GRAD_SYNCS:
            seen["runs"][f"{backend} {grad_sync}"] = run(backend=backend, fsdp=True, grad_sync=grad_sync)
    seen["runs"]["pytorch ddp"] = run(backend="pytorch")
    # k=4: the bytes sent per window grow k×, the gradient bytes held do not.
    seen["runs"]["pytorch per-micro-batch k=4"] = run(fsdp=True, grad_sync="per-micro-batch", grad_accum_steps=4,
                                                      train_samples=64)
    seen["check"] = check(RunConfig(backend="pytorch", fsdp=True, micro_batch_size=4, grad_accum_steps=2,
                                    max_seq_length=32, num_processes=2), cases=("equal_windows", "token_level"))
    return seen


if __name__ == "__main__":
    result = work()
    with open(f"{sys.argv[1]}.rank{distributed.rank()}.json", "w", encoding="utf-8") as file:
        json.dump(result, file)
    distributed.exit_rank(0)
