"""BatchNorm couples the examples of a micro-batch: accumulation is not the big batch. LayerNorm does not."""

import pytest

from gradacc.analysis.equivalence import check
from gradacc.config import RunConfig

EXACT_TOLERANCE = 1e-5


@pytest.mark.parametrize("backend", ["pytorch", "accelerate", "trainer"])
def test_batchnorm_is_off_and_layernorm_exact_on_every_backend(backend, one_torch_thread):
    errors = {model: check(RunConfig(model=model, backend=backend, micro_batch_size=4, grad_accum_steps=2,
                                     max_seq_length=16))["exact_rel_error"]
              for model in ("bow-batchnorm", "bow-layernorm")}
    assert errors["bow-batchnorm"] > 0.01
    assert errors["bow-layernorm"] <= EXACT_TOLERANCE


def test_batchnorm_error_grows_as_the_micro_batch_shrinks(one_torch_thread):
    report = check(RunConfig(model="bow-batchnorm", micro_batch_size=4, grad_accum_steps=4, max_seq_length=16))
    rows = {row["micro_batch_size"]: row["rel_error"] for row in report["by_micro_batch"]}
    assert list(rows) == [2, 4, 8, 16]
    assert rows[2] > rows[4] > rows[8] > 0.01
    assert rows[16] <= EXACT_TOLERANCE  # k = 1: the big batch itself
    assert list(report["cases"]) == ["equal_windows"]  # a short window's micro-batch of 1 BatchNorm refuses
    layer = check(RunConfig(model="bow-layernorm", micro_batch_size=4, grad_accum_steps=4, max_seq_length=16))
    assert max(row["rel_error"] for row in layer["by_micro_batch"]) <= EXACT_TOLERANCE


def test_batchnorm_refuses_a_micro_batch_of_one_in_words():
    from gradacc.events import Recorder
    from gradacc.training.run.engine import train

    ended = train(RunConfig(model="bow-batchnorm", micro_batch_size=1, grad_accum_steps=2, train_samples=4,
                            eval_samples=4, max_seq_length=16, epochs=1), Recorder())
    assert ended["status"] == "failed" and ended["field"] == "micro_batch_size"
    assert "BatchNorm needs two examples" in ended["reason"]


def test_the_memory_probes_refuse_the_norm_models_in_words():
    from gradacc.analysis.planner import measure_levers
    from gradacc.errors import GradaccError

    with pytest.raises(GradaccError, match="budget probes one example alone") as refused:
        RunConfig(model="bow-batchnorm", memory_budget_mb=5.0).check()
    assert refused.value.field == "memory_budget_mb"
    with pytest.raises(GradaccError, match="cannot be planned") as refused:
        measure_levers("bow-layernorm", 32)
    assert refused.value.field == "model"
