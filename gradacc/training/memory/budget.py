"""A memory budget that behaves like a device: measure what a run needs before step 1, fail like out-of-memory.

What a run needs, measured (``measure_need``):

- static bytes: parameters and gradients from the model's tensors; optimizer state from the run's own optimizer
  class after a dry step on a *meta-device* copy of the parameters (shapes and dtypes, no data: nothing is
  allocated, and the real optimizer keeps its fresh state);
- activations: what autograd saves for backward (``measure.ActivationMeter``) in a training-mode forward pass of
  the run's longest example alone and of its two longest examples, under the run's levers (autocast,
  gradient checkpointing), straight-line ``fixed + per_example × m`` through the two. Every micro-batch the run
  can see is at most m examples of at most that length. Probing with 1 and 2 examples, not with m, is what lets
  a run that asks for far too much be refused before it allocates it.

- on CUDA, the device's own share: the CUDA libraries' workspaces (cuBLAS keeps tens of MB per stream once it
  has run), the buffers the backward pass allocates for a moment and the allocator's rounding to whole segments,
  measured as what the caching allocator reserves at its peak over one real forward and backward pass of the same
  two examples, less that pass's activations and gradients. Without it the measured need misses most of what a
  small model takes on a GPU, and runs the budget admits are refused by the allocator (see BENCHMARKS.md,
  section "cuda: one H200, once").

During the run every measured micro-batch (the first of each window) is checked against the budget with its
real activation bytes (``Guard.check_activations``): dynamic padding, or data the probe did not see, can make a
later micro-batch larger. On CUDA the allocator is capped as well (``torch.cuda.set_per_process_memory_fraction``,
at the budget above what the process held before the run's probe: another run's tensors are not this run's)
and a real ``torch.OutOfMemoryError`` is reported the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradacc.env import MAX_RUN_MEMORY_MB
from gradacc.errors import RunFailed
from gradacc.training import process_state
from gradacc.units import MB, format_bytes

# torch, transformers and the training modules that import them at their top are imported inside the functions that
# train or measure: the engine, and so the app and `gradacc --help`, imports this module before torch loads
# (tests/core/test_layout.py).

@dataclass(frozen=True)
class Cap:
    """The bytes a run may use, and who set them: the run's own budget or the deployment's limit."""

    bytes: float
    source: str  # "budget" or "deployment"

    def phrase(self) -> str:
        if self.source == "deployment":
            return f"but this deployment allows a run at most {self.bytes / MB:,.0f} MB ({MAX_RUN_MEMORY_MB})"
        return f"of a {self.bytes / MB:,.0f} MB budget"


def cap_for(budget_mb: float | None, max_run_memory_mb: float | None) -> Cap | None:
    """The tighter of the run's budget and the deployment's limit; None when neither is set."""
    caps = [Cap(budget_mb * MB, "budget")] if budget_mb else []
    caps += [Cap(max_run_memory_mb * MB, "deployment")] if max_run_memory_mb else []
    return min(caps, key=lambda cap: cap.bytes) if caps else None


@dataclass(frozen=True)
class Need:
    static: dict  # parameters, gradients, optimizer_state, total (bytes)
    fixed_activation_bytes: float
    activation_bytes_per_example: float
    sequence_length: int  # the longest the run will see
    device_bytes: float = 0.0  # CUDA only: the libraries' workspaces and the backward pass's own buffers
    outside_bytes: float = 0.0  # CUDA only: what the process held before the probe, less this run's parameters

    def activations(self, micro_batch_size: int) -> float:
        return self.fixed_activation_bytes + self.activation_bytes_per_example * micro_batch_size

    def besides_activations(self) -> float:
        """Static bytes and the device's own share: what the run holds whatever its micro-batch."""
        return self.static["total"] + self.device_bytes

    def total(self, micro_batch_size: int) -> float:
        return self.besides_activations() + self.activations(micro_batch_size)

    def to_dict(self) -> dict:
        return {"static": self.static, "fixed_activation_bytes": self.fixed_activation_bytes,
                "activation_bytes_per_example": self.activation_bytes_per_example,
                "sequence_length": self.sequence_length, "device_bytes": self.device_bytes,
                "outside_bytes": self.outside_bytes}


def largest_fitting_micro_batch(static_bytes: float, fixed_bytes: float, per_example_bytes: float, cap_bytes: float,
                                per_process_batch: int) -> int | None:
    """The largest power of two m that divides ``per_process_batch`` (so m × k keeps it exactly) and fits."""
    best, m = None, 1
    while m <= per_process_batch and per_process_batch % m == 0:
        if static_bytes + fixed_bytes + per_example_bytes * m <= cap_bytes:
            best = m
        m *= 2
    return best


class OutOfMemory(RunFailed):
    """A run that does not fit its memory cap; ``details`` carries the figures and the accumulation that fits."""

    def __init__(self, message: str, details: dict):
        super().__init__(message)
        self.details = details


def out_of_memory(*, micro_batch_size: int, static_bytes: float, activation_bytes: float, fixed_bytes: float,
                  cap: Cap, config, device_type: str, where: str = "", device_bytes: float = 0.0) -> OutOfMemory:
    """The error, with its one line: the numbers, and the m and k that keep the effective batch within the cap."""
    m = micro_batch_size
    per_process_batch = m * config.grad_accum_steps
    per_example = (activation_bytes - fixed_bytes) / m
    fit = largest_fitting_micro_batch(static_bytes + device_bytes, fixed_bytes, per_example, cap.bytes,
                                      per_process_batch)
    need = static_bytes + device_bytes + activation_bytes
    workspaces = f"CUDA workspaces {format_bytes(device_bytes)}" if device_bytes else None
    text = (f"out of memory{where}: micro-batch {m} needs {format_bytes(need)} (static {format_bytes(static_bytes)} "
            f"+ activations {m} × {format_bytes(activation_bytes / m)}{f' + {workspaces}' if workspaces else ''}) "
            f"{cap.phrase()}")
    if fit is not None and fit < m:
        text += (f"; m={fit} with k={per_process_batch // fit} keeps the effective batch {config.effective_batch} "
                 "within it")
    elif fit is None:
        text += ("; even a micro-batch of 1 does not fit: the parameters, gradients and optimizer state alone are "
                 f"{format_bytes(static_bytes)}{f', and {workspaces}' if workspaces else ''} (try gradient "
                 "checkpointing, bf16 or a lighter optimizer)")
    if device_type != "cuda":
        text += " (on the CPU the budget is enforced from measured bytes)"
    fit_setting = None if fit is None or fit >= m else {"micro_batch_size": fit,
                                                        "grad_accum_steps": per_process_batch // fit}
    return OutOfMemory(text, {"micro_batch_size": m, "need_bytes": need, "static_bytes": static_bytes,
                              "activation_bytes": activation_bytes, "device_bytes": device_bytes,
                              "cap_bytes": cap.bytes, "cap_source": cap.source, "fit": fit_setting})


class Guard:
    """One run's cap: checked before step 1 from the measured need, then on every measured micro-batch."""

    def __init__(self, need: Need, cap: Cap, config, device):
        self.need, self.cap, self.config, self.device = need, cap, config, device
        self.batch_shape: tuple[int, int] | None = None
        self.micro_batches = 0
        self._capped_cuda = False

    def _error(self, micro_batch_size: int, activation_bytes: float, fixed_bytes: float, where: str = ""):
        return out_of_memory(micro_batch_size=micro_batch_size, static_bytes=self.need.static["total"],
                             activation_bytes=activation_bytes, fixed_bytes=fixed_bytes, cap=self.cap,
                             config=self.config, device_type=self.device.type, where=where,
                             device_bytes=self.need.device_bytes)

    def check_start(self) -> None:
        m = self.config.micro_batch_size
        if self.need.total(m) > self.cap.bytes:
            raise self._error(m, self.need.activations(m), self.need.fixed_activation_bytes)

    def note_batch(self, batch: dict) -> None:
        """Called with every micro-batch before its forward pass: the shape a failure names."""
        self.micro_batches += 1
        rows, length = batch["input_ids"].shape[:2]
        self.batch_shape = (int(rows), int(length))

    def check_activations(self, activation_bytes: int) -> None:
        """A measured micro-batch's real activation bytes against the cap."""
        if self.need.besides_activations() + activation_bytes <= self.cap.bytes:
            return
        rows, length = self.batch_shape or (self.config.micro_batch_size, self.need.sequence_length)
        raise self._error(rows, activation_bytes, 0.0,
                          where=f" at micro-batch {self.micro_batches} ({rows} × {length} tokens)")

    def real_out_of_memory(self) -> OutOfMemory:
        """A real allocator failure (CUDA), reported with the need measured before the run."""
        m = self.config.micro_batch_size
        return self._error(m, self.need.activations(m), self.need.fixed_activation_bytes,
                           where=" (the CUDA allocator refused)")

    def cap_device(self) -> None:
        """On CUDA the budget is real: the caching allocator may not hand out more than the cap."""
        import torch  # here: the app and `gradacc --help` import this module before torch loads

        if self.device.type != "cuda":
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        allowed = self.need.outside_bytes + self.cap.bytes
        torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total), self._device_index())
        self._capped_cuda = True

    def release_device(self) -> None:
        import torch  # here: the app and `gradacc --help` import this module before torch loads

        if self._capped_cuda:
            torch.cuda.set_per_process_memory_fraction(1.0, self._device_index())
            self._capped_cuda = False

    def _device_index(self) -> int:
        """set_per_process_memory_fraction wants an index: a plain "cuda" device means the current one."""
        import torch  # here: the app and `gradacc --help` import this module before torch loads

        return self.device.index if self.device.index is not None else torch.cuda.current_device()


# ---- measuring (imports torch) --------------------------------------------------------------------

def static_need(model, config, device) -> dict:
    """Parameters + gradients from the model; optimizer state from a dry step of the run's optimizer class on
    meta-device stand-ins of the parameters (adamw-fused: torch's fused kernel refuses meta tensors, so the
    unfused AdamW is stepped; it keeps the same state)."""
    # here: torch, and modules that import it; the app and `gradacc --help` import this one before torch loads
    import torch
    from gradacc.training.memory import measure
    from gradacc.training.backends.optimizer import optimizer_for

    static = measure.static_bytes(model)
    stand_ins = []
    for name, parameter in model.named_parameters():
        stand_in = torch.empty_like(parameter, device="meta").requires_grad_(parameter.requires_grad)
        if parameter.requires_grad:
            stand_in.grad = torch.zeros_like(stand_in)
        stand_ins.append((name, stand_in))
    if config.optimizer == "adamw-8bit":  # bitsandbytes has no meta kernels: a zero copy on the device
        stand_ins = [(name, _zero_copy(p, device)) for name, p in model.named_parameters()]
    dry_config = config.replace(optimizer="adamw") if config.optimizer == "adamw-fused" else config
    optimizer = optimizer_for(stand_ins, dry_config, "meta" if config.optimizer != "adamw-8bit" else device)
    optimizer.step()
    state = sum(value.numel() * value.element_size() for values in optimizer.state.values()
                for value in values.values() if torch.is_tensor(value))
    return {**static, "optimizer_state": state, "total": static["parameters"] + static["gradients"] + state}


def _zero_copy(parameter, device):
    import torch  # here: the app and `gradacc --help` import this module before torch loads

    copy = torch.zeros_like(parameter, device=device).requires_grad_(parameter.requires_grad)
    if parameter.requires_grad:
        copy.grad = torch.zeros_like(copy)
    return copy


def guard_for(config, max_run_memory_mb: float | None, model, examples: list[dict], collate, device,
              precision) -> Guard | None:
    """Measure what the run needs and refuse it (``OutOfMemory``) when that exceeds its cap: the tighter of
    ``config.memory_budget_mb`` and the deployment's ``max_run_memory_mb``. None when nothing caps it."""
    cap = cap_for(config.memory_budget_mb, max_run_memory_mb)
    if cap is None:
        return None
    guard = Guard(measure_need(model, examples, collate, config, device, precision), cap, config, device)
    guard.check_start()
    guard.cap_device()
    return guard


def measure_need(model, examples: list[dict], collate, config, device, precision) -> Need:
    """Static bytes and the activation line at the run's longest sequence (see the module's docstring)."""
    # here: torch, and modules that import it; the app and `gradacc --help` import this one before torch loads
    import torch
    from gradacc.training.backends.device import to_device
    from gradacc.training.memory.measure import ActivationMeter

    static = static_need(model, config, device)
    on_cuda = device.type == "cuda"
    held_before = _cuda_reserved(device) if on_cuda else 0.0  # this run's parameters included
    longest = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]), reverse=True)[:2]
    meter = ActivationMeter(model)
    points, length = {}, 0
    was_training = model.training
    model.train()  # dropout masks are activations too
    # The probe must not move the random stream the run's dropout draws from, and putting it back must not undo
    # another thread's seeded init.
    gpus = [device.index or 0] if device.type == "cuda" else []
    with process_state.guard(generator=True), torch.random.fork_rng(devices=gpus):
        for size in range(1, len(longest) + 1):
            batch = to_device(collate([examples[i] for i in longest[:size]]), device)
            length = max(length, int(batch["input_ids"].shape[1]))
            with precision.autocast(), meter.measure():
                outputs = model(**batch)
            points[size] = meter.bytes
            del outputs  # frees the graph before the next pass
        device_bytes = (_cuda_share(model, batch, precision, device, points[len(longest)], held_before)
                        if on_cuda else 0.0)
    model.train(was_training)
    if len(points) == 1:
        fixed, per_example = 0.0, float(points[1])
    else:
        per_example = max(float(points[2] - points[1]), 0.0)
        fixed = max(float(points[1]) - per_example, 0.0)
    return Need(static=static, fixed_activation_bytes=fixed, activation_bytes_per_example=per_example,
                sequence_length=length, device_bytes=device_bytes,
                outside_bytes=max(held_before - static["parameters"], 0.0))


def _cuda_reserved(device) -> float:
    """What the caching allocator holds from the device, less blocks no tensor uses: the figure its cap limits."""
    import torch  # here: the app and `gradacc --help` import this module before torch loads

    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return float(torch.cuda.memory_reserved(device))


def _cuda_share(model, batch, precision, device, activation_bytes: float, held_before: float) -> float:
    """The allocator's reserved peak over one real forward and backward pass above what the process held before
    the probe (``held_before``), less that pass's activations and gradients: the CUDA libraries' workspaces
    (allocated at the probe's first matrix product and kept), the backward pass's own buffers, and the allocator's
    rounding to whole segments (2 MB, 20 MB for blocks of 1-10 MB)."""
    # here: torch, and modules that import it; the app and `gradacc --help` import this one before torch loads
    import torch
    from gradacc.training.memory import measure

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    with precision.autocast():
        loss = model(**batch).loss
    loss.backward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_reserved(device) - held_before
    model.zero_grad(set_to_none=True)  # the run allocates its own; none are left behind by the probe
    return max(float(peak - activation_bytes - measure.static_bytes(model)["gradients"]), 0.0)
