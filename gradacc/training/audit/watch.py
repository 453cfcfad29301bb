"""The first window of a loop the user wrote, watched as it runs: what the plain-loop and the Accelerate audits share.

The model's forwards are recorded while watching; the window's gradient is judged inside the optimizer step that
closes it, before the step; the scheduler's steps are counted until the next window's first forward. Then
everything installed is removed: the run stays bit-identical to one without the audit. A subclass says when a step
closes the window, how to judge it and how to fix its checks.
"""

from __future__ import annotations

from dataclasses import replace

from gradacc.training.audit.capture import Patches, Recorder, WindowLog
from gradacc.training.audit.verdict import Check, Verdict, publish
from gradacc.training.audit.vocabulary import CheckName
from gradacc.training.compat.torch import ddp_syncs_next_backward

WATCHING, JUDGED, DONE = "watching", "judged", "done"


class WindowWatch:
    """Watches ``module``'s forwards and ``optimizer``'s first window; ``verdict`` after the window's step.
    ``ddp``: the DistributedDataParallel wrapper the loop calls, if known."""

    sync_fix = ""  # how to make a window all-reduce once, in the loop's own terms

    def __init__(self, module, optimizer, loss_fn=None, json_path=None, ddp=None):
        self.module = module
        self.loss_fn = loss_fn
        self.json_path = json_path
        self.state = WATCHING
        self._verdict: Verdict | None = None
        self._ddp = ddp
        # Per micro-batch: did its backward all-reduce? DDP's own flag, read at the forward (no_sync clears it):
        # nothing is installed on the model, so nothing is left behind.
        self.synced: list[bool] = []
        self.recorder = Recorder(module, on_forward=self._on_forward)
        self.recorder.recording = True
        self.log = WindowLog(self.micro_batch_count, optimizer, module)
        self.log.attach()
        self.patches = Patches()
        self.patches.method(optimizer, "step", self._step)

    def micro_batch_count(self) -> int:
        return sum(1 for f in self.recorder.forwards if f.grad)

    def _on_forward(self, grad: bool) -> None:
        if not grad:
            return
        if self.state == JUDGED:  # the next window's first forward: the judged window is over
            self.finish()
        elif self.state == WATCHING:
            self._find_ddp()
            if self._ddp is not None:  # DDP's forward reads it: False inside no_sync(), or set by the loop itself
                self.synced.append(ddp_syncs_next_backward(self._ddp))

    def _find_ddp(self) -> None:
        """Look for a DDP wrapper made after the audit was attached (only the plain loop can meet one)."""

    def _step(self, original, *args, **kwargs):
        if self.state == WATCHING and self._closes_window() and self.micro_batch_count():
            self.recorder.recording = False
            self.state = JUDGED
            self._verdict = self._judge()
        return original(*args, **kwargs)

    def _closes_window(self) -> bool:
        return True

    def _judge(self) -> Verdict:
        raise NotImplementedError

    def finish(self) -> Verdict | None:
        """Stop watching and remove what was installed; the verdict with its scheduler and sync checks (see
        ``_unjudged`` for a window that was not judged)."""
        if self.state == DONE:
            return self._verdict
        state, self.state = self.state, DONE
        self.log.detach()
        self.patches.undo()
        self.recorder.remove()
        if state != JUDGED or self._verdict is None:
            self._verdict = self._unjudged()
        else:
            checks = [self._scheduler_check(), *self._sync_check()]
            self._verdict = replace(self._verdict, checks=self._verdict.checks + tuple(checks))
        if self._verdict is not None and self._is_main_process():
            publish(self._verdict, self.json_path)
        return self._verdict

    def _unjudged(self) -> Verdict | None:
        """The verdict of a watch that ended before a window was judged (None: nothing to say)."""
        return None

    def _scheduler_check(self) -> Check:
        raise NotImplementedError

    def _sync_check(self) -> tuple[Check, ...]:
        if not self.synced:
            return ()
        count = sum(self.synced)
        ok = count <= 1
        return (Check(CheckName.SYNC, ok, f"gradients all-reduced in {count} of {len(self.synced)} micro-batches",
                      None if ok else self.sync_fix),)

    def _is_main_process(self) -> bool:
        return True

    @property
    def verdict(self) -> Verdict | None:
        """The verdict (None until the first window's optimizer step); reading it ends the watch."""
        return self.finish() if self.state == JUDGED else self._verdict
