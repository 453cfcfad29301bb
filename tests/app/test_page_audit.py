"""The Audit page: a model in → the stock-Trainer verdict and its fix, trained off the page's thread; the lines that
audit one's own script; bad input in one sentence next to its field."""

from app_support import alerts, error_after, open_app, page_text, run_until, set_numbers

from gradacc.app import audit_view
from gradacc.training.audit.vocabulary import SENTENCES

AUDIT_TIMEOUT_S = 120


def audited(at):
    said = " ".join(alerts(at))
    return not at.status and any(kind in said for kind in ("Exact", "Not judged", "could not run",
                                                           *SENTENCES.values()))


def test_a_stock_trainer_on_tiny_bert_is_k_times_too_large_with_its_fix_and_the_own_script_lines(app_home):
    at = open_app("audit")
    assert "Press **Audit a stock Trainer**" in " ".join(alerts(at))
    codes = " ".join(block.value for block in at.code)
    assert "audit_trainer(trainer)" in codes and "audit_accelerate(accelerator, model, optimizer)" in codes
    assert "gradacc audit --strict -- python train.py" in codes
    set_numbers(at, "audit", {"micro_batch_size": 2, "grad_accum_steps": 4})
    at.button(key="run_audit").click().run()
    assert at.status and at.status[0].state == "running"  # the page came back at once; the audit trains elsewhere
    run_until(at, audited, AUDIT_TIMEOUT_S, "the stock-Trainer audit", every=0.5)
    said = " ".join(alerts(at))
    assert "Equivalence page" not in said  # a classifier's k× has nothing to do with the first label
    assert "The gradient is k× too large:" in said and "#47688" in said, said
    assert "compute_loss_func=gradacc.audit.classifier_mean_loss" in page_text(at)
    table = at.dataframe[0].value
    assert list(table["what"])[:2] == ["model", "the model's loss"] and table["value"][1] == "classifier"


def test_tiny_gpt_with_the_standard_collator_shows_trainers_miscount(app_home):
    at = open_app("audit")
    at.selectbox(key="form.audit.model_choice").set_value("tiny-gpt").run()
    assert at.selectbox(key="form.audit.dataset_choice").value == "builtin-text"  # the data follows the model
    set_numbers(at, "audit", {"micro_batch_size": 2, "grad_accum_steps": 2})
    at.button(key="run_audit").click().run()
    run_until(at, audited, AUDIT_TIMEOUT_S, "the stock-Trainer audit of tiny-gpt", every=0.5)
    assert "The loss is divided by a miscount of its items:" in " ".join(alerts(at)), page_text(at)
    assert 'model.loss_type = "ForCausalLM"' in page_text(at)
    # The Equivalence page's family table says Trainer's default is right for causal LMs: this page says which
    # collator it used, and why the two differ.
    assert "DataCollatorForLanguageModeling(mlm=False)" in at.markdown[0].value
    assert [box.value for box in at.info if "Equivalence page" in box.value] == [audit_view.OTHER_PAGE]


def test_bad_input_is_one_sentence_next_to_its_field_and_never_a_traceback(app_home, tmp_path):
    at = open_app("audit")
    set_numbers(at, "audit", {"micro_batch_size": 16, "grad_accum_steps": 8})
    assert "must keep m × k at most 64" in error_after(at, "form.audit.grad_accum_steps")
    assert at.button(key="run_audit").disabled
    set_numbers(at, "audit", {"micro_batch_size": 2, "grad_accum_steps": 2})
    at.selectbox(key="form.audit.model_choice").set_value("other: hub id or local folder").run()
    assert at.button(key="run_audit").disabled and "Pick a model" in page_text(at)
    at.text_input(key="form.audit.model_custom").set_value(str(tmp_path / "no-such-model")).run()
    at.button(key="run_audit").click().run()
    run_until(at, audited, AUDIT_TIMEOUT_S, "the audit of a missing folder", every=0.5)
    failure = [alert for alert in alerts(at) if alert.startswith("The audit could not run:")]
    assert len(failure) == 1 and "\n" not in failure[0] and not at.exception, alerts(at)


def test_an_audit_waits_for_a_run_training_says_so_and_then_gives_its_verdict(app_home):
    """A Trainer's audit shares Accelerate's state and torch's generator with the server's runs
    (gradacc.training.process_state): while a run trains it waits, and the page says for what instead of "training
    one step"."""
    from gradacc.training import process_state

    def says_it_waits(at) -> bool:
        return bool(at.status) and "waiting for its turn: it trains when no visitor's run is training" in at.status[0].label

    at = open_app("audit")
    set_numbers(at, "audit", {"micro_batch_size": 2, "grad_accum_steps": 3})  # settings no other test audits
    # What a visitor's run on the Accelerate or Trainer backend holds while it trains.
    with process_state.guard(accelerate=True, training=process_state.SIDE_BY_SIDE):
        at.button(key="run_audit").click().run()
        run_until(at, says_it_waits, AUDIT_TIMEOUT_S, "the audit waiting for the run", every=0.5)
    run_until(at, audited, AUDIT_TIMEOUT_S, "the stock-Trainer audit after the run", every=0.5)
    assert "The gradient is k× too large:" in " ".join(alerts(at)), page_text(at)
