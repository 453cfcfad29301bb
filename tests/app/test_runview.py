"""The live panel's words: a queued run's place and wait, and nothing under a failed run that says otherwise."""

from gradacc.app import runview
from gradacc.serving.manager import RunState


class Running:
    def __init__(self, eta):
        self.eta = eta

    def eta_seconds(self):
        return self.eta


def state(status, events=()):
    run = RunState("r1", "me", None, {"micro_batch_size": 8, "grad_accum_steps": 4}, status)
    for event in events:
        run.record(event)
    return run


def test_a_queued_run_waits_for_the_running_run_then_each_run_ahead():
    # One slot: the running run ends in 30 s, then the run ahead takes the median of recent runs (100 s).
    assert runview.queue_wait([Running(30.0)], [object()], 1, [90.0, 100.0, 400.0], 600) == "about 2 min 10 s to wait"
    # Two slots, one free soon: the run ahead takes the free one, ours the one freeing after 30 s.
    assert runview.queue_wait([Running(30.0)], [object()], 2, [100.0], 600) == "about 30 s to wait"
    # A recent run longer than the limit cannot take longer than the limit.
    assert runview.queue_wait([Running(10.0)], [object()], 1, [5000.0], 600) == "about 10 min 10 s to wait"


def test_without_finished_runs_the_limit_is_an_upper_bound_and_without_a_limit_there_is_no_figure():
    assert runview.queue_wait([Running(None)], [], 1, [], 600) == \
        "at most 10 min 00 s to wait (runs stop after 10 min 00 s)"
    assert runview.queue_wait([Running(20.0)], [], 1, [], 600) == "about 20 s to wait"
    assert runview.queue_wait([Running(None)], [object()], 1, [], None) == "wait unknown until a run has finished here"


def test_the_status_sentence_of_a_queued_run_says_its_place_and_wait():
    assert runview.status_message(state("queued"), (2, "about 40 s to wait")) == \
        ("info", "Queued: position 2 in the queue; about 40 s to wait.")


def test_a_run_that_failed_before_a_step_has_a_reason_and_no_bar_or_charts():
    failed = state("failed", [{"event": "run_ended", "status": "failed", "reason": "No data file at 'x.csv'.",
                               "steps": 0, "wall_s": 0.1, "field": "dataset"}])
    assert runview.status_message(failed) == ("error", "Failed: No data file at 'x.csv'.")
    assert runview.progress(failed) is None
    assert not runview.has_anything_to_show(failed)
    assert runview.progress(state("queued")) is None
    assert runview.progress(state("running")) == (0.0, "loading the model and data")


def test_a_run_that_completed_badly_is_yellow_and_says_why():
    from gradacc import events as ev

    warned = state("running", [ev.run_ended(status="completed", reason=None, steps=63, wall_s=3.5,
                                            warnings=["eval F1 0.000 is no better than always predicting the most "
                                                      "frequent label (0.000): the model learnt nothing it can use.",
                                                      "Likely cause: learning rate 0.001 is high for a pretrained "
                                                      "model; its recipe uses 5e-05."])])
    kind, sentence = runview.status_message(warned)
    assert kind == "warning"
    assert sentence == ("Completed: 63 optimizer steps in 3.5 s, but it went badly. Eval F1 0.000 is no better than "
                        "always predicting the most frequent label (0.000): the model learnt nothing it can use. "
                        "Likely cause: learning rate 0.001 is high for a pretrained model; its recipe uses 5e-05.")
    good = state("running", [ev.run_ended(status="completed", reason=None, steps=63, wall_s=3.5, warnings=[])])
    assert runview.status_message(good) == ("success", "Completed: 63 optimizer steps in 3.5 s.")


def test_a_run_getting_ready_says_its_phase_and_counts_its_seconds():
    # Something moves from the first second: the phase the engine said last (RunOptions.on_phase), counting up.
    now = [100.0]
    run = state("running")
    run.clock = lambda: now[0]
    run.set_phase("tokenising 32,200 texts")
    now[0] = 102.4
    assert runview.status_message(run) == ("info", "Running: tokenising 32,200 texts… 2 s")
    assert runview.progress(run) == (0.0, "tokenising 32,200 texts… 2 s")
    snapshot = run.snapshot()  # what the pages draw from
    assert runview.status_message(snapshot)[1] == "Running: tokenising 32,200 texts… 2 s"
    from gradacc import events as ev

    run.record(ev.run_started(config={"backend": "pytorch", "micro_batch_size": 8, "grad_accum_steps": 4},
                              effective_batch=32, total_steps=10, steps_per_epoch=10, train_examples=320,
                              eval_examples=10, static_memory={"total": 1}, device="cpu"))
    assert runview.status_message(run)[1].startswith("Running on cpu: effective batch 32")  # ready: its steps


def test_the_engine_says_each_phase_of_getting_ready_before_its_first_event():
    from gradacc.config import RunConfig
    from gradacc.training.run.engine import train

    said, first_event = [], []
    config = RunConfig(model="tiny-bert", micro_batch_size=8, grad_accum_steps=1, train_samples=16, eval_samples=8,
                       epochs=1, max_seq_length=16).check()
    train(config, lambda event: first_event.append(len(said)) if not first_event else None, on_phase=said.append)
    assert said[:3] == ["loading the data (builtin-sentiment)", "loading the model (tiny-bert)", "tokenising 24 texts"]
    assert first_event == [len(said)]  # every phase said before run_started
