"""Several training processes that take turns, one optimizer step at a time, each step timed.

Why: on a small shared machine the speed of a core drifts by 2× within seconds (other processes, a busy
hyper-thread sibling), so two runs timed one after the other differ by more than the few per cent a
benchmark wants to see. In lockstep, step i of every run runs within a fraction of a second of the
others', on the same data (same order), and the per-step ratios cancel the drift.

Each worker process trains normally; its ``StepClock.on_step`` is called at every optimizer step. The
first call says "ready" (step 1 carries lazy initialisation and is not timed); every later call reports
the CPU and wall seconds since the previous "go" and waits for the next one. Waiting costs no CPU time,
and the wall clock restarts at "go", so neither includes the other processes' turns.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback

from gradacc.errors import RunFailed

# A run that needs longer than this for one step (or for its set-up) is stuck, not slow.
TIMEOUT_S = 600


class StepClock:
    """The worker's side: report each step, wait for the coordinator's go."""

    def __init__(self, conn):
        self.conn = conn
        self.started: tuple[float, float] | None = None

    def on_step(self) -> None:
        cpu, wall = time.process_time(), time.perf_counter()
        if self.started is None:
            self.conn.send(("ready",))
        else:
            self.conn.send(("step", cpu - self.started[0], wall - self.started[1]))
        self.conn.recv()  # go
        self.started = (time.process_time(), time.perf_counter())

    def run_done(self) -> None:
        self.started = None
        self.conn.send(("done",))


def _worker_main(conn, target, index, args) -> None:
    try:
        conn.send(("result", target(StepClock(conn), index, *args)))
    except BaseException as error:  # noqa: BLE001 - the coordinator must hear about it, not wait forever
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        conn.send(("error", f"benchmark process {index}: {last}"))
    finally:
        conn.close()


class Lockstep:
    """The coordinator: ``processes`` worker processes, all running ``target(clock, index, *args)``, which
    must make the same number of runs with the same number of steps (each ending with
    ``clock.run_done()``); what ``target`` returns comes back from ``results()``."""

    def __init__(self, processes: int, target, args: tuple, preload: list[str] = ()):
        # forkserver: a clean single-threaded server imports ``preload`` once and forks each worker from it
        # (no state shared with this process, and not N times the seconds torch and transformers take to import).
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([target.__module__, *preload])
        self.workers = {}
        for index in range(processes):
            ours, theirs = context.Pipe()
            process = context.Process(target=_worker_main, args=(theirs, target, index, args), daemon=True)
            process.start()
            theirs.close()
            self.workers[index] = (process, ours)

    def run(self, steps: int) -> dict[int, list[tuple[float, float]]]:
        """One run of ``steps`` optimizer steps in every worker; the (cpu_s, wall_s) of steps 2..steps."""
        names = list(self.workers)
        for name in names:
            self._expect(name, "ready")
        times = {name: [] for name in names}
        for index in range(steps - 1):
            shift = index % len(names)  # rotate who goes first, so no run always follows the same one
            for name in names[shift:] + names[:shift]:
                self.workers[name][1].send("go")
                _, cpu, wall = self._expect(name, "step")
                times[name].append((cpu, wall))
        for name in names:  # release the last step; the runs finish (eval) on their own
            self.workers[name][1].send("go")
        for name in names:
            self._expect(name, "done")
        return times

    def results(self) -> dict[int, object]:
        """What each worker's ``target`` returned, once all runs are done."""
        return {name: self._expect(name, "result")[1] for name in self.workers}

    def _expect(self, name: int, kind: str) -> tuple:
        process, conn = self.workers[name]
        if not conn.poll(TIMEOUT_S):
            raise RunFailed(f"no word from benchmark process {name} for {TIMEOUT_S} s")
        try:
            message = conn.recv()
        except EOFError:
            raise RunFailed(f"benchmark process {name} ended (exit code {process.exitcode})") from None
        if message[0] == "error":
            raise RunFailed(message[1])
        if message[0] != kind:
            raise RunFailed(f"expected {kind!r} from benchmark process {name}, got {message[0]!r}")
        return message

    def close(self) -> None:
        for process, conn in self.workers.values():
            conn.close()
            process.join(timeout=30)
            if process.is_alive():  # our own child, stuck: end it by its handle
                process.terminate()
                process.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
