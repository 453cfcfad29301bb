"""gradacc.audit on mixture-of-experts models: a tiny Mixtral causal LM (4 experts, top 2, output_router_logits=True)
and Mixtral's sequence classifier, each trained by a stock Trainer with k = 4, as a user writes it.

The truth is computed here, apart from gradacc and from transformers' loss code: at the optimizer step, a float64
copy of the model replays each micro-batch; the main loss by hand from the logits (cross-entropy over the window's
predicted tokens), the router loss by hand from the router logits (a loop over every layer's unpadded rows: E · Σ_e
(share of top-k choices of e) · (mean probability of e)); the step's gradient is fitted on the two (g ≈ a·∇main +
b·coef·∇(the micro-batches' mean router loss)) by least squares."""

import json

import pytest
import torch
import torch.nn.functional as F

from audit_support import K, cls_data, dpo_trainer, lm_collator, lm_data, mixtral, padding_collator, trainer_args
from audit_support import train as train_with_truth
from audit_truth import router_loss_by_hand
from gradacc.cli.audit import EXIT_OK, EXIT_WRONG, strict_status
from gradacc.training.audit import verdict as V
from gradacc.training.audit.vocabulary import Cause, CheckName, LossKind
from gradacc.training.compat import trl
from gradacc.training.tolerances import NOISE


class Truth:
    """Records the window's training forwards; at the optimizer step (a callback added before the audit's), the
    step's gradient and the truth's two references, from a float64 copy of the model."""

    def __init__(self, trainer, causal: bool):
        from transformers import TrainerCallback

        self.trainer, self.causal, self.batches, self.open, self.result = trainer, causal, [], True, None
        self.handle = trainer.model.register_forward_hook(self._record, with_kwargs=True)
        self.clip = 1.0  # Trainer's clipping (max_grad_norm) runs before this step hook: its factor, undone
        truth, clip_grad_norm = self, trainer.accelerator.clip_grad_norm_

        def clip_recorded(parameters, max_norm, *args, **kwargs):
            norm = clip_grad_norm(parameters, max_norm, *args, **kwargs)
            truth.clip = min(1.0, max_norm / (float(norm) + 1e-6))  # torch's own clip coefficient
            return norm

        trainer.accelerator.clip_grad_norm_ = clip_recorded
        compute_loss, self.labels = trainer.compute_loss, []

        def labels_recorded(model, inputs, *args, **kwargs):  # before Trainer pops them for a compute_loss_func
            if truth.open and model.training and torch.is_grad_enabled():
                truth.labels.append(inputs["labels"].clone())
            return compute_loss(model, inputs, *args, **kwargs)

        trainer.compute_loss = labels_recorded

        class Close(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                if truth.open:
                    truth.open = False
                    truth.handle.remove()
                    truth.result = truth.compute()

        trainer.add_callback(Close())

    def _record(self, module, args, kwargs, output):
        if self.open and module.training and torch.is_grad_enabled():
            self.batches.append({name: kwargs[name].detach().clone() for name in ("input_ids", "attention_mask")})

    def compute(self) -> dict:
        model = self.trainer.model
        copy = type(model)(model.config).double()
        copy.load_state_dict(model.state_dict())
        copy.set_experts_implementation("eager")  # torch's grouped matmul takes no float64
        copy.train()
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = [dict(copy.named_parameters())[n] for n in names]
        applied = torch.cat([dict(model.named_parameters())[n].grad.double().reshape(-1) for n in names]) / self.clip
        main, router, items = 0, [], 0
        for batch, labels in zip(self.batches, self.labels, strict=True):
            out = copy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_router_logits=True)
            if self.causal:
                target = labels[:, 1:]
                main = main + F.cross_entropy(out.logits[:, :-1].flatten(0, 1), target.flatten(), ignore_index=-100,
                                              reduction="sum")
                items += int((target != -100).sum())
                router.append(router_loss_by_hand(out.router_logits, model.config.num_experts_per_tok,
                                                  batch["attention_mask"]))
            else:
                main, items = main + F.cross_entropy(out.logits, labels, reduction="sum"), items + labels.numel()

        def flat(loss, keep=False):
            grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=keep)
            return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])

        m = flat(main / items, keep=bool(router))
        if not router:
            return {"main_scale": float(applied @ m / (m @ m))}
        r = model.config.router_aux_loss_coef * flat(sum(router) / len(router))
        a, b = torch.linalg.lstsq(torch.stack([m, r], dim=1), applied[:, None]).solution.flatten().tolist()
        gate = torch.cat([torch.full((p.numel(),), n.endswith("mlp.gate.weight")) for n, p in zip(names, params)])
        right = m + r
        return {"main_scale": a, "router_scale": b,
                "whole_off": float((applied - right).norm() / right.norm()),
                "router_weights_off": float((applied - right)[gate].norm() / right[gate].norm())}


def train(model, causal: bool, **extra):
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from gradacc.audit import audit_trainer

    trainer = Trainer(model=model, args=TrainingArguments(**trainer_args()), **extra,
                      train_dataset=lm_data() if causal else cls_data(),
                      data_collator=lm_collator() if causal else padding_collator())
    trainer.remove_callback(PrinterCallback)
    truth = Truth(trainer, causal)
    audit = audit_trainer(trainer)
    trainer.train()
    return audit.verdict, truth.result


def test_the_router_loss_gradacc_computes_is_the_load_balancing_loss_by_hand_and_transformers():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    from gradacc.training.audit import router

    generator = torch.Generator().manual_seed(0)
    logits = tuple(torch.randn(3 * 5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
                   for _ in range(2))
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[0, 3:], mask[2, 1:] = 0, 0  # padding is no row of the loss
    ours = router.load_balancing(router.expert_sums(logits, 2, mask))
    by_hand = router_loss_by_hand(logits, 2, mask)
    assert float(ours) == pytest.approx(float(by_hand), rel=1e-12)
    assert float(ours) == pytest.approx(float(load_balancing_loss_func(logits, 4, 2, mask)), rel=1e-6)
    for g, h in zip(torch.autograd.grad(ours, logits), torch.autograd.grad(by_hand, logits)):
        torch.testing.assert_close(g, h, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("coefficient", [0.02, 0.001], ids=["coef 0.02", "Mixtral's default 0.001"])
def test_a_stock_trainer_adds_the_router_loss_k_times_and_the_audit_says_so_on_the_router_weights(coefficient):
    from transformers import MixtralForCausalLM

    torch.manual_seed(0)
    verdict, truth = train(MixtralForCausalLM(mixtral(coefficient)), causal=True)
    # The truth: the main loss is exact (num_items_in_batch), the router term k× the micro-batches' mean.
    assert truth["main_scale"] == pytest.approx(1, abs=1e-4)
    assert truth["router_scale"] == pytest.approx(K, rel=1e-3)
    assert verdict.gradient == Cause.ROUTER_K_TIMES and not verdict.ok, verdict.line
    assert verdict.router.fit.scale == pytest.approx(truth["router_scale"], rel=1e-4)
    assert verdict.router.main_scale == pytest.approx(truth["main_scale"], abs=1e-5)
    assert verdict.fit.scale == pytest.approx(1, abs=1e-5) and verdict.fit.plain_scale  # no false main verdict
    assert verdict.kind == LossKind.CAUSAL
    assert verdict.router.off_on_router_weights == pytest.approx(truth["router_weights_off"], rel=1e-3)
    assert "model.router_aux_loss_coef = model.config.router_aux_loss_coef / 4" in verdict.fix
    assert "by the router loss term's own cause" in verdict.check(CheckName.LOGGED_LOSS).detail
    if coefficient == 0.001:  # under the whole gradient's fp32 noise, yet a large share of the router weights'
        assert truth["whole_off"] < NOISE["fp32"] and truth["router_weights_off"] > 0.1
    assert strict_status([json.loads(json.dumps(verdict.as_dict(), default=str))]) == EXIT_WRONG  # --strict fails it
    # one replay found the step is not the right objective's gradient; a second, without the router loss, told why
    assert verdict.replay.endswith("replayed again without the router loss, to tell its term apart"), verdict.replay


def test_the_fix_it_names_divides_what_each_forward_adds_and_makes_the_step_exact():
    from transformers import MixtralForCausalLM

    torch.manual_seed(0)
    model = MixtralForCausalLM(mixtral(0.02))
    model.router_aux_loss_coef = model.config.router_aux_loss_coef / K
    verdict, truth = train(model, causal=True)
    assert truth["router_scale"] == pytest.approx(1, rel=1e-3) and truth["main_scale"] == pytest.approx(1, abs=1e-4)
    assert verdict.ok and verdict.gradient == V.EXACT, verdict.line
    assert verdict.router.cause == V.EXACT
    assert verdict.router.fit.scale == pytest.approx(truth["router_scale"], rel=1e-4)
    assert verdict.check(CheckName.LOGGED_LOSS).ok
    assert strict_status([verdict.as_dict()]) == EXIT_OK
    # a right step costs one replay: both terms back-propagated together, and found to be the step's gradient
    assert verdict.replay == "each micro-batch replayed from its own random state; outputs bit-identical"


@pytest.mark.parametrize("factor", [1.1, 2.0])
def test_a_router_term_a_little_off_at_a_small_coefficient_is_still_caught(factor):
    """The right step is recognised in one replay of both terms together, on the router weights: a router term 1.1×
    (coef 0.001) or 2× (coef 0.0001) is not taken for it, and the second replay names its scale as the truth has it."""
    from transformers import MixtralForCausalLM

    coefficient = 0.001 if factor < 2 else 0.0001
    torch.manual_seed(0)
    model = MixtralForCausalLM(mixtral(coefficient))
    model.router_aux_loss_coef = coefficient / K * factor
    verdict, truth = train(model, causal=True)
    assert truth["router_scale"] == pytest.approx(factor, rel=1e-3) and truth["whole_off"] < NOISE["fp32"]
    assert verdict.gradient == Cause.ROUTER_SCALED and not verdict.ok, verdict.line
    assert verdict.router.fit.scale == pytest.approx(truth["router_scale"], rel=1e-3)
    assert verdict.fit.plain_scale and verdict.fit.near(1)  # the main loss: right


def test_mixtrals_classifier_adds_no_router_loss_and_is_judged_on_its_own_loss():
    from transformers import MixtralForSequenceClassification

    from gradacc.audit import classifier_mean_loss

    torch.manual_seed(0)
    verdict, truth = train(MixtralForSequenceClassification(mixtral(0.02)), causal=False)
    assert truth["main_scale"] == pytest.approx(K, rel=1e-4)  # its forward takes **kwargs: #47688
    assert verdict.gradient == V.K_TIMES and verdict.router is None, verdict.line
    assert verdict.fit.scale == pytest.approx(truth["main_scale"], rel=1e-4)
    assert "classifier_mean_loss" in verdict.fix
    torch.manual_seed(0)
    verdict, truth = train(MixtralForSequenceClassification(mixtral(0.02)), causal=False,
                           compute_loss_func=classifier_mean_loss)
    assert truth["main_scale"] == pytest.approx(1, abs=1e-4)
    assert verdict.ok and verdict.gradient == V.EXACT, verdict.line


def test_a_compute_loss_func_drops_the_router_loss_unless_it_adds_it_and_the_audit_says_which():
    """Trainer pops the labels for a compute_loss_func, so the model adds no router loss: the truth's router term is
    0 and the audit says no router loss is trained; a function that adds coef / k × aux_loss trains it (truth 1×), and
    the audit judges that term as the model's own."""
    from transformers import MixtralForCausalLM

    from gradacc.audit import causal_lm_mean_loss

    def with_router_loss(outputs, labels, num_items_in_batch=None):
        main = causal_lm_mean_loss(outputs, labels, num_items_in_batch=num_items_in_batch)
        return main + 0.02 / K * outputs.aux_loss

    for loss_func, router_scale in ((causal_lm_mean_loss, 0.0), (with_router_loss, 1.0)):
        torch.manual_seed(0)
        verdict, truth = train(MixtralForCausalLM(mixtral(0.02)), causal=True, compute_loss_func=loss_func)
        assert truth["router_scale"] == pytest.approx(router_scale, abs=1e-3)
        assert truth["main_scale"] == pytest.approx(1, abs=1e-4)
        check = verdict.check(CheckName.ROUTER_LOSS)
        if router_scale:  # the function's router term judged as the model's would be
            assert verdict.ok and check.ok and verdict.router.fit.scale == pytest.approx(1, abs=1e-4), verdict.line
        else:
            assert not verdict.ok and check.ok is False and "outputs.aux_loss" in check.fix, verdict.line


def test_a_plain_loop_on_an_moe_model_is_judged_main_and_router_apart_and_its_fix_keeps_the_router_term():
    """The seed's loop, ``model(**batch).loss / k``, on Mixtral: the main loss weighted by micro-batch (texts of
    uneven lengths), the router term right (each forward's coef·aux ÷ k is the micro-batches' mean, by construction).
    Not ÷ k: both k×, the main fit against equal weights 4× (the router term fitted beside that reference, not the
    other, or it reads "no scale"). The fix as its line says (tokens summed ÷ the window's, + the router term ÷ k):
    exact. The same loss with the router term left out: named, with the loop's own fix."""
    from transformers import MixtralForCausalLM
    from test_audit_loop import plain_loop, tokens_summed_over_the_window

    def model():
        return MixtralForCausalLM(mixtral(0.02))

    divided, *_ = plain_loop(model, lm_data(32), lm_collator())
    assert divided.gradient == V.WEIGHTED and divided.weighted_fit.scale == pytest.approx(1, abs=1e-5), divided.line
    assert divided.router.cause == V.EXACT and divided.router.fit.scale == pytest.approx(1, abs=1e-5)
    term = "+ model.config.router_aux_loss_coef * outputs.aux_loss / 4; loss.backward()"
    assert term in divided.fix, divided.fix

    undivided, *_ = plain_loop(model, lm_data(32), lm_collator(), body=lambda m, batch, window: m(**batch).loss)
    assert undivided.gradient == V.WEIGHTED and undivided.weighted_fit.scale == pytest.approx(K, rel=1e-5)
    assert undivided.router.cause == Cause.ROUTER_K_TIMES and undivided.router.fit.scale == pytest.approx(K, rel=1e-4)
    assert term in undivided.fix and undivided.check(CheckName.ROUTER_LOSS).fix == "the gradient's fix above adds it at 1/k"

    def fixed(m, batch, window):
        return tokens_summed_over_the_window(m, batch, window) + m.config.router_aux_loss_coef * m(**batch).aux_loss / K

    exact, *_ = plain_loop(model, lm_data(32), lm_collator(), body=fixed)
    assert exact.ok and exact.gradient == V.EXACT and exact.router.cause == V.EXACT, exact.line

    dropped, *_ = plain_loop(model, lm_data(32), lm_collator(), body=tokens_summed_over_the_window)
    assert dropped.gradient == Cause.ROUTER_OTHER and dropped.router.fit.scale == pytest.approx(0, abs=1e-6)
    assert dropped.fix == "add the router term to each micro-batch's loss: + " \
                          "model.config.router_aux_loss_coef * outputs.aux_loss / 4", dropped.fix


@pytest.mark.parametrize("backward, main_scale, router_cause", [("accelerator", 1, Cause.EXACT),
                                                                ("plain", K, Cause.ROUTER_K_TIMES)])
def test_an_accelerate_loop_on_an_moe_model_judges_the_main_loss_and_the_router_term_apart(backward, main_scale,
                                                                                           router_cause):
    """accelerate's example loop on Mixtral: accelerator.backward(outputs.loss) divides the whole loss by k, the
    router term included (right, by construction: coef·aux ÷ k per forward); loss.backward() leaves both k×."""
    from transformers import MixtralForCausalLM
    from audit_support import accelerate_loop

    verdict, *_ = accelerate_loop(lambda: MixtralForCausalLM(mixtral(0.02)), lm_data(32), lm_collator(),
                                  backward=backward)
    assert verdict.gradient == V.WEIGHTED and verdict.weighted_fit.scale == pytest.approx(main_scale, rel=1e-5)
    assert verdict.router.cause == router_cause
    assert verdict.router.fit.scale == pytest.approx(main_scale, rel=1e-4), verdict.line


def test_the_accelerate_items_fix_on_an_moe_model_counts_first_and_keeps_the_router_term_out_of_the_rescale():
    """The verdict's fix for Accelerate on Mixtral, as its line says, in accelerate's own way of counting a window's
    tokens first (examples/by_feature/gradient_accumulation_for_autoregressive_models.py): exact. Rescaling the
    gradients at the step (the fix without a router term) would have rescaled the router term too."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import MixtralForCausalLM

    from audit_support import accelerate_loop, reset_accelerate
    from gradacc.audit import audit_accelerate

    verdict, *_ = accelerate_loop(lambda: MixtralForCausalLM(mixtral(0.02)), lm_data(32), lm_collator())
    line = ("then per micro-batch accelerator.backward(F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, "
            "1:].flatten(), ignore_index=-100, reduction='sum') / window_items * k * processes + "
            "model.config.router_aux_loss_coef * outputs.aux_loss)")
    assert verdict.gradient == V.WEIGHTED and line in verdict.fix, verdict.fix

    reset_accelerate()
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
    model = MixtralForCausalLM(mixtral(0.02))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loader = DataLoader(lm_data(32), batch_size=4, shuffle=True, collate_fn=lm_collator())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    audit = audit_accelerate(accelerator, model, optimizer)
    batches = iter(loader)
    for _ in range(len(loader) // K):
        window = [next(batches) for _ in range(K)]
        window_items = accelerator.reduce(sum((b["labels"][:, 1:] != -100).sum() for b in window), "sum")
        for batch in window:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                logits, labels = outputs.logits, batch["labels"]
                summed = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100,
                                         reduction="sum")
                accelerator.backward(summed / window_items * K * accelerator.num_processes
                                     + model.config.router_aux_loss_coef * outputs.aux_loss)
                optimizer.step()
                optimizer.zero_grad()
    reset_accelerate()
    assert audit.verdict.ok and audit.verdict.gradient == V.EXACT and audit.verdict.router.cause == V.EXACT, \
        audit.verdict.line


def test_dpo_on_an_moe_model_is_judged_with_trls_router_term_and_is_exact(tmp_path):
    """TRL's DPOTrainer adds router_aux_loss_coef · aux_loss to each micro-batch's DPO loss (TRL turns it on for an
    MoE model); the audit replays its compute_loss, router term included. The truth: DPO's loss by hand from the
    replayed log-probs and the reference model's, plus coef × the micro-batches' mean router loss by hand; the step
    is that, and not DPO's part alone."""
    from transformers import MixtralForCausalLM

    torch.manual_seed(0)
    trainer = dpo_trainer(MixtralForCausalLM(mixtral(0.02)), tmp_path / "policy")
    assert trl.adds_router_loss(trainer) and trainer.router_aux_loss_coef == 0.02
    top_k = trainer.model.config.num_experts_per_tok
    verdict, truth = train_with_truth(trainer, "dpo", ref_model=trainer.ref_model, beta=trainer.args.beta,
                                      router=(0.02, lambda logits, mask: router_loss_by_hand(logits, top_k, mask)))
    assert all(truth["replay_bitwise"]), truth["replay_bitwise"]
    measured = truth["accumulated_vs_truth"]
    assert measured["ratio"] == pytest.approx(1, abs=1e-5) and measured["residual"] < 1e-5
    assert truth["applied_vs_dpo_alone"]["residual"] > NOISE["fp32"]  # the router term is in the step: it is seen
    assert verdict.ok and verdict.gradient == V.EXACT, verdict.line
    assert verdict.fit.scale == pytest.approx(measured["ratio"], rel=1e-4)
    assert verdict.kind == LossKind.TRAINER_LOSS and verdict.micro_batches == 2 and verdict.items == (2, 2)  # pairs
    assert "DPOTrainer's compute_loss, replayed" in verdict.reference  # TRL's own router term: a factor inside unseen
