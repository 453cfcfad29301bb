"""The contracts of gradacc.training.compat: each internal of another project that gradacc reads or patches, checked
on the installed version. A failure names the project, its version and the internal that moved, so a new release
that breaks gradacc says where (scripts/compat_newest.sh runs these against the newest releases)."""

import inspect
from types import SimpleNamespace

import pytest
import torch


def contract(project: str, name: str, holds: bool, detail: str = "") -> None:
    import importlib

    version = importlib.import_module(project).__version__
    assert holds, f"{project} {version}: {name} moved or changed{': ' + detail if detail else ''}"


def test_accelerate_prepared_scheduler_settings_and_its_state_singletons():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState

    from gradacc.training.compat import accelerate as compat

    compat.reset_accumulation_state()
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    prepared = getattr(accelerator, compat.PREPARED_SCHEDULERS, None)
    contract("accelerate", "Accelerator._schedulers", isinstance(prepared, list) and prepared == [scheduler])
    for name in compat.SCHEDULER_SETTINGS:
        contract("accelerate", f"AcceleratedScheduler.{name}", hasattr(scheduler, name))
    assert compat.scheduler_steps_per_optimizer_step(accelerator, [scheduler.scheduler]) == 1  # one process
    assert compat.scheduler_steps_per_optimizer_step(accelerator, []) is None
    for cls in (AcceleratorState, GradientState):
        contract("accelerate", f"{cls.__name__}._reset_state", callable(getattr(cls, "_reset_state", None)))
    contract("accelerate", "PartialState._shared_state", isinstance(getattr(PartialState, "_shared_state", None), dict))
    compat.reset_accumulation_state()


def test_accelerate_prepared_loader_draws_its_base_seed_from_the_generator_it_is_given():
    from accelerate import Accelerator

    from gradacc.training.compat import accelerate as compat

    compat.reset_accumulation_state()
    loader = Accelerator(cpu=True).prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=4))
    contract("accelerate", f"DataLoaderShard.{compat.WRAPPED_LOADER}",
             isinstance(getattr(loader, compat.WRAPPED_LOADER, None), torch.utils.data.DataLoader))
    compat.draw_base_seeds_from(loader, torch.Generator().manual_seed(0))
    before = torch.get_rng_state()
    assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    contract("accelerate", "DataLoaderShard iterates its base_dataloader", torch.equal(before, torch.get_rng_state()),
             "a pass drew from torch's default generator")
    compat.reset_accumulation_state()


def test_transformers_trainer_compute_loss_takes_num_items_in_batch_after_model_and_inputs():
    from transformers import Trainer

    from gradacc.training.compat import transformers as compat

    names = list(inspect.signature(Trainer.compute_loss).parameters)
    contract("transformers", "Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)",
             names[:5] == ["self", "model", "inputs", "return_outputs", "num_items_in_batch"], str(names))
    source = inspect.getsource(Trainer.training_step)
    contract("transformers", "Trainer.training_step calls compute_loss(model, inputs, num_items_in_batch=...)",
             "num_items_in_batch=num_items_in_batch" in source)
    assert compat.num_items_in_batch(("model", "inputs"), {"num_items_in_batch": 7}) == 7
    assert compat.num_items_in_batch((False, 9), {}) == 9  # the arguments after model and inputs, by position
    assert compat.num_items_in_batch((), {}) is None


@pytest.mark.parametrize("family", ["Mixtral", "Qwen2Moe"])
def test_transformers_moe_causal_lms_keep_their_router_loss_settings_on_the_instance(family):
    import transformers

    from gradacc.training.compat import transformers as compat

    experts = {"Mixtral": "num_local_experts", "Qwen2Moe": "num_experts"}[family]
    config = getattr(transformers, f"{family}Config")(
        hidden_size=16, intermediate_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=32, num_experts_per_tok=2,
        output_router_logits=True, router_aux_loss_coef=0.5, **{experts: 4})
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    settings = compat.router_loss_settings(model)
    contract("transformers", f"{family}ForCausalLM keeps router_aux_loss_coef, num_experts, num_experts_per_tok",
             settings == (0.5, 0.5, 4, 2), str(settings))
    names = compat.router_parameter_names(model)
    contract("transformers", f"{family}'s _can_record_outputs['router_logits'] names its router class",
             names == {f"model.layers.{i}.mlp.gate.weight" for i in range(2)}, str(names))
    ids = torch.randint(0, 32, (2, 6))
    out = model(input_ids=ids, labels=ids)
    model.router_aux_loss_coef = 0.25  # the forward reads the instance's coefficient (the audit's fix sets it)
    halved = model(input_ids=ids, labels=ids)
    contract("transformers", f"{family}ForCausalLM adds router_aux_loss_coef (its own) × aux_loss to its loss",
             torch.allclose(out.loss - halved.loss, 0.25 * out.aux_loss), f"{out.loss} {halved.loss} {out.aux_loss}")
    classifier = getattr(transformers, f"{family}ForSequenceClassification")(config)
    assert compat.router_loss_settings(classifier) is None  # its loss holds no router term


def test_trl_trainers_keep_the_state_a_replay_changes_and_their_classes():
    import trl

    from gradacc.training.compat import trl as compat

    source = inspect.getsource(trl.trainer.sft_trainer.SFTTrainer)
    for name in compat.REPLAY_MUTATED:
        contract("trl", f"SFTTrainer.{name}", f"self.{name}" in source)
    for name in ("DPOTrainer", "GRPOTrainer", "RLOOTrainer"):
        contract("trl", name, hasattr(trl, name))
    dpo = inspect.getsource(trl.DPOTrainer)
    contract("trl", "DPOTrainer.ref_model", "self.ref_model" in dpo)
    contract("trl", "DPOTrainer.aux_loss_enabled", "self.aux_loss_enabled" in dpo)
    contract("trl", "DPOTrainer's batch is [chosen, rejected]", "chunk(2, dim=0)  # batch is [chosen, rejected]" in dpo)
    fields = trl.DPOConfig.__dataclass_fields__
    for name in ("loss_type", "loss_weights", "beta", "label_smoothing", "f_divergence_type", "ld_alpha",
                 "use_weighting"):
        contract("trl", f"DPOConfig.{name}", name in fields)

    class Mine(trl.DPOTrainer):  # never built: its class is enough
        pass

    assert compat.trl_class(Mine.__new__(Mine), ("DPOTrainer",)) == "DPOTrainer"


def test_grpo_trainer_hands_its_loss_the_inputs_and_settings_the_audit_reads():
    import trl

    from gradacc.training.compat import trl as compat

    generated = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)
    for key in compat.GRPO_INPUTS + compat.GRPO_OTHER_INPUTS:
        contract("trl", f"GRPOTrainer's micro-batch key {key!r}",
                 f'"{key}":' in generated or f'output["{key}"]' in generated)
    loss = inspect.getsource(trl.GRPOTrainer._compute_loss)
    contract("trl", "GRPOTrainer._compute_loss reads the stored log-probs",
             'inputs.get("old_per_token_logps")' in loss and 'inputs["ref_per_token_logps"]' in loss)
    contract("trl", "GRPOTrainer.aux_loss_enabled", "self.aux_loss_enabled" in inspect.getsource(trl.GRPOTrainer))
    # An MoE model's router term: the coefficient the trainer holds, × aux_loss ÷ the accumulation steps, per
    # micro-batch (the audit's reference is coef × the micro-batches' mean router loss).
    built = inspect.getsource(trl.GRPOTrainer.__init__)
    contract("trl", "GRPOTrainer.router_aux_loss_coef (GRPOConfig's, else the model config's)",
             "self.router_aux_loss_coef = getattr(text_config, \"router_aux_loss_coef\", 0.0) if coef is None else "
             "coef" in built)
    contract("trl", "GRPOTrainer adds router_aux_loss_coef · aux_loss ÷ the accumulation steps",
             "normalizer = self.current_gradient_accumulation_steps" in loss
             and "loss = loss + self.router_aux_loss_coef * aux_loss / normalizer" in loss)
    assert compat.router_loss_coefficient(SimpleNamespace(router_aux_loss_coef=0.02)) == 0.02
    assert compat.router_loss_coefficient(object()) == 0.0  # a trainer that adds none
    args = trl.GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False)
    # Every field the audit reads exists, with the defaults its objective assumes (nothing unsupported).
    settings = compat.grpo_settings(args)
    contract("trl", "GRPOConfig's objective fields and defaults",
             settings["epsilon_low"] == settings["epsilon_high"] == 0.2 and settings["bias_correction_kl"],
             str(settings))
    contract("trl", "GRPOConfig's defaults are the audit's scope", compat.grpo_unsupported(args) is None)
    changed = trl.GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False, num_iterations=2,
                              top_entropy_quantile=0.5)
    assert compat.grpo_unsupported(changed).startswith("num_iterations=2: ")
    assert compat.trl_class(object(), ("DPOTrainer",)) is None


def test_torch_scheduler_mark_ddp_flag_and_fsdp_records():
    from torch.distributed.fsdp._fully_shard import _fsdp_param
    from torch.nn.parallel import DistributedDataParallel

    from gradacc.training.compat import torch as compat

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    contract("torch", f"optimizer.step.{compat.SCHEDULER_MARK}", getattr(optimizer.step, compat.SCHEDULER_MARK, False))

    def replacement():
        pass

    compat.keep_scheduler_mark(replacement, optimizer.step)
    assert getattr(replacement, compat.SCHEDULER_MARK)
    contract("torch", "DistributedDataParallel.require_backward_grad_sync (set by no_sync)",
             "self.require_backward_grad_sync = False" in inspect.getsource(DistributedDataParallel.no_sync))
    contract("torch", "FSDPParam._unsharded_param", "self._unsharded_param" in inspect.getsource(_fsdp_param.FSDPParam))
    contract("torch", "FSDPParam.unsharded_accumulated_grad",
             "unsharded_accumulated_grad" in inspect.getsource(_fsdp_param.FSDPParam))
    from torch.distributed.fsdp import FSDPModule

    contract("torch", "FSDPModule._get_fsdp_state", hasattr(FSDPModule, "_get_fsdp_state"))
    from torch.distributed.tensor import DTensor

    contract("torch", "DTensor._local_tensor", "_local_tensor" in getattr(DTensor, "__slots__", ()))


def test_torch_runs_a_callback_queued_during_backward_once_every_gradient_is_in_grad():
    """The pitfalls' after-backward hook: queued from a hook on the loss, it runs after the last parameter's
    gradient is accumulated, once per backward."""
    from gradacc.training.compat import torch as compat

    contract("torch", "Variable._execution_engine.queue_callback",
             callable(getattr(torch.autograd.Variable._execution_engine, "queue_callback", None)))
    first, second = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    seen = []
    for _ in range(2):
        loss = (first * 2).sum() + (second * 3).sum()
        loss.register_hook(lambda grad: compat.at_end_of_backward(
            lambda: seen.append((first.grad.tolist(), second.grad.tolist()))))
        loss.backward()
    contract("torch", "Variable._execution_engine.queue_callback (runs after .grad is accumulated)",
             seen == [([2.0] * 3, [3.0] * 2), ([4.0] * 3, [6.0] * 2)], str(seen))


def test_lightning_calls_the_hooks_on_the_instance_in_order_and_wraps_the_optimizer_in_a_copy():
    """A LightningModule's training_step and on_before_optimizer_step are looked up on the instance (an instance
    attribute stands in); the module's on_before_optimizer_step runs after the callbacks' and before
    configure_gradient_clipping; self.optimizers() is a LightningOptimizer whose attributes are its own copy."""
    L = pytest.importorskip("lightning", reason="the Lightning contract needs lightning (gradacc[lightning])")
    from gradacc.training.compat import lightning as compat

    order = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            wrapped = compat.lightning_optimizers(self)
            torch_optimizer = self.trainer.optimizers[0]
            torch_optimizer.zero_grad = lambda *a, **k: order.append("patched on the torch optimizer")
            wrapped[0].zero_grad()  # the copy's own zero_grad: the torch instance's patch is not seen through it
            del torch_optimizer.zero_grad
            contract("lightning", "LightningOptimizer (self.optimizers())", wrapped[0] is not torch_optimizer
                     and wrapped[0].optimizer is torch_optimizer)
            return self.net(batch[0]).sum()

        def configure_gradient_clipping(self, *args, **kwargs):
            order.append("clipping")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Callback(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            order.append("callback")

    module = Module()
    step = module.training_step
    module.training_step = lambda *args: order.append("instance training_step") or step(*args)
    module.on_before_optimizer_step = lambda optimizer: order.append("instance on_before_optimizer_step")
    data = torch.utils.data.TensorDataset(torch.randn(4, 2))
    trainer = L.Trainer(accelerator="cpu", max_steps=1, callbacks=[Callback()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    contract("lightning", f"hooks looked up on the instance ({', '.join(compat.INSTANCE_HOOKS)}), in order",
             order == ["instance training_step", "callback", "instance on_before_optimizer_step", "clipping"],
             str(order))

