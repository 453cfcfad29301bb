"""The Demos page: every scenario from the registry, ?demo=NAME links, and each "Run this demo" button runs
its scenario to a headline (shrunk with GRADACC_DEMO_SCALE so the suite stays fast)."""

import html

import pytest
from app_support import APP, SCRIPT_TIMEOUT_S, alerts, charts, run_until
from streamlit.testing.v1 import AppTest

from gradacc.analysis import demos
from gradacc.app import server
from gradacc.app.charts import demos as demo_charts


@pytest.fixture
def demo_home(app_home, monkeypatch):
    monkeypatch.setenv(demos.SCALE_ENV, "0.05")  # a few windows per run: seconds, not half a minute
    return app_home


def open_demos(query: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=SCRIPT_TIMEOUT_S)
    if query:
        at.query_params["demo"] = query
    at.run()
    at.switch_page("pages/demos.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_page_lists_every_scenario_and_explains_the_chosen_one(demo_home):
    at = open_demos()
    picker = at.selectbox(key="demo.choice")
    assert list(picker.options) == [s.title for s in demos.SCENARIOS.values()]
    first = next(iter(demos.SCENARIOS.values()))
    assert at.header[0].value == first.title
    assert "Press **Run this demo**" in at.info[0].value
    picker.select("trainer-pitfall").run()
    assert at.header[0].value == demos.SCENARIOS["trainer-pitfall"].title
    assert at.query_params["demo"] == "trainer-pitfall"  # the address bar follows: a link to share


def test_a_demo_link_opens_that_demo_and_a_bad_one_says_so(demo_home):
    at = open_demos("naive-vs-exact")
    assert at.selectbox(key="demo.choice").value == "naive-vs-exact"
    assert at.header[0].value == demos.SCENARIOS["naive-vs-exact"].title
    at = open_demos("no-such-demo")
    assert "no demo called 'no-such-demo'" in at.warning[0].value
    assert at.header[0].value == next(iter(demos.SCENARIOS.values())).title


def test_a_demo_whose_picker_state_streamlit_dropped_stays_the_demo_in_the_address_bar(demo_home):
    """Streamlit can drop a widget's state around a fragment's rerun (streamlit#10805, #11266; seen in a browser
    test: a demo's page turned into the first demo's right after its headline). The page then follows its address."""
    at = AppTest.from_file(APP, default_timeout=SCRIPT_TIMEOUT_S)
    at.query_params["demo"] = "naive-vs-exact-lm"
    at.run()
    at.switch_page("pages/demos.py")
    at.session_state["demo.requested"] = "naive-vs-exact-lm"  # the page's own state is kept; its picker's is not
    at.run()
    assert at.selectbox(key="demo.choice").value == "naive-vs-exact-lm"
    assert at.header[0].value == demos.SCENARIOS["naive-vs-exact-lm"].title
    assert at.query_params["demo"] == "naive-vs-exact-lm"


def headline(at: AppTest) -> str | None:
    """The result sentence, written as a Markdown heading in a box of its verdict's colour."""
    return next((e.value for e in [*at.success, *at.info, *at.warning, *at.error] if e.value.startswith("### ")), None)


def loss_chart_of(at: AppTest) -> dict:
    return next((c for c in charts(at) if c["layout"]["yaxis"].get("title", {}).get("text") == "Loss"), {"data": []})


def charts_title(chart: dict) -> str:
    return chart["layout"]["title"]["text"].replace(" <br>", " ")


def story_chart_of(at: AppTest) -> dict | None:
    """The chart drawn first, where a scenario names one (Scenario.chart; fsdp-sync's bars are the browser test's)."""
    axes = (demo_charts.SCALE_AXIS, demo_charts.DIFFERENCE_AXIS)
    return next((c for c in charts(at) if c["layout"]["yaxis"].get("title", {}).get("text") in axes), None)


# Four demos stand for the kinds of page a demo draws: no story chart, the gradient scale, a run that fails on purpose,
# loss differences with gradient checks under them. Every demo plays to its result in the browser
# (tests/browser/test_browser_demos.py), whose checks cover the others' own parts: fsdp-sync's bars, the in-batch
# negatives' checks, the pitfall and Trainer headlines, the language model's differences.
PAGE_RUNS = ["same-curve", "naive-vs-exact", "memory-wall", "batchnorm"]


@pytest.mark.parametrize("name", PAGE_RUNS)
def test_each_demo_button_runs_its_scenario_to_a_headline(demo_home, name):
    at = open_demos(name)
    at.button(key="demo.run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    scenario = demos.SCENARIOS[name]
    # The headline compares the first two runs; a scenario with more runs draws the rest as they finish.
    # A run that failed before its first step (memory-wall's first, on purpose) draws no curve.
    at = run_until(at, lambda at: headline(at) is not None and len(loss_chart_of(at)["data"])
                   == len(scenario.runs) - sum(a.startswith("Failed") for a in alerts(at))
                   and not at.button(key="demo.run").disabled, timeout=240, what=f"the headline of {name}")
    labels = [label for label, _ in scenario.configs()]
    assert len(labels) >= 2
    assert "loss" in headline(at).lower()
    loss_chart = loss_chart_of(at)
    # Every run that trained is drawn, distinguishable; memory-wall's first run fails before step 1, on purpose.
    failed = [a for a in alerts(at) if a.startswith("Failed")]
    assert [f for f in failed if "out of memory" in f] == failed and len(failed) == (name == "memory-wall")
    drawn = len(scenario.runs) - len(failed)
    assert len(loss_chart["data"]) == drawn
    assert len({str(trace.get("line", {}).get("dash")) for trace in loss_chart["data"]}) == drawn
    assert not at.button(key="demo.run").disabled  # ended: it can be run again
    # The chart that shows the page's claim, drawn first: one line per run it describes.
    story = story_chart_of(at)
    if scenario.chart == "loss-difference":  # B against A, for each pair the demo says (named by B alone if one A)
        pairs = (scenario.compares, *scenario.controls)
        one = len({a for a, _ in pairs}) == 1
        assert [trace["name"] for trace in story["data"]] == [labels[b] if one else f"{labels[b]} against {labels[a]}"
                                                              for a, b in pairs]
    elif scenario.chart == "gradient-scale":
        assert [trace["name"] for trace in story["data"]] == labels  # naive's dips, exact at 1×
        assert "steps at 0.25× their gradient" in charts_title(story)
    else:
        assert story is None
    # No "None" in the table: a run that failed before its first step (memory-wall's first) shows dashes.
    table = next(frame.value for frame in at.dataframe if "what" in frame.value and "m" in set(frame.value["what"]))
    assert not table.isna().any().any() and "None" not in table.astype(str).to_numpy()
    if scenario.checks:  # the gradient checks under the runs: the two norms
        at = run_until(at, lambda at: any(frame.value is not None and "relative error" in frame.value
                                          for frame in at.dataframe), timeout=120, what="the gradient checks")
        table = next(frame.value for frame in at.dataframe if "relative error" in frame.value)
        assert "None" not in table.astype(str).to_numpy()
        errors = dict(zip(table["what"] + " m=" + table["m"].astype(str), table["relative error"]))
        assert errors["bow-batchnorm m=2"] > errors["bow-batchnorm m=8"] > 0.01
        assert errors["bow-layernorm m=2"] <= 1e-5
    # Its offline copy: the page the download button builds replays every run that trained.
    from gradacc.app import web_page

    assert at.get("download_button")[0].proto.label == "Download as a web page"
    runs = [(run.label, server.run_manager().get(run_id).events)
            for run, run_id in zip(scenario.runs, at.session_state[f"demo.runs.{name}"])]
    page = web_page.demo_page(scenario, runs)
    assert f"<h1>{html.escape(scenario.title)}</h1>" in page and page.count("<script>") == 2


def test_a_demo_link_opened_while_that_demo_runs_shows_it_running(demo_home):
    # The speaker's runs, queued (as the store holds a run another process is running or about to run).
    from gradacc.serving.store import RunStore

    scenario = demos.SCENARIOS["same-curve"]
    open_demos()  # the server starts (marking runs it finds queued as interrupted) before the speaker's runs
    store = RunStore(demo_home / "runs.sqlite3")
    for index, (label, config) in enumerate(scenario.configs()):
        store.create_run(f"20250101-12000{index}-speakr", "the-speaker", config.to_dict(),
                         label=scenario.run_label(label))
    at = open_demos("same-curve")
    shown = [m.value for m in at.markdown]
    assert [label for label in shown if label.startswith("**")] == ["**m=32, k=1**", "**m=8, k=4**"], shown
    assert at.button(key="demo.run").disabled  # watched, not started again
    assert not any("Press **Run this demo**" in i.value for i in at.info)
    # Another demo's link is not that demo.
    other = open_demos("naive-vs-exact")
    assert not other.button(key="demo.run").disabled
    assert any("Press **Run this demo**" in i.value for i in other.info)
    # A demo whose runs all ended is not adopted by a newcomer: they start their own.
    for index, _ in enumerate(scenario.runs):
        store.set_status(f"20250101-12000{index}-speakr", "completed")
    assert not open_demos("same-curve").button(key="demo.run").disabled
