"""The Compare page: any session's runs overlaid, a table of configs and results, CSV and JSON downloads."""

import pytest
from app_support import APP, SCRIPT_TIMEOUT_S, chart, charts, open_app
from streamlit.testing.v1 import AppTest
from support import real_run_events

from gradacc import events as ev
from gradacc.analysis import divergence, run_names
from gradacc.config import RunConfig
from gradacc.serving.store import RunStore


def store_run(store: RunStore, run_id: str, label: str, backend: str, m: int, k: int, f1: float,
              owner: str = "another-visitor") -> None:
    """A finished run as the run manager would have stored it (3 steps, one eval)."""
    config = RunConfig(backend=backend, micro_batch_size=m, grad_accum_steps=k).to_dict()
    store.create_run(run_id, owner, config, label)
    store.append_event(run_id, ev.run_started(config=config, effective_batch=m * k, total_steps=3, steps_per_epoch=3,
                                              train_examples=3 * m * k, eval_examples=10, device="cpu",
                                              static_memory={"parameters": 1e6, "gradients": 1e6,
                                                             "optimizer_state": 2e6, "total": 4e6}))
    for step in range(1, 4):
        store.append_event(run_id, ev.step(step=step, epoch=1, samples_seen=step * m * k, tokens_seen=step * 100,
                                           micro_batches=k, loss=1.0 / step, grad_norm=1.0, lr=1e-3,
                                           elapsed_s=step * 0.5, memory={"activation_bytes": m * 1000 + step,
                                                                         "rss_bytes": 5e8, "cuda_peak_bytes": None}))
    store.append_event(run_id, ev.eval_(epoch=1, step=3, eval_loss=0.5, eval_accuracy=0.8, eval_f1=f1))
    store.append_event(run_id, ev.run_ended(status="completed", reason=None, steps=3, wall_s=1.5))


def loss_chart(at) -> dict:
    """The loss chart, whose title states the headline's loss claim (so it is found by its y axis)."""
    return next(c for c in charts(at) if c["layout"].get("yaxis", {}).get("title", {}).get("text") == "Loss")


def memory_bars(at) -> dict:
    return next(c for c in charts(at) if c["data"] and c["data"][0]["type"] == "bar")


def test_without_runs_the_page_says_where_to_start(app_home):
    at = open_app("compare")
    assert "No runs yet" in at.info[0].value


def test_runs_are_overlaid_tabled_and_exported(app_home):
    store = RunStore(app_home / "runs.sqlite3")
    store_run(store, "20250101-120000-aaaaaa", "pytorch m8×k4", "pytorch", 8, 4, 0.75)
    store_run(store, "20250101-120100-bbbbbb", "=HYPERLINK(\"x\")", "accelerate", 4, 8, 0.5)
    store.close()

    at = open_app("compare")
    assert len(at.multiselect(key="compare_runs").value) == 2
    loss = loss_chart(at)
    # The second pick against the first, in words, and as the loss chart's title.
    headline = next(e.value for e in at.success if e.value.startswith("### "))
    # The stored runs log the same losses: m=8 (picked second) holds twice m=4's activations.
    assert headline.startswith("### Loss curves identical (max difference 0)")
    assert "activations 2.0× larger" in headline and "F1 0.750 vs 0.500" in headline  # m=8's first, as it is named first
    assert "**m=8, k=4, pytorch** against **m=4, k=8, accelerate**" in headline
    assert loss["layout"]["title"]["text"].startswith("Loss curves identical")
    assert [trace["name"] for trace in loss["data"]] == ["m=4, k=8, accelerate", "m=8, k=4, pytorch"]
    assert len({trace["line"]["dash"] for trace in loss["data"]}) == 2  # overlapping curves stay visible
    assert loss["data"][0]["line"]["width"] > loss["data"][1]["line"]["width"]
    evaluation = chart(at, "Evaluation after each epoch")  # one epoch each: a bar per run for F1 and accuracy
    assert [(trace["name"], trace["x"]) for trace in evaluation["data"]] == [
        ("m=4, k=8, accelerate", ["F1", "accuracy"]), ("m=8, k=4, pytorch", ["F1", "accuracy"])]
    assert evaluation["data"][1]["y"][0] == pytest.approx(0.75)  # the F1 the headline states
    bars = memory_bars(at)
    assert bars["layout"]["title"]["text"].replace(" <br>", " ") == "Memory per step: activations 2.0× larger"
    assert [trace["name"] for trace in bars["data"]][-1] == "peak activations of a micro-batch"

    table = at.dataframe[0].value  # a row per field, a column per run: 818 px hold it at 1280×720
    assert list(table.columns) == ["what", "m=4, k=8, accelerate", "m=8, k=4, pytorch"]  # newest first
    field = table.set_index("what")
    assert list(field.loc["backend"]) == ["accelerate", "pytorch"]
    assert list(field.loc["effective batch"]) == ["32", "32"]
    assert list(field.loc["final F1"]) == ["0.5", "0.75"]
    assert list(field.loc["samples/s"]) == ["64", "64"]
    assert list(field.loc["peak activation bytes"]) == ["4,003", "8,003"]
    assert list(table["what"][:7]) == ["m", "k", "effective batch", "peak activation bytes", "time per step (s)",
                                       "samples/s", "final F1"]
    assert [b.label for b in at.get("download_button")] == ["Download CSV", "Download JSON"]

    # Down to one run: the charts and the table follow.
    at.multiselect(key="compare_runs").set_value(["20250101-120000-aaaaaa"]).run()
    assert len(at.dataframe[0].value.columns) == 2  # "what" and the one run
    assert len(loss_chart(at)["data"]) == 1


def test_a_new_run_from_another_visitor_keeps_my_picks(app_home):
    store = RunStore(app_home / "runs.sqlite3")
    for letter in "abc":
        store_run(store, f"20250101-12000{letter}-{letter * 6}", letter, "pytorch", 8, 4, 0.75)
    at = open_app("compare")
    at.multiselect(key="compare_runs").set_value(["20250101-12000a-aaaaaa"]).run()

    store_run(store, "20250101-12000d-dddddd", "d", "pytorch", 8, 4, 0.75)  # while this visitor looks
    store.close()
    at.run()
    picker = at.multiselect(key="compare_runs")
    assert len(picker.options) == 4  # the new run can be picked...
    assert picker.value == ["20250101-12000a-aaaaaa"]  # ...and the visitor's choice stays
    assert len(loss_chart(at)["data"]) == 1


def test_the_visitors_own_runs_are_picked_first(app_home):
    at = AppTest.from_file(APP, default_timeout=SCRIPT_TIMEOUT_S).run()  # the Train page gives the session its id
    me = at.session_state["owner"]
    store = RunStore(app_home / "runs.sqlite3")
    store_run(store, "20250101-120000-mine01", "mine, m32×k1", "pytorch", 32, 1, 0.75, owner=me)
    store_run(store, "20250101-120100-mine02", "mine, m8×k4", "pytorch", 8, 4, 0.75, owner=me)
    for letter in "abc":  # newer runs of other visitors
        store_run(store, f"20250101-12020{letter}-{letter * 6}", letter, "pytorch", 8, 4, 0.5)
    store.close()

    at.switch_page("pages/compare.py").run()
    picker = at.multiselect(key="compare_runs")
    assert len(picker.options) == 5
    assert picker.value == ["20250101-120100-mine02", "20250101-120000-mine01"]


FAILED_REASON = "Could not load model 'no/such-model' from the hub: offline."


def store_failed_run(store: RunStore, run_id: str, owner: str = "another-visitor") -> None:
    """A run that failed before its first step (a hub id that cannot load): no run_started, no step."""
    config = RunConfig(model="no/such-model").to_dict()
    store.create_run(run_id, owner, config, "no/such-model m8×k4")
    store.append_event(run_id, ev.run_ended(status=ev.FAILED, reason=FAILED_REASON, steps=0, wall_s=0.5,
                                            field="model"))


def store_events(store: RunStore, run_id: str, label: str, run_events: list[dict],
                 owner: str = "another-visitor") -> None:
    """A run as the run manager would have stored it, from recorded events."""
    config = next(e for e in run_events if e["event"] == ev.RUN_STARTED)["config"]
    store.create_run(run_id, owner, config, label)
    for event in run_events:
        store.append_event(run_id, event)


def test_a_failed_run_is_offered_as_failed_with_its_reason_and_never_opened_with(app_home):
    """A new session on a server whose newest run failed: Compare opens on the two completed runs, and the failed
    one, picked by hand, is said failed with its reason, never set beside the other as "none" figures."""
    store = RunStore(app_home / "runs.sqlite3")
    store_run(store, "20250101-120000-aaaaaa", "pytorch m8×k4", "pytorch", 8, 4, 0.75)
    store_run(store, "20250101-120100-bbbbbb", "pytorch m4×k8", "pytorch", 4, 8, 0.75)
    store_failed_run(store, "20250101-120200-ffffff")
    store.close()

    at = open_app("compare")
    picker = at.multiselect(key="compare_runs")
    assert picker.value == ["20250101-120100-bbbbbb", "20250101-120000-aaaaaa"]
    assert f"no/such-model m8×k4 · ffffff · failed: {FAILED_REASON}" in picker.options
    assert next(e.value for e in at.success if e.value.startswith("### ")).startswith("### Loss curves identical")

    at.multiselect(key="compare_runs").set_value(["20250101-120000-aaaaaa", "20250101-120200-ffffff"]).run()
    said = next(e.value for e in at.error if e.value.startswith("### "))
    assert said.startswith(f"### No loss to compare: the second run failed before its first step ({FAILED_REASON})")
    assert "none" not in said.split("\n")[0] and not at.exception


def test_without_two_comparable_completed_runs_nothing_is_picked_and_the_page_says_what_to_do(app_home):
    store = RunStore(app_home / "runs.sqlite3")
    store_run(store, "20250101-120000-aaaaaa", "pytorch m8×k4", "pytorch", 8, 4, 0.75)
    store_failed_run(store, "20250101-120200-ffffff")
    store.close()

    at = open_app("compare")
    assert at.multiselect(key="compare_runs").value == []
    assert at.info[0].value == run_names.NO_PICKS


def test_runs_parted_by_rounding_are_explained_in_an_information_box_not_a_green_one(app_home):
    store = RunStore(app_home / "runs.sqlite3")
    store_events(store, "20250101-120000-aaaaaa", "m8×k4", real_run_events("tiny-bert-m8k4-dropout0"))
    store_events(store, "20250101-120100-bbbbbb", "m4×k8", real_run_events("tiny-bert-m4k8-dropout0"))
    store.close()

    at = open_app("compare")
    said = next(e.value for e in at.info if e.value.startswith("### "))
    assert said.startswith("### Loss curves differ by ") and divergence.ROUNDING in said
    assert "apart from step 43" in said and "**m=8, k=4** against **m=4, k=8**" in said  # the older against the newer
    assert not [e for e in at.success if e.value.startswith("### ")]
