"""A demo or runs as one self-contained web page (python -m gradacc export-html): frames at the recorded pace,
the app's headline, plotly inlined; bad input refused in one line naming the argument."""

import json
import re

from attack_support import assert_one_error_line, cli
from support import plotted, recorded_run, write_events

from gradacc.analysis import demos
from gradacc.app import charts, web_page


def replay_data(page: str) -> dict:
    return json.loads(re.search(r"const REPLAY = (.*);\n", page).group(1).replace("<\\/", "</"))


def test_frames_replay_each_run_at_its_recorded_pace_one_after_the_other():
    # Recorded an hour apart: the replay keeps each run's pace and drops the wait between them.
    runs = [("m=32, k=1", recorded_run(m=32, k=1, steps=4, seconds_per_step=0.5, start=1000.0)),
            ("m=8, k=4", recorded_run(m=8, k=4, steps=4, seconds_per_step=0.25, start=4600.0))]
    frames = web_page.replay_frames(runs, "the claim")
    times = [frame["t"] for frame in frames]
    assert times == sorted(times) and times[-1] == 2.0 + 1.0  # 4 × 0.5 s, then 4 × 0.25 s
    assert times[:5] == [0.5, 1.0, 1.5, 2.0, 2.0]  # first run's steps, then its eval
    points = [sum(len(plotted(trace["x"])) for trace in frame["loss"]["data"]) for frame in frames]
    assert points[0] == 1 and points[-1] == 8 and points == sorted(points)  # the curves grow, never shrink
    assert frames[-1]["loss"]["layout"]["title"]["text"] == "the claim"
    assert charts.unwrap(frames[0]["loss"]["layout"]["title"]["text"]) == "Training loss against samples seen"
    many = [("long", recorded_run(steps=200, seconds_per_step=0.1))]
    assert len(web_page.replay_frames(many, "t")) == web_page.MAX_FRAMES


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
    assert data["headline"].startswith("Loss curves identical")
    assert [trace["name"] for trace in data["frames"][-1]["loss"]["data"]] == ["m=32, k=1", "m=8, k=4"]


def test_a_demo_exports_its_last_completed_runs_with_its_explanation(store, tmp_path, capsys):
    scenario = demos.get("same-curve")
    for index, run in enumerate(scenario.runs):
        run_id = f"run{index}"
        store.create_run(run_id, "someone", {}, label=scenario.run_label(run.label))
        for event in recorded_run(m=8 * (index + 1), k=1, dropout=0.0):
            store.append_event(run_id, event)
    out = tmp_path / "same-curve.html"
    code, printed, err = cli(capsys, "export-html", "same-curve", "--out", str(out))
    assert code == 0, err
    page = out.read_text()
    assert f"<h1>{scenario.title}</h1>" in page and "Expect: " in page
    assert [t["name"] for t in replay_data(page)["frames"][-1]["loss"]["data"]] == [r.label for r in scenario.runs]


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
