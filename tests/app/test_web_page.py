"""A demo or runs as one self-contained web page (python -m gradacc export-html): frames at the recorded pace, the
Demos page's view of them (panels, headline and the line under it, every chart, the table), plotly inlined; bad
input refused in one line naming the argument."""

import json
import re

from attack_support import assert_one_error_line, cli
from support import recorded_run, write_events

from gradacc.analysis import demos
from gradacc.app import charts, web_page
from gradacc.app.replay import frames as replay_frames


def replay_data(page: str) -> dict:
    return json.loads(re.search(r"const REPLAY = (.*);\n", page).group(1).replace("<\\/", "</"))


def chart_at(data: dict, name: str, frame_index: int) -> dict:
    """A chart as the page draws it at a frame: the last delta sent up to it, its traces cut as replay.js cuts them."""
    delta = next(frame["charts"][name] for frame in reversed(data["frames"][:frame_index + 1])
                 if name in frame.get("charts", {}))
    final = data["final"][name]
    traces = []
    for trace in delta["traces"]:
        if isinstance(trace, list):
            index, length = trace
            trace = {key: value[:length] if key in replay_frames.ARRAYS and isinstance(value, list) else value
                     for key, value in final["data"][index].items()}
        traces.append(trace)
    return {"data": traces, "layout": delta.get("layout") or final["layout"]}


def test_frames_replay_each_run_at_its_recorded_pace_one_after_the_other():
    # Recorded an hour apart: the replay keeps each run's pace and drops the wait between them.
    runs = [("m=32, k=1", recorded_run(m=32, k=1, steps=4, seconds_per_step=0.5, start=1000.0)),
            ("m=8, k=4", recorded_run(m=8, k=4, steps=4, seconds_per_step=0.25, start=4600.0))]
    data = replay_frames.timeline(runs, {"run-0": "m=32, k=1", "run-1": "m=8, k=4"}, None, None, None)
    times = [frame["t"] for frame in data["frames"]]
    assert times == sorted(times) and times[-1] == data["end"] == 2.0 + 1.0  # 4 × 0.5 s, then 4 × 0.25 s
    assert times[:6] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]  # first run's start, steps, then its eval
    points = [sum(len(trace["x"]) for trace in chart_at(data, "loss", i)["data"]) for i in range(len(times))]
    assert points[1] == 1 and points[-1] == 8 and points == sorted(points)  # the curves grow, never shrink
    # A trace that only grew is sent as a length: the page holds each point once.
    assert all(isinstance(trace, list) for frame in data["frames"][2:]
               for trace in frame.get("charts", {}).get("loss", {}).get("traces", []))
    final_title = charts.unwrap(data["final"]["loss"]["layout"]["title"]["text"])
    assert final_title.startswith("Loss curves identical")
    assert charts.unwrap(chart_at(data, "loss", 1)["layout"]["title"]["text"]) == "Training loss against samples seen"
    # The page's parts as the Demos page showed them then: queued, then running, then both done and the headline.
    first = data["frames"][0]
    assert "Queued" in first["panels"] and "Running" in first["panels"] and first["headline"] == ""
    assert "Completed: 4 optimizer steps" in data["frames"][-1]["panels"]
    headline = next(frame["headline"] for frame in data["frames"] if frame.get("headline"))
    assert "Loss curves identical" in headline and "<strong>m=8, k=4</strong> against <strong>m=32, k=1</strong>" in headline
    assert "<table>" in first["table"] and "m=32, k=1" in first["table"] and "None" not in data["frames"][-1]["table"]
    many = [("long", recorded_run(steps=200, seconds_per_step=0.1))]
    assert len(replay_frames.moments(many)) == replay_frames.MAX_FRAMES


def test_export_html_writes_one_page_with_plotly_inlined_the_runs_and_the_headline(tmp_path, capsys):
    a = write_events(tmp_path / "a.jsonl", recorded_run(m=32, k=1, dropout=0.0))
    b = write_events(tmp_path / "b.jsonl", recorded_run(m=8, k=4, dropout=0.0))
    out = tmp_path / "demo.html"
    code, printed, err = cli(capsys, "export-html", a, b, "--out", str(out))
    assert code == 0 and not err and printed.startswith(f"Wrote {out}")
    page = out.read_text()
    assert "<script src" not in page and "https://" not in page.split("<script>", 1)[0]  # nothing fetched
    assert "Plotly" in page and page.count("<script>") == 2
    data = replay_data(page)
    assert "Loss curves identical" in data["frames"][-1]["headline"]
    assert [trace["name"] for trace in data["final"]["loss"]["data"]] == ["m=32, k=1", "m=8, k=4"]
    assert set(data["final"]) == {"loss", "memory", "eval", "process"}  # every chart the Compare page draws


def test_a_demo_exports_its_last_completed_runs_with_its_explanation(store, tmp_path, capsys, monkeypatch):
    scenario = demos.get("same-curve")
    for index, (run, (_, config)) in enumerate(zip(scenario.runs, scenario.configs())):
        run_id = f"run{index}"
        store.create_run(run_id, "someone", config.to_dict(), label=scenario.run_label(run.label))
        for event in recorded_run(m=8 * (index + 1), k=1, dropout=0.0):
            store.append_event(run_id, event)
    out = tmp_path / "same-curve.html"
    code, printed, err = cli(capsys, "export-html", "same-curve", "--out", str(out))
    assert code == 0, err
    page = out.read_text()
    assert f"<h1>{scenario.title}</h1>" in page and "Expect: " in page
    assert [t["name"] for t in replay_data(page)["final"]["loss"]["data"]] == [r.label for r in scenario.runs]
    # A run of another version of the demo (other sizes: another GRADACC_DEMO_SCALE) is not its run.
    monkeypatch.setenv(demos.SCALE_ENV, "0.5")
    assert_one_error_line(*cli(capsys, "export-html", "same-curve", "--out", str(out)), 2,
                          "RUN_OR_DEMO 'same-curve': the demo has no finished run", "run it on the Demos page")


def test_bad_input_is_one_line_naming_the_argument(store, tmp_path, capsys):
    out = str(tmp_path / "x.html")
    assert_one_error_line(*cli(capsys, "export-html", "no-such-run", "--out", out), 2,
                          "RUN_OR_DEMO 'no-such-run' is not a demo", "a stored run id or an events file")
    assert_one_error_line(*cli(capsys, "export-html", "memory-wall", "--out", out), 2,
                          "RUN_OR_DEMO 'memory-wall': the demo has no finished run", "run it on the Demos page")
    events = write_events(tmp_path / "a.jsonl", recorded_run())
    assert_one_error_line(*cli(capsys, "export-html", events, "--out", str(tmp_path / "none" / "x.html")), 2,
                          "--out")
    assert_one_error_line(*cli(capsys, "export-html", "--out", out), 2, "RUN_OR_DEMO")
    notes = tmp_path / "notes.jsonl"
    notes.write_text("hello\n")
    assert_one_error_line(*cli(capsys, "export-html", str(notes), "--out", out), 2, "'notes.jsonl' line 1 is not JSON")
    assert not (tmp_path / "x.html").exists()


def test_a_run_that_failed_before_it_started_is_described_by_the_demos_settings_and_icons_need_no_emoji_font():
    # memory-wall's first run fails on purpose, before run_started: it logged no settings of its own.
    scenario = demos.get("memory-wall")
    runs = [(run.label, [] if index == 0 else recorded_run(m=8, k=4)) for index, run in enumerate(scenario.runs)]
    page = web_page.demo_page(scenario, runs)
    (label, config), *_ = scenario.configs()
    caption = re.search(r"Runs, in this order: (.*?)\. Expect", page).group(1)
    assert "None" not in caption
    assert f"m={config.micro_batch_size}, k={config.grad_accum_steps}" in caption
    # The status icons are drawn (inline SVG), not emoji a machine without an emoji font shows as boxes.
    from gradacc.app.replay import parts
    for icon in parts.ICONS.values():
        assert icon.startswith("<svg") and icon.isascii()
    assert parts.alert("error", "x").isascii()


def test_a_demo_prepared_in_a_process_of_its_own_reads_the_store_by_its_path(store, capsys):
    # export-site prepares a demo per process (gallery.prepare): the child opens the store from its path.
    from gradacc.app import gallery

    scenario = demos.get("same-curve")
    for index, (label, config) in enumerate(scenario.configs()):
        store.create_run(f"run{index}", "someone", config.to_dict(), label=scenario.run_label(label))
        for event in recorded_run(m=8 * (index + 1), k=1, dropout=0.0):
            store.append_event(f"run{index}", event)
        store.set_status(f"run{index}", "completed")
    assert gallery._prepare_apart("same-curve", str(store.path), "[1/1] same-curve") == (False, None)
    said = []
    assert gallery.prepare([scenario], store, {"same-curve": "[1/1]"}, said.append, workers=2) == {
        "same-curve": (False, None)}  # recorded already, no checks: nothing to hand a process
    assert said == []
