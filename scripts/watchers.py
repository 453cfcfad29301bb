"""A room full of watchers: a run's training throughput while 0, 1, 5 and 20 browser pages watch it.

Starts `streamlit run app.py` pinned to CPU 0 (taskset) and drives Debian's chromium from this process,
pinned to CPU 1 with everything it starts. For each watcher count, one visitor starts a run (m=8, k=4,
tiny-bert, built-in data) and goes to another page (so it does not watch). The run's throughput (samples/s, from
its own step events) is measured over a window with no page open; then N new browser sessions open the run's link
and wait until each shows the run's live status; the window is measured again, the pages close, and a last window
is measured with none. The paired ratio is the middle window to the mean of the two around it, all in one run.
With ``--alternate CYCLES`` each open room is also measured in turns before it closes: its pages halted in the
DevTools debugger (open, connected, but no polls and no drawing), then watching, CYCLES times, ending halted;
each watching window's ratio is to the halted windows on either side, so several pairs come from one room.
/_stcore/health is polled twice a second throughout. Prints one JSON object: per count, samples/s, the paired
ratios, the ratio to the separate runs with no page at all (counts of 0), where the server's core and the
browsers' core went (by process), and health latency (median, max).

    python scripts/watchers.py [--counts 0 20 5 1 0] [--window 30] [--alternate 3] [--profile DIR]
                               [--kdamond-on-browsers-cpu]

Not a test: figures depend on the machine and on what else runs on it (the load average is recorded).
Uses the helpers the browser tests use (scripts/browsing/), so it drives the page exactly as they do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts" / "browsing"), str(ROOT)]  # the helpers the browser tests use too

from chromium import VIEWPORT, launch  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

import st_ui  # noqa: E402
import train_page  # noqa: E402
from app_server import StreamlitServer, wait_for  # noqa: E402

from gradacc.app.pacing import room_poll_seconds  # noqa: E402

SERVER_CPU, BROWSER_CPU = 0, 1
TIMEOUT_MS = 180_000  # per browser action: a busy machine makes a one-core server slow to answer
OPEN_TIMEOUT_S = 420  # for a whole room to show the run's status; then the count is measured with what is open
SETTLE_S = 5.0  # after the pages are up: let their first draws pass before measuring


class HealthProbe(threading.Thread):
    """GET /_stcore/health every ``every`` seconds; keeps (time, seconds) of each answer (None: no answer)."""

    def __init__(self, server: StreamlitServer, every: float = 0.5):
        super().__init__(daemon=True, name="health-probe")
        self.server, self.every = server, every
        self.samples: list[tuple[float, float | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                status, seconds = self.server.health(timeout=10.0)
                self.samples.append((time.time(), seconds if status == 200 else None))
            except OSError:
                self.samples.append((time.time(), None))
            self.done.wait(self.every)

    def between(self, start: float, end: float) -> dict:
        answers = [s for t, s in self.samples if start <= t <= end]
        times = [s for s in answers if s is not None]
        return {"health_checks": len(answers), "health_failed": len(answers) - len(times),
                "health_median_s": round(statistics.median(times), 4) if times else None,
                "health_max_s": round(max(times), 4) if times else None}


def _events(home: Path, run_id: str) -> list[dict]:
    from gradacc.serving.store import STORE_FILENAME, RunStore

    return RunStore(home / STORE_FILENAME).events(run_id)


def throughput(home: Path, run_id: str, start: float, end: float) -> dict:
    """Samples/s of the run between two wall-clock times, from its own stored step events."""
    steps = [e for e in _events(home, run_id) if e.get("event") == "step" and start <= e["time"] <= end]
    if len(steps) < 2:
        return {"steps_in_window": len(steps), "samples_per_s": None}
    first, last = steps[0], steps[-1]
    return {"steps_in_window": len(steps),
            "samples_per_s": round((last["samples_seen"] - first["samples_seen"]) / (last["time"] - first["time"]), 2)}


def throughput_over(home: Path, run_id: str, page, seconds: float) -> float | None:
    """The run's samples/s over the next ``seconds``."""
    start = time.time()
    pause(page, seconds)
    return throughput(home, run_id, start, time.time())["samples_per_s"]


def cpu_busy_ns(cpu: int) -> float:
    """Nanoseconds ``cpu`` has spent on anything but idling (/proc/stat), whoever ran there."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            ticks = [int(x) for x in line.split()[1:9]]  # user nice system idle iowait irq softirq steal
            return (sum(ticks) - ticks[3] - ticks[4]) * 1e9 / os.sysconf("SC_CLK_TCK")
    raise ValueError(f"no cpu{cpu} in /proc/stat")


def thread_times(pid: int) -> dict:
    """CPU and run-queue nanoseconds of each live thread of ``pid`` (/proc's schedstat), and of the whole process
    (its stat, which keeps the time of threads already gone: Streamlit runs each rerun in a thread of its own),
    and the busy time of the server's CPU (what ran there besides the server: the kernel's threads, mostly)."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            on_cpu, waiting, _ = (int(x) for x in (task / "schedstat").read_text().split())
        except (OSError, ValueError):  # the thread ended between the listing and the read
            continue
        times[task.name] = (on_cpu, waiting)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    process_ns = (int(fields[11]) + int(fields[12])) * 1e9 / os.sysconf("SC_CLK_TCK")  # utime + stime
    return {"threads": times, "process_ns": process_ns, "server_cpu_busy_ns": cpu_busy_ns(SERVER_CPU)}


def where_the_server_core_went(before: dict, after: dict, seconds: float) -> dict:
    """Shares of the server's core over the window: the busiest thread (the training run), the rest of the
    process, what else ran on that core (not the server: on this VM mostly the host's memory monitor, kdamond,
    which follows the browsers' memory), and how long the training thread waited for the core while runnable
    (contention, not the GIL)."""
    deltas = {tid: (after["threads"][tid][0] - on_cpu, after["threads"][tid][1] - waiting)
              for tid, (on_cpu, waiting) in before["threads"].items() if tid in after["threads"]}
    training = max(deltas.values(), key=lambda delta: delta[0])
    process = after["process_ns"] - before["process_ns"]
    others = sorted((delta[0] for delta in deltas.values() if delta is not training), reverse=True)
    window_ns = seconds * 1e9
    return {"core_used": round(process / window_ns, 3), "training_thread_on_cpu": round(training[0] / window_ns, 3),
            "training_thread_runnable_waiting": round(training[1] / window_ns, 3),
            "other_threads_on_cpu": round((process - training[0]) / window_ns, 3),
            "not_the_server_on_cpu": round((after["server_cpu_busy_ns"] - before["server_cpu_busy_ns"] - process)
                                           / window_ns, 3),
            "busiest_other_threads": [round(ns / window_ns, 3) for ns in others[:3]]}


class Traffic:
    """What the server sends the watching pages over their websockets: frames and bytes, all pages together."""

    def __init__(self):
        self.frames, self.bytes = 0, 0

    def watch(self, page) -> None:
        page.on("websocket", lambda socket: socket.on("framereceived", self._count))

    def _count(self, payload) -> None:
        self.frames += 1
        self.bytes += len(payload)

    def now(self) -> tuple[int, int]:
        return self.frames, self.bytes


def open_watchers(browser, base_url: str, run_id: str, count: int, traffic: Traffic) -> tuple[list, int]:
    """``count`` new visitors open the run's link at once; returns their contexts and how many pages show the run's
    live status (their sessions poll the run) within OPEN_TIMEOUT_S all together: the count is measured either way,
    so a room the browsers' core cannot open in time is reported, not waited on for ever. Whether each page's
    browser also keeps up drawing the charts is counted apart (``charts_drawn``)."""
    contexts, pages = [], []
    for _ in range(count):
        context = browser.new_context(viewport=VIEWPORT, base_url=base_url)
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        traffic.watch(page)
        page.goto(f"/?run={run_id}", wait_until="commit")  # all load together, as a room opening a link does
        contexts.append(context)
        pages.append(page)
    deadline, showing = time.monotonic() + OPEN_TIMEOUT_S, 0
    for page in pages:
        try:
            expect(page.locator(f".st-key-run-{run_id}-status")).to_contain_text(
                "Running", timeout=max(1_000, (deadline - time.monotonic()) * 1000))
            showing += 1
        except AssertionError:
            pass
    return contexts, showing


def browsers_cpu_seconds(server_pid: int) -> dict[str, float]:
    """CPU seconds used so far on the browsers' CPU, by who used them: chromium's renderers (one per page), its GPU
    process (software drawing: the browsers run with --disable-gpu), the rest of chromium, Playwright's driver,
    and this script (the health probe, counting frames). A memory churner counts as "other"."""
    totals = dict.fromkeys(("renderers", "gpu_process", "chromium_other", "playwright_driver", "this_script",
                            "other"), 0.0)
    server = psutil.Process(server_pid)
    not_browsers = {server_pid, *(p.pid for p in server.children(recursive=True))}
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        if process.pid in not_browsers:
            continue
        try:
            times, command = process.cpu_times(), process.cmdline()
        except psutil.NoSuchProcess:
            continue
        totals[_role(process, command)] += times.user + times.system
    return totals


def _role(process, command: list[str]) -> str:
    if process.pid == os.getpid():
        return "this_script"
    if "--type=renderer" in command:
        return "renderers"
    if "--type=gpu-process" in command:
        return "gpu_process"
    if command and Path(command[0]).name.startswith("chromium"):
        return "chromium_other"
    if command and Path(command[0]).name == "node":
        return "playwright_driver"
    return "other"


class KernelMonitorOnBrowsersCpu:
    """Keeps the kernel's DAMON monitor threads (``kdamond.N``) on the browsers' CPU while the script runs, and gives
    them back their own CPUs after. On this VM the host runs DAMON's proactive reclaim over all physical memory; its
    thread used 0.2 % of a CPU with no browser open and 6 % with twenty pages open, and with the browsers' core full
    it ran mostly on the server's (0.063 of that core in one window): work for the browsers' memory, which a room
    whose browsers are elsewhere would not cause."""

    def __init__(self):
        self.moved: dict[int, set[int]] = {}

    def __enter__(self):
        for process in psutil.process_iter(["name"]):
            if (process.info["name"] or "").startswith("kdamond"):
                try:
                    self.moved[process.pid] = os.sched_getaffinity(process.pid)
                    os.sched_setaffinity(process.pid, {BROWSER_CPU})
                except OSError as error:  # not root, or a kernel that keeps it where it is: measured as it lies
                    self.moved.pop(process.pid, None)
                    print(f"kdamond {process.pid} stays where it is: {error}", file=sys.stderr)
        return self

    def __exit__(self, *_):
        for pid, cpus in self.moved.items():
            try:
                os.sched_setaffinity(pid, cpus)
            except OSError as error:  # it ended, or the kernel refuses now: say so, the machine is left as it is
                print(f"kdamond {pid} could not be given back CPUs {sorted(cpus)}: {error}", file=sys.stderr)


def pause(page, seconds: float) -> None:
    """Wait while Playwright keeps delivering events (``time.sleep`` would hold back the frame counts)."""
    page.wait_for_timeout(seconds * 1000)


def charts_drawn(contexts: list) -> int:
    """How many of the watching pages show at least one line on their loss chart now."""
    return sum(1 for context in contexts
               if st_ui.traces(st_ui.plot(context.pages[0], "Training loss")).count() > 0)


# A stand-in for busy browsers, for the control count "0b": copies 128 MB arrays over and over on the browsers' CPU.
MEMORY_CHURN = "import numpy as np\na = np.ones(16_000_000)\nwhile True:\n    a = a.copy() * 1.0"


class Halt:
    """Halts the watching pages' JavaScript in the DevTools debugger and lets it go again: a halted page stays open
    (its session stays on the server, its websocket connected) but sends no poll and draws nothing, so the room
    can be measured watching and not watching, in turns, without closing and opening twenty pages each time."""

    def __init__(self, contexts: list):
        self.sessions = [context.new_cdp_session(context.pages[0]) for context in contexts]

    def halt(self) -> None:
        for session in self.sessions:
            session.send("Debugger.enable")
            session.send("Debugger.pause")  # at the page's next statement: its next timer, its next poll

    def release(self, page, over_seconds: float) -> None:
        """One page after the other, spread over ``over_seconds`` (a poll period), as their polls were before:
        released together, their overdue timers would fire at once and the room would poll in one burst."""
        for session in self.sessions:
            session.send("Debugger.disable")  # resumes a paused page and drops a pause still pending
            page.wait_for_timeout(over_seconds * 1000 / len(self.sessions))


def alternate(starter, contexts: list, server: StreamlitServer, home: Path, run_id: str, watchers: int,
              window: float, cycles: int) -> dict:
    """The open room measured in turns: halted, watching, halted, ... (``cycles`` watching windows, each between
    two halted ones). Each watching window's ratio is to the mean of the halted windows on either side of it, so
    the drift of the machine cancels; the server's core is read over every window."""
    halt, period = Halt(contexts), room_poll_seconds(watchers)
    halted, watching = [], []

    def measure(into: list) -> None:
        start, before = time.time(), thread_times(server.process.pid)
        pause(starter, window)
        end = time.time()
        into.append({**throughput(home, run_id, start, end),
                     "server_core": where_the_server_core_went(before, thread_times(server.process.pid), end - start)})

    halt.halt()
    pause(starter, SETTLE_S)
    measure(halted)
    for _ in range(cycles):
        halt.release(starter, period)
        pause(starter, period + SETTLE_S)  # every page has polled once more since it was let go
        measure(watching)
        halt.halt()
        pause(starter, SETTLE_S)
        measure(halted)
    halt.release(starter, 0)
    ratios = [w["samples_per_s"] / statistics.mean([a["samples_per_s"], b["samples_per_s"]])
              for w, a, b in zip(watching, halted, halted[1:])
              if w["samples_per_s"] and a["samples_per_s"] and b["samples_per_s"]]
    return {"halted": halted, "watching": watching, "ratios": [round(r, 3) for r in ratios],
            "mean_ratio": round(statistics.mean(ratios), 3) if ratios else None}


def one_count(browser, server: StreamlitServer, home: Path, probe: HealthProbe, watchers: int,
              window: float, profile_dir: Path | None = None, busy_neighbour: bool = False, cycles: int = 0) -> dict:
    starter_context = browser.new_context(viewport=VIEWPORT, base_url=server.url)
    starter_context.set_default_timeout(TIMEOUT_MS)
    starter = starter_context.new_page()
    st_ui.open_app(starter)
    train_page.wait_for_libraries(starter)
    train_page.configure(starter, micro_batch=8, accum_steps=4, epochs=1000, train_samples=2000, eval_samples=50)
    run_id = train_page.start(starter)
    expect(train_page.loss_traces(starter).first).to_be_attached(timeout=120_000)  # training, not loading
    st_ui.go_to(starter, "Code")  # the starter keeps its session (to Stop later) but watches nothing
    # Paired: the same run's throughput with no page open just before the room opens and just after it closes,
    # so the ratio does not carry the spread between runs (20 % between two runs' no-page counts here).
    pause(starter, SETTLE_S)
    before = throughput_over(home, run_id, starter, window)
    opened = time.time()
    traffic = Traffic()
    contexts, showing = open_watchers(browser, server.url, run_id, watchers, traffic)
    ready = time.time()
    # Inherits this process's CPU (the browsers'): how much a busy core next door slows training, no page open.
    churn = subprocess.Popen([sys.executable, "-c", MEMORY_CHURN]) if busy_neighbour else None
    profiler = None
    try:
        pause(starter, SETTLE_S)
        start, cpu_before, sent_before = time.time(), thread_times(server.process.pid), traffic.now()
        browsers_before = browsers_cpu_seconds(server.process.pid)
        if profile_dir is not None:  # what the server's threads do while it is watched (py-spy, on the browsers' CPU)
            py_spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
            profiler = subprocess.Popen([py_spy, "record", "--pid", str(server.process.pid), "--threads",
                                         "--rate", "100", "--duration", str(int(window)), "--format", "raw",
                                         "--nonblocking", "-o", str(profile_dir / f"threads-{run_id}.txt")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pause(starter, window)
        if profiler is not None:
            profiler.wait(timeout=60)
        end, cpu_after, sent_after = time.time(), thread_times(server.process.pid), traffic.now()
        browsers_after = browsers_cpu_seconds(server.process.pid)
    finally:  # a failed count must not leave a memory churner or py-spy running on the browsers' CPU
        for child in (churn, profiler):
            if child is not None and child.poll() is None:
                child.kill()
    result = {"watchers": watchers, "busy_neighbour": busy_neighbour, "run_id": run_id, "pages_open_s": round(ready - opened, 1),
              "pages_showing_status": showing,
              "charts_drawn": charts_drawn(contexts),
              "server_core": where_the_server_core_went(cpu_before, cpu_after, end - start),
              # Of the browsers' one core; at 1.0 the pages want more than it has (they poll and draw late).
              "browsers_core_used": round((sum(browsers_after.values()) - sum(browsers_before.values()))
                                          / (end - start), 3),
              "browsers_core_by_process": {role: round((browsers_after[role] - browsers_before[role]) / (end - start), 3)
                                           for role in browsers_after},
              "frames_per_s": round((sent_after[0] - sent_before[0]) / (end - start), 1),
              "kb_per_s": round((sent_after[1] - sent_before[1]) / (end - start) / 1000, 1),
              **throughput(home, run_id, start, end), **probe.between(opened, end),
              "load_average_1min": round(os.getloadavg()[0], 2)}
    if cycles and watchers:
        result["alternating"] = alternate(starter, contexts, server, home, run_id, watchers, window, cycles)
    for context in contexts:
        context.close()
    pause(starter, SETTLE_S)
    after = throughput_over(home, run_id, starter, window)
    result["same_run_no_page_samples_per_s"] = [before, after]
    if before and after and result["samples_per_s"]:
        result["ratio_to_same_run_no_page"] = round(result["samples_per_s"] / statistics.mean([before, after]), 3)
    ended = any(e.get("event") == "run_ended" for e in _events(home, run_id))
    if ended:  # it trained every epoch before the last window ended: that window is short or empty
        result["run_ended_during_count"] = True
    else:
        st_ui.go_to(starter, "Train")
        st_ui.click(starter, "Stop")
        wait_for(lambda: any(e.get("event") == "run_ended" for e in _events(home, run_id)), 120, "the run to stop")
    starter.context.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", nargs="+", default=["0", "20", "5", "1", "0"],
                        help="watching pages per run, in this order; each 0 is a baseline (their mean is the base); "
                             "0b: no page, but the browsers' CPU kept busy copying memory (a control)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of training measured per count")
    parser.add_argument("--alternate", type=int, default=0, metavar="CYCLES",
                        help="also measure each open room in turns: its pages halted in the debugger (no polls, no "
                             "drawing), then watching, CYCLES times, ending halted")
    parser.add_argument("--kdamond-on-browsers-cpu", action="store_true",
                        help="keep the kernel's DAMON monitor (kdamond, if the machine runs one) on the browsers' CPU "
                             "while measuring: its work grows with the browsers' memory (needs root)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record the server's threads with py-spy during each window into DIR "
                             "(threads-RUN_ID.txt, py-spy's raw format; each count's run id is in the output); "
                             "py-spy must be installed")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {BROWSER_CPU})  # this process, Playwright's driver and chromium: CPU 1
    kernel_monitor = KernelMonitorOnBrowsersCpu() if args.kdamond_on_browsers_cpu else contextlib.nullcontext()
    with kernel_monitor, tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        command = ["taskset", "-c", str(SERVER_CPU), sys.executable, "-m", "streamlit", "run", "app.py",
                   "--server.headless", "true", "--browser.gatherUsageStats", "false",
                   "--server.fileWatcherType", "none"]
        server = StreamlitServer(home, home / "streamlit.log", command=command,
                                 extra_env={"GRADACC_MAX_RUN_SECONDS": "0"})
        probe = HealthProbe(server)
        probe.start()
        results = []
        try:
            with sync_playwright() as playwright:
                browser = launch(playwright)
                for count in args.counts:
                    results.append(one_count(browser, server, home, probe, int(count.removesuffix("b")), args.window,
                                             args.profile, busy_neighbour=count.endswith("b"),
                                             cycles=args.alternate))
                    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
                browser.close()
        finally:
            probe.done.set()
            server.stop()
    # Every count of 0 is a baseline (e.g. --counts 0 20 5 1 0 brackets the others): their mean is the base,
    # and their spread says how much the machine drifted during the run.
    bases = [r["samples_per_s"] for r in results
             if r["watchers"] == 0 and not r["busy_neighbour"] and r["samples_per_s"]]
    base = statistics.mean(bases) if bases else None
    for result in results:
        result["ratio_to_no_page"] = round(result["samples_per_s"] / base, 3) \
            if base and result["samples_per_s"] else None
    print(json.dumps({"cpus": {"server": SERVER_CPU, "browsers": BROWSER_CPU}, "window_s": args.window,
                      "kdamond_moved_to_browsers_cpu": sorted(getattr(kernel_monitor, "moved", ())),
                      "no_page_samples_per_s": bases,
                      "runs": results}, indent=2))


if __name__ == "__main__":
    main()
