"""The Code page: each backend's real train loop from gradacc's source, with the settings filled in."""

import pytest
from app_support import error_after, open_app, set_numbers

EXPECTED = {
    "pytorch": ["precision.scale(loss).backward()", "precision.step(optimizer)", "optimizer.zero_grad()"],
    "accelerate": ["with accelerator.accumulate(model):", "accelerator.backward("],
    "trainer": ["TrainingArguments(",
                "gradient_accumulation_steps=config.grad_accum_steps,  # ← grad_accum_steps = 2"],
}


@pytest.mark.parametrize("backend", list(EXPECTED))
def test_shows_the_loop_the_backend_runs_with_the_settings(app_home, backend):
    at = open_app("code")
    at.radio(key="form.code.backend").set_value(backend)
    set_numbers(at, "code", {"micro_batch_size": 16, "grad_accum_steps": 2})
    code = at.code[0].value
    assert code.startswith("# gradacc.training.backends.")
    assert "micro_batch_size = 16" in code and "grad_accum_steps = 2" in code
    assert "effective_batch = 32" in code
    assert "def train(job)" in code
    for fragment in EXPECTED[backend]:
        assert fragment in code
    assert not at.exception


def test_follows_the_train_page_settings_and_refuses_bad_ones(app_home):
    at = open_app()
    set_numbers(at, "train", {"micro_batch_size": 6, "grad_accum_steps": 3})
    at.radio(key="form.train.backend").set_value("accelerate").run()
    at.switch_page("pages/code.py").run()
    assert at.radio(key="form.code.backend").value == "accelerate"
    assert "grad_accum_steps = 3" in at.code[0].value

    at.switch_page("pages/train.py").run()  # the Train form kept its values while the visitor was away
    assert at.number_input(key="form.train.micro_batch_size").value == 6
    at.switch_page("pages/code.py").run()

    set_numbers(at, "code", {"grad_accum_steps": 0})
    assert "Accumulation steps (k) must be a whole number from 1" in error_after(at, "form.code.grad_accum_steps")
    assert not at.code
