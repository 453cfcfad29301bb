"""Memory measured from tensors: activations follow the micro-batch, not the accumulation steps."""

import pytest
import torch

from gradacc.training.memory import measure
from gradacc.config import RunConfig
from gradacc.training.run.engine import train
from gradacc.events import Recorder
from gradacc.training.tasks import load_model as load


@pytest.fixture(scope="module")
def model():
    return load(RunConfig(dropout=0.0), 2, ["a", "b"]).model


def activation_bytes(model, micro_batch, seq_len=64):
    meter = measure.ActivationMeter(model)
    input_ids = torch.randint(5, 500, (micro_batch, seq_len))
    with meter.measure():
        loss = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                     labels=torch.zeros(micro_batch, dtype=torch.long)).loss
    loss.backward()
    model.zero_grad()
    return meter.bytes


def test_activation_bytes_are_linear_in_the_micro_batch(model):
    sizes = {m: activation_bytes(model, m) for m in (4, 8, 16, 32)}
    assert sizes[8] / sizes[32] == pytest.approx(0.25, abs=0.03)
    assert sizes[16] / sizes[8] == pytest.approx(2.0, rel=0.03)


def test_parameters_are_not_counted_as_activations(model):
    parameter_bytes = measure.tensor_bytes(model.parameters())
    # One example's activations are far smaller than the weights they are saved beside.
    assert activation_bytes(model, 1, seq_len=8) < parameter_bytes


def test_shared_storage_is_counted_once():
    base = torch.zeros(100)
    assert measure.tensor_bytes([base, base[:10], base.view(10, 10)]) == 400


def test_static_bytes_add_up(model):
    optimizer = torch.optim.AdamW(model.parameters())
    before = measure.static_bytes(model, optimizer)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert before["parameters"] == before["gradients"] == params
    assert before["optimizer_state"] == 2 * params  # AdamW's two moments, before they exist
    model(input_ids=torch.tensor([[2, 10, 3]]), labels=torch.tensor([1])).loss.backward()
    optimizer.step()
    after = measure.static_bytes(model, optimizer)
    # Real state: two moments per parameter plus a step counter per tensor.
    assert 2 * params <= after["optimizer_state"] <= 2 * params + 8 * len(list(model.parameters()))
    assert after["total"] == after["parameters"] + after["gradients"] + after["optimizer_state"]
    model.zero_grad()


def test_cuda_readings_fall_back_to_none_on_cpu():
    assert measure.cuda_peak_bytes("cpu") is None
    measure.reset_cuda_peak("cpu")  # a no-op, not an error
    snapshot = measure.snapshot(123, "cpu")
    assert snapshot["activation_bytes"] == 123 and snapshot["cuda_peak_bytes"] is None
    assert snapshot["rss_bytes"] > 10_000_000


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_peak_is_measured_on_gpu():
    device = torch.device("cuda")
    measure.reset_cuda_peak(device)
    block = torch.empty(1024 * 1024, device=device)
    assert measure.cuda_peak_bytes(device) >= block.numel() * 4


def test_step_events_show_activations_growing_with_m_and_not_with_k():
    def first_step_activations(m, k):
        recorder = Recorder()
        # Same window contents for every k would need the same m; compare at equal m across k.
        ended = train(RunConfig(micro_batch_size=m, grad_accum_steps=k, train_samples=64, eval_samples=8, epochs=1,
                                max_steps=1, max_seq_length=32, dropout=0.0), recorder)
        assert ended["status"] == "completed", ended["reason"]
        return recorder.of("step")[0]["activation_bytes"]

    by_k = [first_step_activations(8, k) for k in (1, 2, 4)]
    assert max(by_k) == min(by_k), "the first micro-batch is the same whatever k is"
    assert first_step_activations(32, 1) > 3 * by_k[0]
