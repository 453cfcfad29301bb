import json
import math

import plotly.graph_objects as go
import pytest
from support import plotted

from gradacc.app import charts
from gradacc import events as ev


def run_events(steps: int = 3, cuda: bool = False, epochs: int = 2) -> list[dict]:
    events = [ev.run_started(config={"backend": "pytorch"}, effective_batch=32, total_steps=steps,
                             steps_per_epoch=steps, train_examples=96, eval_examples=10,
                             static_memory={"parameters": 4_000_000, "gradients": 4_000_000,
                                            "optimizer_state": 8_000_000, "total": 16_000_000},
                             device="cuda" if cuda else "cpu")]
    for step in range(1, steps + 1):
        events.append(ev.step(step=step, epoch=0, samples_seen=32 * step, tokens_seen=100 * step,
                              micro_batches=4 * step, loss=2.0 / step, grad_norm=1.0, lr=1e-3, elapsed_s=step,
                              memory={"activation_bytes": 3_000_000, "rss_bytes": 500_000_000 + step,
                                      "cuda_peak_bytes": 1_000_000_000 if cuda else None}))
    for epoch in range(epochs):
        events.append(ev.eval_(epoch=epoch, step=steps, eval_loss=0.5, eval_accuracy=0.7 + 0.1 * epoch,
                               eval_f1=0.6 + 0.1 * epoch))
    events.append(ev.run_ended(status="completed", reason=None, steps=steps, wall_s=3.0))
    return events


def is_empty_state(figure) -> bool:
    return not figure.data and len(figure.layout.annotations) == 1


def test_loss_figure_one_line_per_run_against_step_or_samples():
    figure = charts.loss_figure([("a", run_events()), ("b", run_events(steps=4))])
    assert [t.name for t in figure.data] == ["a", "b"]
    assert list(figure.data[0].x) == [1, 2, 3] and list(figure.data[0].y) == [2.0, 1.0, 2.0 / 3]
    assert figure.layout.xaxis.title.text == "Optimizer step"
    assert figure.layout.title.text == "Training loss"
    by_samples = charts.loss_figure([("a", run_events())], x="samples_seen")
    assert list(by_samples.data[0].x) == [32, 64, 96]
    assert by_samples.layout.xaxis.title.text == "Samples seen"


def test_charts_accept_one_run_as_bare_events():
    figure = charts.loss_figure(run_events())
    assert [t.name for t in figure.data] == ["run"]
    assert list(figure.data[0].y) == [2.0, 1.0, 2.0 / 3]


@pytest.mark.parametrize("make", [charts.loss_figure, charts.eval_figure, charts.memory_figure])
@pytest.mark.parametrize("runs", [[], None, [("empty", [])]])
def test_empty_state_has_a_message_and_no_traces(make, runs):
    assert is_empty_state(make(runs))


def test_eval_figure_has_f1_and_accuracy_per_epoch():
    figure = charts.eval_figure([("a", run_events()), ("b", run_events(epochs=1))])
    assert [t.name for t in figure.data] == ["a · F1", "a · accuracy", "b · F1", "b · accuracy"]
    assert list(figure.data[0].x) == [0, 1]
    assert list(figure.data[1].y) == pytest.approx([0.7, 0.8])
    assert figure.layout.xaxis.title.text == "Epoch"


def language_model_events(epochs: int = 2) -> list[dict]:
    return [ev.eval_(epoch=epoch, step=3, eval_loss=2.0 - epoch, eval_perplexity=math.exp(2.0 - epoch),
                     eval_next_token_accuracy=0.3 + 0.1 * epoch) for epoch in range(epochs)]


def test_eval_figure_draws_a_language_models_perplexity_on_its_own_log_axis():
    figure = charts.eval_figure([("lm", language_model_events())])
    assert [(t.name, t.yaxis) for t in figure.data] == [("lm · next-token accuracy", "y"), ("lm · perplexity", "y2")]
    assert figure.layout.yaxis2.type == "log" and figure.layout.yaxis2.overlaying == "y"
    assert figure.layout.yaxis.title.text == "Score (0–1)" and list(figure.layout.yaxis.range) == [0, 1.02]
    assert list(figure.data[1].y) == pytest.approx([math.exp(2.0), math.exp(1.0)])


def test_memory_figure_in_mb_and_cuda_only_when_measured():
    cpu = charts.memory_figure([("cpu", run_events())])
    names = [t.name for t in cpu.data]
    assert names == ["cpu · process RSS", "cpu · activations / micro-batch", "cpu · params + grads + optimizer"]
    assert cpu.layout.yaxis.title.text == cpu.layout.yaxis2.title.text == "MB"
    assert cpu.layout.xaxis2.title.text == "Optimizer step"
    assert cpu.data[0].y[0] == pytest.approx(500.000001) and cpu.data[0].yaxis == "y"
    assert cpu.data[1].y[0] == 3.0 and cpu.data[1].yaxis == "y2"  # small things get their own panel
    assert list(cpu.data[2].y) == [16.0, 16.0] and cpu.data[2].yaxis == "y2"
    gpu = charts.memory_figure([("gpu", run_events(cuda=True))])
    assert "gpu · CUDA peak" in [t.name for t in gpu.data]
    assert len(charts.memory_figure([("a", run_events()), ("b", run_events(cuda=True))]).data) == 7


def test_equivalence_figure_log_scale_with_zero_and_nan():
    rows = [{"case": "k=1", "normalization": "exact", "rel_error": 0.0},
            {"case": "k=4", "normalization": "exact", "rel_error": 1e-7},
            {"case": "k=4", "normalization": "naive", "rel_error": 0.3},
            {"case": "k=8", "normalization": "naive", "rel_error": float("nan")}]
    figure = charts.equivalence_figure(rows, tolerance=1e-5)
    assert figure.layout.yaxis.type == "log"
    assert [t.name for t in figure.data] == ["exact", "naive"]
    assert list(figure.data[0].y) == [charts.LOG_FLOOR, 1e-7]
    assert list(figure.data[0].customdata) == [0.0, 1e-7]  # hover shows the real value
    assert figure.data[1].y[1] is None
    tolerance_line, = figure.layout.shapes  # one line, across the whole width, at the tolerance
    assert (tolerance_line.type, tolerance_line.xref, tolerance_line.x0, tolerance_line.x1) == ("line", "x domain", 0, 1)
    assert tolerance_line.y0 == tolerance_line.y1 == 1e-5
    assert [a.text for a in figure.layout.annotations] == ["tolerance 1e-05"]
    assert is_empty_state(charts.equivalence_figure([]))


def test_memory_plan_figure_predicted_vs_measured():
    predicted = {1: 100e6, 2: 150e6, 4: 250e6}
    figure = charts.memory_plan_figure(predicted, [(2, 160e6)], budget_bytes=200e6)
    assert [t.name for t in figure.data] == ["predicted", "measured"]
    assert list(figure.data[0].x) == [1, 2, 4] and list(figure.data[0].y) == [100.0, 150.0, 250.0]
    assert list(figure.data[1].y) == [160.0]
    assert figure.layout.xaxis.title.text == "Micro-batch size"
    assert figure.layout.yaxis.title.text == "Peak memory (MB)"
    assert is_empty_state(charts.memory_plan_figure({}, None))
    # A point the line was not fitted on is drawn apart: the check of the prediction.
    checked = charts.memory_plan_figure(predicted, {1: 100e6}, held_out={8: 450e6})
    assert [t.name for t in checked.data] == ["predicted", "measured", "measured, not fitted on"]
    assert list(checked.data[2].x) == [8] and list(checked.layout.xaxis.tickvals) == [1, 2, 4, 8]


def y_values(figure) -> list[list]:
    """Each trace's y as the browser gets it: st.plotly_chart sends the figure's JSON."""
    return [plotted(trace["y"]) for trace in json.loads(figure.to_json())["data"]]


def test_figures_serialise_to_json_with_every_value():
    assert y_values(charts.loss_figure(run_events())) == [[2.0, 1.0, 2.0 / 3]]
    assert y_values(charts.memory_figure(run_events())) == [[500.000001, 500.000002, 500.000003], [3.0, 3.0, 3.0],
                                                            [16.0, 16.0]]
    f1, accuracy = y_values(charts.eval_figure(run_events()))
    assert f1 == pytest.approx([0.6, 0.7]) and accuracy == pytest.approx([0.7, 0.8])
    nan_loss = run_events()
    nan_loss[1] = {**nan_loss[1], "loss": math.nan}
    assert y_values(charts.loss_figure(nan_loss)) == [[None, 1.0, 2.0 / 3]]  # NaN stays a gap, not invalid JSON


def every_chart():
    """Each chart this module draws, in each of its shapes (one run, several, empty, a causal LM, thinned)."""
    runs = [("a", run_events()), ("b", run_events(steps=4, cuda=True))]
    long_run = run_events(steps=charts.MAX_POINTS + 500)
    rows = [{"case": "k=4", "normalization": "exact", "rel_error": 1e-7},
            {"case": "k=4", "normalization": "naive", "rel_error": 0.3}]
    return {
        "loss": charts.loss_figure(runs), "loss, thinned": charts.loss_figure(long_run, x="samples_seen"),
        "loss, empty": charts.loss_figure([]), "eval": charts.eval_figure(runs),
        "eval, language model": charts.eval_figure([("lm", language_model_events()), ("a", run_events())]),
        "eval, empty": charts.eval_figure([]),
        "eval, one epoch": charts.eval_figure([("lm", language_model_events(epochs=1)), ("a", run_events(epochs=1))]),
        "memory": charts.memory_figure(runs),
        "memory, thinned": charts.memory_figure(long_run), "memory, empty": charts.memory_figure([]),
        "breakdown": charts.memory_breakdown_figure(runs), "breakdown, empty": charts.memory_breakdown_figure([]),
        "plan": charts.memory_plan_figure({1: 1e8, 2: 2e8}, {2: 2.1e8}, budget_bytes=3e8, held_out={4: 4e8}),
        "plan, empty": charts.memory_plan_figure({}), "equivalence": charts.equivalence_figure(rows, tolerance=1e-5),
        "equivalence, empty": charts.equivalence_figure([]),
    }


@pytest.mark.parametrize("name", list(every_chart()))
def test_plotly_accepts_every_chart_as_it_is_sent(name):
    """Charts are assembled from kept layouts and plain trace dicts without plotly checking them (for speed):
    here plotly checks each one, property by property, and must send it back unchanged."""
    sent = json.loads(every_chart()[name].to_json())
    checked = go.Figure(sent)  # raises on any property plotly does not know, or a value it refuses
    assert json.loads(checked.to_json()) == sent


def test_a_kept_layout_is_never_changed_by_a_figure_built_from_it():
    charts.loss_figure(run_events(steps=charts.MAX_POINTS + 1)).layout.title.text = "changed"
    again = charts.loss_figure(run_events())
    assert again.layout.title.text == "Training loss" and again.layout.xaxis.title.text == "Optimizer step"


def test_a_frozen_figure_draws_the_same_dict_as_the_figure_it_was():
    figure = charts.loss_figure([("run", run_events())])
    expected = figure.to_dict()
    frozen = charts.freeze(figure)
    assert frozen.to_dict() == expected and frozen.to_dict() is frozen.to_dict()  # computed once


def test_the_figure_cache_builds_once_per_key_for_every_caller_and_stays_bounded():
    import threading

    cache, builds = charts.FigureCache(max_entries=2), []

    def build():
        builds.append(1)
        return (charts.loss_figure([("run", run_events())]),)

    # Eight sessions asking for the same run at the same event count at once: one build.
    threads = [threading.Thread(target=cache.get, args=(("train", "r1", 10, "step"), build)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == cache.builds == 1
    cache.get(("train", "r1", 12, "step"), build)  # new events: a new build
    cache.get(("train", "r2", 5, "step"), build)
    assert cache.builds == 3
    cache.get(("train", "r1", 10, "step"), build)  # dropped (bounded at 2): built again, not kept forever
    assert cache.builds == 4 and len(cache._figures) == 2


def test_the_memory_wall_shows_its_budget_and_the_refused_runs_need_above_it():
    from gradacc import events as ev
    from gradacc.config import RunConfig

    config = RunConfig(micro_batch_size=64, grad_accum_steps=1, memory_budget_mb=450).check().to_dict()
    static = {"parameters": 90e6, "gradients": 90e6, "optimizer_state": 180e6, "total": 360e6}
    refused = [ev.run_started(config=config, effective_batch=64, total_steps=8, steps_per_epoch=8,
                              train_examples=512, eval_examples=16, static_memory=static, device="cpu"),
               ev.run_ended(status="failed", reason="out of memory", steps=0, wall_s=1.0,
                            out_of_memory={"micro_batch_size": 64, "need_bytes": 558e6, "static_bytes": 360e6,
                                           "activation_bytes": 198e6, "device_bytes": 0.0, "cap_bytes": 450e6,
                                           "cap_source": "budget", "fit": None})]
    figure = charts.memory_breakdown_figure([("m=64, k=1, budget 450 MB", refused)], title="Memory per step")
    assert sum(trace.x[0] for trace in figure.data) == pytest.approx(558)  # the need, past the wall
    # Refused before it split its static bytes: they stand as one block under its activations.
    for unsplit in ([dict(refused[0], static_memory={}), refused[1]], [refused[1]]):  # (or no run_started at all)
        figure = charts.memory_breakdown_figure([("m=64, k=1, budget 450 MB", unsplit)], title="Memory per step")
        assert sum(trace.x[0] for trace in figure.data) == pytest.approx(558)
    assert figure.layout.yaxis.ticktext[0].replace(" <br>", " ").endswith("(out of memory)")
    [wall] = figure.layout.shapes
    assert wall.x0 == wall.x1 == 450 and figure.layout.annotations[0].text == "budget 450 MB"


def test_long_titles_wrap_instead_of_being_cut():
    title = "Memory per step: activations 4.0× smaller than the other run's"
    figure = charts.loss_figure([], title=title)
    assert figure.layout.title.text.replace(" <br>", " ") == title
    assert all(len(line) <= charts.TITLE_CHARS for line in figure.layout.title.text.split(" <br>"))
    assert figure.layout.font.size >= 16


def test_the_sharding_figure_puts_each_ranks_gradients_held_and_sent_side_by_side():
    from gradacc.app.charts.fsdp import TITLE, has_sharding, sharding_figure

    def run(sync, held, sent):
        figures = {"grad_sync": sync, "grad_bytes": held, "grad_peak_bytes": held, "grad_comm_bytes": sent,
                   "grad_comm_calls": [3, 3], "param_comm_bytes": [1, 1], "window_s": [0.1, 0.1]}
        return [{"event": "step", "step": 1, "sharding": {**figures, "grad_bytes": [1, 1]}},
                {"event": "step", "step": 2, "sharding": figures}]

    runs = [("pw", run("per-window", [4e6, 4e6], [4e6, 4e6])), ("pmb", run("per-micro-batch", [2e6, 2e6], [16e6, 16e6]))]
    assert has_sharding(runs) and not has_sharding([("ddp", [{"event": "step", "step": 1}])])
    figure = go.Figure(sharding_figure(runs).to_dict())  # plotly checks every property
    assert figure.layout.title.text.replace(" <br>", " ") == TITLE
    bars = {(trace.name, trace.xaxis): list(trace.y) for trace in figure.data}
    assert bars == {("pw (per-window)", "x"): [4.0, 4.0], ("pw (per-window)", "x2"): [4.0, 4.0],
                    ("pmb (per-micro-batch)", "x"): [2.0, 2.0], ("pmb (per-micro-batch)", "x2"): [16.0, 16.0]}
    assert list(figure.data[0].x) == ["rank 0", "rank 1"]  # the latest step's figures, one bar per rank
    empty = sharding_figure([("ddp", [{"event": "step", "step": 1}])])
    assert not empty.data and empty.layout.annotations[0].text == "No sharded steps yet"


def test_one_epoch_runs_draw_their_evaluation_as_labelled_bars_and_longer_runs_as_lines():
    one_epoch = charts.eval_figure([("a", run_events(epochs=1)), ("b", run_events(epochs=1))])
    assert [(t.type, t.name, list(t.x)) for t in one_epoch.data] == [("bar", "a", ["F1", "accuracy"]),
                                                                    ("bar", "b", ["F1", "accuracy"])]
    assert list(one_epoch.data[0].y) == pytest.approx([0.6, 0.7]) and one_epoch.data[0].texttemplate
    assert one_epoch.layout.barmode == "group" and one_epoch.layout.xaxis.type == "category"
    # A run planned for two epochs keeps its line after its first evaluation: it grows into a curve.
    started, *rest = run_events(epochs=1)
    planned = [{**started, "config": {"epochs": 2}}, *rest]
    assert charts.eval_figure([("a", planned)]).data[0].type == "scatter"
    lm = charts.eval_figure([("lm", language_model_events(epochs=1))])
    assert [(t.x, t.yaxis) for t in lm.data] == [(("next-token accuracy",), "y"), (("perplexity",), "y2")]
