"""The one event stream every backend emits: plain JSON-ready dicts.

``run_started`` → ``step`` per optimizer step → ``eval`` per epoch → ``run_ended``. The app, the run
store, the CLI and the benchmarks all read these and nothing else, so a backend can change freely.

Each kind is declared once below as a TypedDict with every field it may carry (``NotRequired``: present only
in some runs); the factories build them, and ``schema_problems`` checks an event against its declaration (the
tests run it on every event of every backend, failures included). A new field goes into the factory and its
TypedDict, nowhere else.
"""

# No ``from __future__ import annotations``: the TypedDicts' NotRequired must be seen at class creation.
import json
import time
import types
import typing
import uuid
from pathlib import Path
from typing import Callable, Literal, NotRequired, TypedDict, Union

from gradacc.errors import GradaccError

EventSink = Callable[[dict], None]

RUN_STARTED, STEP, EVAL, RUN_ENDED = "run_started", "step", "eval", "run_ended"
COMPLETED, STOPPED, FAILED, INTERRUPTED = "completed", "stopped", "failed", "interrupted"


class StaticMemory(TypedDict):
    """Bytes the run holds whatever the micro-batch: parameters, gradients, optimizer state, their sum."""
    parameters: float
    gradients: float
    optimizer_state: float
    total: float


class MemoryNeed(TypedDict):
    """What a capped run was measured to need before step 1 (training.budget.Need), and what caps it."""
    static: StaticMemory
    fixed_activation_bytes: float
    activation_bytes_per_example: float
    sequence_length: int
    device_bytes: float
    outside_bytes: float
    cap_bytes: float
    cap_source: str


class PitfallFigures(TypedDict):
    """In a run with pitfalls, what the right loop would have done at this step (training.pitfalls)."""
    planned_lr: float
    grad_norm_stepped: float
    grad_norm_right: float
    grad_cosine: float | None
    examples_stepped: int
    examples_seen: int
    examples_trained: int
    loss_right: float


class ShardingFigures(TypedDict):
    """In a sharded (FSDP) run, what each rank measured in this window, one list entry per rank (training.fsdp):
    ``grad_bytes``, the most gradient bytes it held after a backward (its shard, or the unsharded gradients a
    per-window sync accumulates); ``grad_peak_bytes``, the same or more: also the reduce-scatter's buffers at its
    call; ``grad_comm_bytes`` and ``grad_comm_calls``, the gradient bytes it handed to reduce-scatter and how many
    calls; ``param_comm_bytes``, the parameter bytes it handed to all-gather; ``window_s``, the window's seconds
    from its first micro-batch to the end of its optimizer step."""
    grad_sync: Literal["per-window", "per-micro-batch"]
    grad_bytes: list[int]
    grad_peak_bytes: list[int]
    grad_comm_bytes: list[int]
    grad_comm_calls: list[int]
    param_comm_bytes: list[int]
    window_s: list[float]


class OutOfMemoryFigures(TypedDict):
    """A run past its memory cap (training.budget): the figures, and ``fit``, the micro-batch size and
    accumulation that keep its effective batch within the cap (None when even m=1 does not fit)."""
    micro_batch_size: int
    need_bytes: float
    static_bytes: float
    activation_bytes: float
    device_bytes: float
    cap_bytes: float
    cap_source: str
    fit: dict | None


class RunStartedEvent(TypedDict):
    event: Literal["run_started"]
    time: float
    config: dict  # RunConfig.to_dict()
    backend: str
    effective_batch: int
    total_steps: int
    steps_per_epoch: int
    train_examples: int
    eval_examples: int
    static_memory: StaticMemory
    device: str
    notes: NotRequired[list[str]]  # what the data preparation changed or chose (rows dropped, split held out, ...)
    memory_need: NotRequired[MemoryNeed]  # only in a run with a memory cap


class StepEvent(TypedDict):
    event: Literal["step"]
    time: float
    step: int
    epoch: int
    samples_seen: int
    tokens_seen: int
    micro_batches: int
    loss: float
    grad_norm: float | None
    lr: float
    elapsed_s: float
    # CPU seconds of the training thread since the run started: the step's own work, which another process's load
    # does not stretch (what the headline compares). Only on the CPU with one torch thread (other threads' work,
    # and a GPU's, would not be in it).
    cpu_s: NotRequired[float]
    samples_per_s: float
    sync_rounds: int | None  # DDP gradient all-reduces in this window; None on one process
    activation_bytes: int | None  # the memory fields (training.memory.snapshot)
    rss_bytes: int | None
    cuda_peak_bytes: int | None
    pitfall: NotRequired[PitfallFigures]  # only in a run with pitfalls
    sharding: NotRequired[ShardingFigures]  # only in a sharded (FSDP) run


class EvalEvent(TypedDict):
    event: Literal["eval"]
    time: float
    epoch: int
    step: int
    eval_loss: float
    eval_accuracy: float | None
    eval_f1: float | None
    majority_f1: float | None  # classification: the scores of always predicting the most frequent label...
    majority_accuracy: NotRequired[float | None]
    labels_predicted: NotRequired[int | None]  # ...and how many different labels the model predicted (1: collapsed)
    eval_perplexity: float | None
    eval_next_token_accuracy: float | None
    eval_mrr_at_10: float | None  # contrastive: each held-out query among all held-out positives
    eval_recall_at_1: float | None


class RunEndedEvent(TypedDict):
    event: Literal["run_ended"]
    time: float
    status: Literal["completed", "stopped", "failed", "interrupted"]
    reason: str | None
    steps: int
    wall_s: float
    field: str | None
    warnings: list[str]
    out_of_memory: NotRequired[OutOfMemoryFigures]  # only in a run past its memory cap


MEMORY_FIELDS = ("activation_bytes", "rss_bytes", "cuda_peak_bytes")  # StepEvent's, from training.memory.snapshot
SCHEMA: dict[str, type] = {RUN_STARTED: RunStartedEvent, STEP: StepEvent, EVAL: EvalEvent, RUN_ENDED: RunEndedEvent}


def schema_problems(event: dict) -> list[str]:
    """Where ``event`` departs from its kind's declaration: an unknown kind or key, a missing required key, a
    value of the wrong type (an int passes for a float; a bool passes for neither). Empty when it conforms."""
    declared = SCHEMA.get(event.get("event")) if isinstance(event, dict) else None
    if declared is None:
        return [f"unknown event kind {event.get('event') if isinstance(event, dict) else event!r}"]
    return _typed_dict_problems(event, declared, event["event"])


def _typed_dict_problems(value: dict, declared: type, where: str) -> list[str]:
    hints = typing.get_type_hints(declared)
    problems = [f"{where}: unknown key {key!r}" for key in value if key not in hints]
    problems += [f"{where}: missing {key!r}" for key in sorted(declared.__required_keys__) if key not in value]
    for key, hint in hints.items():
        if key in value:
            problems += _type_problems(value[key], hint, f"{where}.{key}")
    return problems


def _type_problems(value, hint, where: str) -> list[str]:
    origin = typing.get_origin(hint)
    if origin is NotRequired:
        return _type_problems(value, typing.get_args(hint)[0], where)
    if origin in (Union, types.UnionType):
        options = [_type_problems(value, option, where) for option in typing.get_args(hint)]
        return [] if any(not found for found in options) else [f"{where}: {value!r} is not {hint}"]
    if origin is Literal:
        return [] if value in typing.get_args(hint) else [f"{where}: {value!r} is not one of {typing.get_args(hint)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not a list"]
        (item,) = typing.get_args(hint)
        return [problem for i, v in enumerate(value) for problem in _type_problems(v, item, f"{where}[{i}]")]
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r} is not None"]
    if typing.is_typeddict(hint):
        return _typed_dict_problems(value, hint, where) if isinstance(value, dict) else [f"{where}: not a dict"]
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    return [] if ok else [f"{where}: {value!r} is not {hint.__name__}"]


def _event(kind: str, **fields) -> dict:
    return {"event": kind, "time": time.time(), **fields}


def run_started(*, config: dict, effective_batch: int, total_steps: int, steps_per_epoch: int,
                train_examples: int, eval_examples: int, static_memory: dict, device: str,
                notes: list[str] | None = None, memory_need: dict | None = None) -> RunStartedEvent:
    """``notes``: what preparing the data changed or chose, one line each. ``memory_need``: in a run with a
    memory cap, what it was measured to need and the cap (absent otherwise)."""
    event = _event(RUN_STARTED, config=config, backend=config["backend"], effective_batch=effective_batch,
                   total_steps=total_steps, steps_per_epoch=steps_per_epoch, train_examples=train_examples,
                   eval_examples=eval_examples, static_memory=static_memory, device=device)
    if notes is not None:
        event["notes"] = list(notes)
    if memory_need is not None:
        event["memory_need"] = memory_need
    return event


def step(*, step: int, epoch: int, samples_seen: int, tokens_seen: int, micro_batches: int, loss: float,
         grad_norm: float | None, lr: float, elapsed_s: float, memory: dict, sync_rounds: int | None = None,
         pitfall: dict | None = None, cpu_s: float | None = None, sharding: dict | None = None) -> StepEvent:
    """``memory``: the memory fields (MEMORY_FIELDS, training.memory.snapshot); one not measured is None.
    ``sync_rounds``: DDP gradient all-reduces (one per bucket) in this window; None on one process.
    ``pitfall``: in a run with pitfalls, what the right loop would have done at this step (training.pitfalls):
    planned_lr, grad_norm_stepped, grad_norm_right and grad_cosine, examples_stepped, examples_seen and examples_trained
    (all steps so far), loss_right; absent otherwise. ``cpu_s``: see StepEvent; None leaves it out. ``sharding``:
    in a sharded run, each rank's measured figures (ShardingFigures); absent otherwise."""
    unknown = set(memory) - set(MEMORY_FIELDS)
    if unknown:  # a new memory figure is declared in StepEvent and MEMORY_FIELDS first
        raise TypeError(f"step: unknown memory field(s) {sorted(unknown)}")
    event = _event(STEP, step=step, epoch=epoch, samples_seen=samples_seen, tokens_seen=tokens_seen,
                   micro_batches=micro_batches, loss=loss, grad_norm=grad_norm, lr=lr, elapsed_s=elapsed_s,
                   samples_per_s=samples_seen / elapsed_s if elapsed_s > 0 else 0.0, sync_rounds=sync_rounds,
                   **{name: memory.get(name) for name in MEMORY_FIELDS})
    if pitfall is not None:
        event["pitfall"] = pitfall
    if cpu_s is not None:
        event["cpu_s"] = cpu_s
    if sharding is not None:
        event["sharding"] = sharding
    return event


# Every eval event has all of these; a task fills what it has (classification: accuracy and F1, and the F1 of
# always predicting the most frequent label; causal-lm: perplexity and next-token accuracy; contrastive: MRR@10 and
# recall@1 of each held-out query among all held-out positives), the others are None.
EVAL_METRICS = ("eval_loss", "eval_accuracy", "eval_f1", "majority_f1", "eval_perplexity", "eval_next_token_accuracy",
                "eval_mrr_at_10", "eval_recall_at_1")
# A classifier's eval event also carries these beside its scores (not scores themselves): the accuracy of always
# predicting the most frequent label and how many different labels the model predicted. Events recorded before
# they existed lack them.
BASELINE_METRICS = ("majority_f1", "majority_accuracy", "labels_predicted")


def eval_(*, epoch: int, step: int, eval_loss: float, eval_accuracy: float | None = None,
          eval_f1: float | None = None, majority_f1: float | None = None, eval_perplexity: float | None = None,
          eval_next_token_accuracy: float | None = None, eval_mrr_at_10: float | None = None,
          eval_recall_at_1: float | None = None, majority_accuracy: float | None = None,
          labels_predicted: int | None = None) -> EvalEvent:
    """``majority_f1``, ``majority_accuracy``: F1 and accuracy of always predicting the eval set's most frequent
    label (the floor to beat); ``labels_predicted``: how many different labels the model predicted."""
    event = _event(EVAL, epoch=epoch, step=step, eval_loss=eval_loss, eval_accuracy=eval_accuracy, eval_f1=eval_f1,
                   majority_f1=majority_f1, eval_perplexity=eval_perplexity,
                   eval_next_token_accuracy=eval_next_token_accuracy, eval_mrr_at_10=eval_mrr_at_10,
                   eval_recall_at_1=eval_recall_at_1)
    if labels_predicted is not None:  # a classifier's: the other tasks' events stay as they were
        event.update(majority_accuracy=majority_accuracy, labels_predicted=labels_predicted)
    return event


def run_ended(*, status: str, reason: str | None, steps: int, wall_s: float, field: str | None = None,
              warnings: list[str] | None = None, out_of_memory: dict | None = None) -> RunEndedEvent:
    """``field`` names the setting at fault when the run failed on bad input (None for a fault in training).
    ``warnings``: one line per sign that a run went badly (empty when all is well; see training.health).
    ``out_of_memory``: a run past its memory cap — the figures, and ``fit``: the m and k that keep its effective
    batch within the cap (None when even m=1 does not fit)."""
    event = _event(RUN_ENDED, status=status, reason=reason, steps=steps, wall_s=wall_s, field=field,
                   warnings=list(warnings or []))
    if out_of_memory is not None:
        event["out_of_memory"] = out_of_memory
    return event


def new_run_id() -> str:
    """Sortable by start time and unique: 20250101-120000-1a2b3c (a folder name, a tracker's run name)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def to_json(event: dict) -> str:
    return json.dumps(event, default=str)


class Recorder:
    """An event sink that keeps every event in order (tests, benchmarks, the equivalence check)."""

    def __init__(self):
        self.events: list[dict] = []

    def __call__(self, event: dict) -> None:
        self.events.append(event)

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    @property
    def ended(self) -> dict | None:
        ended = self.of(RUN_ENDED)
        return ended[-1] if ended else None


def read_events(path: str | Path) -> list[dict]:
    """Events from a ``--metrics-out`` JSONL file (GradaccError with the file's name when unreadable)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise GradaccError(f"Could not read {str(path)!r}: {getattr(error, 'strerror', None) or error}.") from None
    found = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                event = json.loads(line)
            except ValueError:
                raise GradaccError(f"{Path(path).name!r} line {number} is not JSON; pass a file written by "
                                   "--metrics-out.") from None
            if isinstance(event, dict) and "event" in event:
                found.append(event)
    if not any(e["event"] == STEP for e in found):
        ended = next((e for e in reversed(found) if e["event"] == RUN_ENDED), None)
        if ended is not None:  # a run that failed before its first step: say why, not that the file is wrong
            reason = f" ({ended['reason']})" if ended.get("reason") else ""
            raise GradaccError(f"{Path(path).name!r} is a run that {ended.get('status') or FAILED} before its first "
                               f"step{reason}: it has no loss to compare.")
        raise GradaccError(f"{Path(path).name!r} has no training steps; pass a file written by --metrics-out.")
    return found
