"""Several visitors at once (AppTest sessions sharing the server's cached RunManager): their runs queue and
start in the order they pressed Start, nobody can stop someone else's run, and no widget value, upload or
run leaks from one session into another. (Server responsiveness under a training run is checked against a
real ``streamlit run`` in test_attack_server.py.)
"""

import threading

import pytest
from app_support import APP, alerts, completed, open_app, run_until
from attack_support import TINY, sabotage
from support import wait_for
from streamlit.testing.v1 import AppTest

RUN_TIMEOUT_S = 120
FIRST_SEED = 1000
MICRO_BATCHES = [4, 6, 8, 12, 16]


def status(at) -> str:
    return " | ".join(alerts(at))


def widget_values(at) -> dict:
    return {n.key: n.value for n in at.number_input}


@pytest.fixture
def hold_first_run(monkeypatch):
    """The first visitor's run (its seed) blocks in its first forward until released: the queue stays put."""
    reached, release, counter = threading.Event(), threading.Event(), {}

    def hold(output):
        reached.set()
        release.wait(60)
        return output

    sabotage(monkeypatch, hold, seed=FIRST_SEED, counter=counter)
    yield reached, release
    release.set()


@pytest.mark.parametrize("visitors", [2, 5])
def test_visitors_queue_in_order_cannot_stop_each_other_and_keep_their_own_settings(visitors, app_home,
                                                                                    hold_first_run,
                                                                                    one_torch_thread):
    from gradacc.app import server

    reached, release = hold_first_run
    sessions = [open_app() for _ in range(visitors)]
    mine = []
    for index, at in enumerate(sessions):
        values = {**TINY, "micro_batch_size": MICRO_BATCHES[index], "seed": FIRST_SEED + index}
        for field, value in values.items():
            at.number_input(key=f"form.train.{field}").set_value(value)
        at.run()
        mine.append(widget_values(at))
        at.button(key="start").click().run()
        assert not at.exception, [e.value for e in at.exception]
        if index == 0:
            wait_for(reached.is_set, RUN_TIMEOUT_S, "the first run to start training")
    run_ids = [at.session_state["run_id"] for at in sessions]
    owners = [at.session_state["owner"] for at in sessions]
    assert len(set(run_ids)) == len(set(owners)) == visitors

    # While the first run holds the only slot: everyone else is queued, in the order they pressed Start.
    for position, at in enumerate(sessions[1:], start=1):
        at.run()
        assert f"Queued: position {position} in the queue" in status(at), status(at)
    # Each session sees its own run with its own Stop button; nobody else's.
    for at in sessions:
        assert [b.key for b in at.button if b.key == "stop"] == ["stop"]
    # A visitor who opens the first run's link sees it, but cannot stop it: there is no Stop button for them,
    # and the manager refuses a stop by anyone but the owner.
    onlooker = AppTest.from_file(APP, default_timeout=60)
    onlooker.query_params["run"] = run_ids[0]
    onlooker.run()
    assert "Running" in status(onlooker) and not [b for b in onlooker.button if b.key == "stop"]
    manager = server.run_manager()
    assert not manager.stop(run_ids[0], owners[-1])
    assert not manager.stop(run_ids[0], onlooker.session_state["owner"])
    assert manager.is_live(run_ids[0])

    release.set()
    for at in sessions:
        run_until(at, completed, RUN_TIMEOUT_S, "every run to complete")
    runs = [manager.get(run_id) for run_id in run_ids]
    assert [r.status for r in runs] == ["completed"] * visitors
    for earlier, later in zip(runs, runs[1:]):
        assert earlier.ended["time"] <= later.started["time"], "runs must start one after another, in order"
    # Nothing leaked: each session kept its own widget values, and each run has its own session's settings.
    for index, (at, run) in enumerate(zip(sessions, runs)):
        at.run()
        assert widget_values(at) == mine[index]
        assert (run.owner, run.config["micro_batch_size"], run.config["seed"]) == \
            (owners[index], MICRO_BATCHES[index], FIRST_SEED + index)
        assert at.session_state["run_id"] == run_ids[index]


def test_an_upload_in_one_session_is_not_seen_by_another(app_home):
    first, second = open_app(), open_app()
    first.selectbox(key="form.train.dataset_choice").set_value("upload a CSV / JSONL file").run()
    content = ("text,label\n" + "\n".join(f"private review {i},{i % 2}" for i in range(30))).encode()
    first.file_uploader[0].set_value(("private.csv", content, "text/csv")).run()
    assert not first.error and "train.uploaded" in first.session_state
    second.selectbox(key="form.train.dataset_choice").set_value("upload a CSV / JSONL file").run()
    assert "Upload a CSV or JSONL file" in " ".join(e.value for e in second.error)
    assert not any("private" in c.value for c in second.caption)
    assert second.button(key="start").disabled
    assert "train.uploaded" not in second.session_state
