"""One rank of a run on several processes that the app starts (``gradacc.training.run.launch``):

    accelerate launch --multi_gpu --num_processes P ... -m gradacc.training.run.rank CONFIG.json

(``torchrun --nproc_per_node P -m gradacc.training.run.rank CONFIG.json`` starts the same ranks.) Every rank trains
``CONFIG.json``, a ``RunConfig`` as JSON, on ``num_processes`` = the launch's ranks. Rank 0 prints each event as one
JSON line on stdout, which the launcher streams to the app. A rank whose run fails says why in one line on stderr,
``error: rank N: reason`` (the launcher reports the first), and exits 2 for a bad setting, 1 otherwise. A visitor's
run: local paths stay in the visitors' folders (GRADACC_DATA_DIRS / GRADACC_MODEL_DIRS), and the deployment's cap
on a run's memory (GRADACC_MAX_RUN_MEMORY_MB, which the launcher passes on) holds as in the app's own process.

Every rank joins one process group (``distributed.init_process_group``, with its timeout) when its job is prepared,
and ends through ``distributed.exit_rank``: it leaves the group, then exits without the interpreter's teardown (after
FSDP, a gloo thread would abort it there).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback

from gradacc import env, events
from gradacc.config import RunConfig
from gradacc.errors import GradaccError, one_line
from gradacc.training import distributed
from gradacc.training.run.engine import train
from gradacc.training.run.options import RunOptions

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2  # as the command line's


def main(argv: list[str]) -> int:
    """Train the config file ``argv[0]`` on this rank; the exit code."""
    if len(argv) != 1:
        return _failed("usage: python -m gradacc.training.run.rank CONFIG.json", EXIT_BAD_INPUT)
    warning = distributed.launch_warning()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        config = read_config(argv[0])
        options = RunOptions(confinement=None,  # None: the visitors' folders
                             max_run_memory_mb=env.number(os.environ, env.MAX_RUN_MEMORY_MB, 0.0) or None)
    except GradaccError as error:
        return _failed(error.message, EXIT_BAD_INPUT)
    ended = train(config, print_event if distributed.is_main_process() else None, threading.Event(), options)
    if ended["status"] == events.FAILED:
        return _failed(ended["reason"], EXIT_BAD_INPUT if ended.get("field") else EXIT_FAILED)
    return EXIT_OK


def read_config(path: str) -> RunConfig:
    """The run's config from its JSON file; ``num_processes`` is the launch's."""
    try:
        with open(path, encoding="utf-8") as file:
            values = json.load(file)
    except (OSError, ValueError) as error:
        raise GradaccError(f"Could not read the config file {path!r}: {error}", "config") from None
    if not isinstance(values, dict):
        raise GradaccError(f"The config file {path!r} holds no JSON object.", "config")
    return RunConfig.from_dict(values).replace(num_processes=distributed.world_size())


def print_event(event: dict) -> None:
    print(events.to_json(event), flush=True)


def _failed(reason: str, code: int) -> int:
    print(f"error: rank {distributed.rank()}: {reason}", file=sys.stderr)
    return code


if __name__ == "__main__":
    try:
        exit_code = main(sys.argv[1:])
    except KeyboardInterrupt:
        exit_code = _failed("interrupted", EXIT_FAILED)
    except Exception as unexpected:  # noqa: BLE001 - the traceback for the log, then the one line the launcher reads
        traceback.print_exc()
        exit_code = _failed(one_line(unexpected), EXIT_FAILED)
    distributed.exit_rank(exit_code)
