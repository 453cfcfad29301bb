"""Memory, measured rather than estimated.

- static bytes: parameters, gradients and optimizer state, summed from the tensors themselves;
- activation bytes of one micro-batch: every tensor autograd saves for backward during the forward pass,
  counted once per storage (views share storage) and excluding the parameters, via
  ``torch.autograd.graph.saved_tensors_hooks``;
- process RSS via psutil; on CUDA, ``torch.cuda.max_memory_allocated`` with the peak reset each step.
"""

from __future__ import annotations

import contextlib

import psutil
import torch
from torch.distributed.tensor import DTensor

_PROCESS = psutil.Process()


def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages among ``tensors`` (shared storage counted once)."""
    seen, total = set(), 0
    for tensor in tensors:
        if tensor is None:
            continue
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def static_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Parameters + gradients + optimizer state; gradients counted as allocated once training starts."""
    params = list(model.parameters())
    parameters = tensor_bytes(params)
    # Gradients take the parameters' size once allocated (same dtype); count them as the steady state.
    gradients = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    optimizer_state = 0
    if optimizer is not None:
        state_tensors = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        optimizer_state = tensor_bytes(state_tensors)
        if not state_tensors:  # before the first step: AdamW keeps two moments per trainable parameter
            optimizer_state = 2 * gradients if isinstance(optimizer, torch.optim.AdamW) else 0
    return {"parameters": parameters, "gradients": gradients, "optimizer_state": optimizer_state,
            "total": parameters + gradients + optimizer_state}


class ActivationMeter:
    """Counts the bytes autograd saves for backward while the context is open (one forward pass).

    Each storage counts at its own element size (a bf16 tensor saved under autocast: 2 bytes an element;
    autocast's bf16 copies of the weights are saved too, and counted: they are real memory). Under gradient
    checkpointing (use_reentrant=False) the checkpoint's own hooks take the tensors saved inside a checkpointed
    layer, so these hooks count only what is kept across the forward pass (layer inputs and what lies outside
    the layers); the one layer recomputed at a time during backward is not in the figure.

    ``on_measured``: called with the bytes after each measured pass (the memory budget checks them).
    """

    def __init__(self, model: torch.nn.Module, on_measured=None):
        # A sharded model's parameters (DTensors) have no storage of their own; the layers they are gathered into
        # for forward are nn.Parameters, which _pack skips.
        self._parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()
                                    if not isinstance(p, DTensor)}
        self._seen: set = set()
        self.bytes = 0
        self.bytes_by_dtype: dict[str, int] = {}
        self.on_measured = on_measured
        self.active = False  # inside measure(): a model that saves activations later (GradCache) asks this

    def _pack(self, tensor: torch.Tensor):
        # A weight or a view of one (a transposed weight) is no activation. FSDP gathers each layer's weights into
        # fresh storage for its forward pass, which the storages noted at the start cannot know.
        if isinstance(tensor, torch.nn.Parameter) or isinstance(tensor._base, torch.nn.Parameter):
            return tensor
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self._parameter_storages and pointer not in self._seen:
            self._seen.add(pointer)
            self.bytes += storage.nbytes()
            dtype = str(tensor.dtype).removeprefix("torch.")
            self.bytes_by_dtype[dtype] = self.bytes_by_dtype.get(dtype, 0) + storage.nbytes()
        return tensor

    @staticmethod
    def _unpack(tensor):
        return tensor

    @contextlib.contextmanager
    def measure(self):
        self._seen.clear()
        self.bytes = 0
        self.bytes_by_dtype = {}
        self.active = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            self.active = False
        if self.on_measured is not None:
            self.on_measured(self.bytes)


def rss_bytes() -> int:
    return _PROCESS.memory_info().rss


def cuda_peak_bytes(device) -> int | None:
    """Peak allocated bytes on ``device`` since the last reset; None when not on CUDA (the CPU fallback)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.max_memory_allocated(device))


def reset_cuda_peak(device) -> None:
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)


def snapshot(activation_bytes: int | None, device, with_rss: bool = True) -> dict:
    """The memory fields of a ``step`` event; ``with_rss=False`` (an un-instrumented run) skips reading RSS."""
    return {"activation_bytes": activation_bytes, "rss_bytes": rss_bytes() if with_rss else None,
            "cuda_peak_bytes": cuda_peak_bytes(device)}
