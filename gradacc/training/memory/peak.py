"""Peak memory of live tensors, measured on any device (the CPU included, which has no allocator statistics).

``LiveBytes`` is a ``TorchDispatchMode``: every tensor an operator returns inside it is counted once per storage
until that storage is freed (a weak reference to the storage says when), on top of the tensors that existed when
it opened (``hold``: parameters, gradients, optimizer state). Its ``peak`` is the most bytes alive at once:
what ``torch.cuda.max_memory_allocated`` would say for the same tensors on a GPU, without the allocator's rounding,
workspaces or the CUDA context. The config planner (``gradacc.analysis.config_plan``) checks its predictions
against it.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Bytes of storages alive while the mode is open; ``peak`` the most at once, ``current`` now."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.current = 0
        self.peak = 0
        self.phase_peaks: list[int] = []

    def hold(self, tensors) -> None:
        """Count tensors made before the mode opened (parameters, gradients, optimizer state) as alive."""
        for tensor in tensors:
            if torch.is_tensor(tensor):
                self._track(tensor)

    def _track(self, tensor: torch.Tensor) -> None:
        if tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._live and self._refs[key]() is storage:
            return
        size = storage.nbytes()
        self._live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        self._refs[key] = weakref.ref(storage, lambda _, key=key, size=size: self._free(key, size))

    def _free(self, key: int, size: int) -> None:
        if self._live.get(key) == size:
            del self._live[key]
            self._refs.pop(key, None)
            self.current -= size

    def reset_peak(self) -> None:
        self.peak = self.current

    def mark(self) -> None:
        """End a phase: its peak goes to ``phase_peaks``, and the next phase's peak starts from now."""
        self.phase_peaks.append(self.peak)
        self.reset_peak()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)
        return out
