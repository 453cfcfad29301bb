"""gradacc.audit on TRL's GRPOTrainer: a user's GRPO script (audit_scripts/train_grpo.py, from TRL's quickstart) with
``audit_trainer``, each verdict against the truth computed another way: the bench's float64 replay (a float64 copy
of the weights, the whole window's documented objective at once, autograd), and by hand from the stored token
counts. An exact loss type (grpo, with the default clipping and with β > 0 off-policy), bnpo (its documented local
mean: "varies with the micro-batch by design"), dapo at steps_per_generation = 2k (scaled by the generation's token
count, the next step's scale the rest of it) and with the fix the audit names (exact), a setting outside the
audit's objectives (not judged), and a tiny Mixtral whose router loss TRL adds (exact against dapo's objective plus
coef × the micro-batches' mean router loss, both by hand; its router term k× when added whole)."""

import importlib.util

import pytest
import torch

from audit_support import mixtral, whole_router_term
from audit_truth import router_loss_by_hand
from gradacc.audit import audit_trainer
from gradacc.bench.grpo import StepJudge
from gradacc.training.audit import verdict as V
from gradacc.training.audit.vocabulary import Cause, CheckName, LossKind
from gradacc.training.tolerances import NOISE
from support import ROOT

SPEC = importlib.util.spec_from_file_location("train_grpo", ROOT / "tests/training/audit_scripts/train_grpo.py")
script = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(script)


def audited(loss_type, k=2, steps_per_generation=None, steps=1, **extra):
    """The user's trainer with the audit, and the truth beside it: the bench's StepJudge, fed the inputs of each
    micro-batch's loss. (verdict, the truth's steps, the micro-batches' recorded inputs)."""
    from transformers import PrinterCallback

    trainer = script.trainer(loss_type, k, steps_per_generation, steps=steps, **extra)
    trainer.remove_callback(PrinterCallback)
    trainer.recorded, compute = [], trainer._compute_loss
    seen = []

    def recording(model, inputs):
        kept = {key: value.detach().clone() for key, value in inputs.items() if torch.is_tensor(value)}
        trainer.recorded.append(kept)
        seen.append(kept)
        return compute(model, inputs)

    trainer._compute_loss = recording
    truth = StepJudge(trainer, loss_type, script.tiny_qwen2())
    trainer.add_callback(truth)
    audit = audit_trainer(trainer)
    trainer.train()
    return audit.verdict, truth.steps, seen


def test_grpo_is_exact_with_the_default_clipping_judged_before_it():
    """max_grad_norm=1.0 (GRPOConfig's default) clips the step: the truth measures the clipped gradient at
    min(1, 1/‖t‖) of its window's, the audit judges it before clipping, as the window made it: exact."""
    verdict, truth, _ = audited("grpo")
    [step] = truth
    assert step["scale"] == pytest.approx(min(1.0, 1.0 / step["truth_norm"]), rel=1e-4) and step["residual"] < 1e-4
    assert verdict.kind == LossKind.GRPO and verdict.gradient == V.EXACT and verdict.ok, verdict.line
    assert abs(verdict.fit.scale - 1) < 1e-4 and verdict.fit.residual < 1e-4
    assert "grpo is accumulation-invariant by design" in verdict.meaning
    assert verdict.check("clipping").ok and "after micro-batch 2" in verdict.check("clipping").detail


def test_bnpo_varies_with_the_micro_batch_by_design_and_is_no_problem():
    verdict, truth, _ = audited("bnpo", max_grad_norm=0.0)
    [step] = truth
    assert step["verdict"] == "exact"  # the step is bnpo's documented local mean...
    versus = step["vs_window_token_mean"]  # ...which is not the window's token mean
    assert versus["residual"] > 1e-2
    assert verdict.gradient == V.BY_DESIGN and verdict.ok and not verdict.problems, verdict.line
    assert verdict.line.startswith("gradacc audit (trainer, Qwen2ForCausalLM): varies with the micro-batch by "
                                   "design — ")
    assert f"the step is {versus['scale']:.4g}× (residual {versus['residual']:.2g})" in verdict.meaning
    assert "Not a bug" in verdict.meaning and verdict.fix is None


def test_dapo_two_windows_per_generation_is_scaled_by_the_generation_and_the_named_fix_makes_it_exact():
    """steps_per_generation = 2k: one generation feeds two steps, the second off-policy (its ratios ≠ 1). The
    first step's scale is the window's tokens ÷ (the generation's × k/spg), by hand; the second (the truth's) is
    the rest of the generation's tokens, as the verdict says."""
    verdict, truth, seen = audited("dapo", k=2, steps_per_generation=4, steps=2, max_grad_norm=0.0)
    first, second = truth
    window_tokens = sum(int(inputs["completion_mask"].sum()) for inputs in seen[:2])
    generation_tokens = int(seen[0]["num_items_in_batch"])
    by_hand = window_tokens / (generation_tokens * 2 / 4)
    assert by_hand != pytest.approx(1, abs=1e-3), "the generation's tokens fell evenly: nothing to tell apart"
    assert first["scale"] == pytest.approx(by_hand, rel=1e-5) and second["scale"] == pytest.approx(2 - by_hand,
                                                                                                    rel=1e-5)
    assert verdict.gradient == V.GENERATION_COUNT and not verdict.ok, verdict.line
    assert verdict.fit.scale == pytest.approx(first["scale"], rel=1e-5) and verdict.fit.residual < 1e-4
    assert f"the step is {by_hand:.4g}×" in verdict.meaning
    assert f"the generation's other window then gets {2 - by_hand:.4g}×" in verdict.meaning
    assert verdict.fix == "GRPOConfig(steps_per_generation=2) (= gradient_accumulation_steps)"

    fixed, truth, _ = audited("dapo", k=2, steps_per_generation=2, max_grad_norm=0.0)
    assert truth[0]["verdict"] == "exact"
    assert fixed.gradient == V.EXACT and fixed.ok, fixed.line
    assert "dapo is accumulation-invariant only while steps_per_generation = gradient_accumulation_steps" in \
        fixed.meaning


def test_in_bf16_the_audit_judges_within_bf16s_noise():
    """bf16=True (autocast on the CPU): the replay runs under the micro-batch's own autocast; dapo at spg = 2k is
    still named, at the count ratio within bf16's rounding, as the float64 truth measures it."""
    verdict, truth, seen = audited("dapo", k=2, steps_per_generation=4, bf16=True, max_grad_norm=0.0)
    by_hand = sum(int(inputs["completion_mask"].sum()) for inputs in seen[:2]) / (int(seen[0]["num_items_in_batch"])
                                                                                / 2)
    assert verdict.precision == "bf16" and verdict.gradient == V.GENERATION_COUNT, verdict.line
    assert verdict.fit.scale == pytest.approx(by_hand, abs=2e-3) and truth[0]["scale"] == pytest.approx(by_hand,
                                                                                                         abs=2e-3)
    assert verdict.fit.residual < 1e-2 and truth[0]["residual"] < 1e-2


def test_dapo_with_a_generation_per_micro_batch_weights_each_by_its_own_count():
    """steps_per_generation < k: each micro-batch is its own generation, divided by its own tokens × k: no scale of
    the window's objective (the truth's residual), and the audit names the generation count."""
    verdict, truth, seen = audited("dapo", k=2, steps_per_generation=1, max_grad_norm=0.0)
    counts = [int(inputs["num_items_in_batch"]) for inputs in seen]
    assert counts == [int(inputs["completion_mask"].sum()) for inputs in seen] and counts[0] != counts[1]
    assert truth[0]["verdict"] == "differs"
    assert verdict.gradient == V.GENERATION_COUNT and not verdict.ok, verdict.line
    assert verdict.fit.residual == pytest.approx(truth[0]["residual"], rel=1e-3)
    assert "each micro-batch's tokens are weighted by its own generation batch's count" in verdict.meaning
    assert f"each generation batch's own token count ({counts[0]}, {counts[1]})" in verdict.meaning


def test_grpo_with_a_kl_term_off_policy_is_exact():
    """β > 0 (the KL to a saved reference, × the importance ratio by default) at steps_per_generation = 2k: the
    stored old and reference log-probs are in the audit's objective."""
    verdict, truth, seen = audited("grpo", k=1, steps_per_generation=2, beta=0.04, max_grad_norm=0.0)
    assert "ref_per_token_logps" in seen[0] and "old_per_token_logps" in seen[0]
    assert truth[0]["verdict"] == "exact"
    assert verdict.gradient == V.EXACT and verdict.ok, verdict.line


def test_settings_outside_the_documented_objectives_are_not_judged_with_the_reason():
    verdict, _, _ = audited("grpo", k=1, num_iterations=2)
    assert not verdict.judged and not verdict.ok
    assert verdict.line.startswith("gradacc audit (trainer, Qwen2ForCausalLM): not judged — GRPOTrainer, "
                                   "num_iterations=2: each generation is trained on more than once")
    # An MoE model's router loss is no longer one of them: it is judged (below); a setting beside it still is not.
    verdict, _ = audited_moe(num_iterations=2)
    assert not verdict.judged and "num_iterations=2: each generation is trained on more than once" in verdict.meaning
    assert "router" not in verdict.meaning, verdict.line


def test_a_window_whose_rewards_all_tie_is_not_judged(monkeypatch):
    """Every advantage 0: the objective has no gradient to compare with, and the verdict says why."""
    monkeypatch.setattr(script, "reward_len", lambda completions, **kwargs: [1.0] * len(completions))
    verdict, truth, _ = audited("grpo", max_grad_norm=0.0)
    assert truth[0]["verdict"] == "no signal"
    assert not verdict.judged and "every advantage 0" in verdict.meaning, verdict.line


def test_the_audited_run_is_bit_identical_to_the_run_without_it():
    """The audit's replays restore every random state and write no gradient: two steps of one generation (the second
    off-policy) end on the same weights, bit for bit."""
    from transformers import PrinterCallback

    def weights(audit: bool) -> torch.Tensor:
        trainer = script.trainer("dapo", 2, 4, steps=2, max_grad_norm=0.0)
        trainer.remove_callback(PrinterCallback)
        if audit:
            audit_trainer(trainer)
        trainer.train()
        return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])

    assert torch.equal(weights(True), weights(False))


# ---- an MoE model whose router loss TRL adds -------------------------------------------------------------------

COEFFICIENT = 0.02  # the tiny Mixtral's router_aux_loss_coef: GRPOTrainer reads it from the config
MIXTRAL_DEFAULT = 0.001  # Mixtral's own: its router term is under float32's noise of the whole gradient


def tiny_mixtral(coefficient=COEFFICIENT):
    """The tests' tiny Mixtral (2 layers, 4 experts, top 2, output_router_logits=True), its LM head given the
    script's EOS bias so completions end at uneven lengths."""
    from transformers import MixtralForCausalLM

    model = MixtralForCausalLM(mixtral(coefficient))
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[model.config.eos_token_id] = 2.5
    model.lm_head = head
    return model


WholeRouterTerm = whole_router_term(script.GRPOTrainer)  # TRL before its ÷ k of the router term


class HandTruth:
    """The truth of dapo's window objective at steps_per_generation = k plus coef × the micro-batches' mean router
    loss, by hand: before the step, a float64 copy of the weights replays each recorded micro-batch's forward (no
    dropout: Mixtral's defaults) and autograd differentiates

        −Σ_window A · log π(token) · mask ÷ the window's tokens  +  coef · mean_i router_loss_by_hand(micro-batch i)

    (on-policy, one iteration: the ratio π/π_old is 1 with π_old = π detached, so the clip is off and dapo's
    gradient is that of the plain sum; its normaliser is the generation's tokens, the window's at spg = k)."""

    def __init__(self, trainer, coefficient):
        self.trainer, self.coefficient, self.recorded = trainer, coefficient, []
        compute = trainer._compute_loss

        def recording(model, inputs):
            self.recorded.append({key: value.detach().clone() for key, value in inputs.items()
                                  if torch.is_tensor(value)})
            return compute(model, inputs)

        trainer._compute_loss = recording

    def gradients(self, model) -> dict:
        """{"applied", "truth", "policy_alone"}: {name: float64 flat}; the step's, the truth's, and the truth's
        without its router term."""
        with torch.random.fork_rng():  # its initialisation draws nothing from the run's random state
            copied = tiny_mixtral(self.coefficient).double()  # built anew: the run's model is wrapped for activation checkpointing
        copied.load_state_dict(model.state_dict())
        copied.set_experts_implementation("eager")  # torch's grouped matmul takes no float64
        params = {name: p for name, p in copied.named_parameters() if p.requires_grad}
        window_tokens = sum(float(inputs["completion_mask"].sum()) for inputs in self.recorded)
        policy, routers = 0.0, []
        for inputs in self.recorded:
            assert "old_per_token_logps" not in inputs  # on-policy: the ratio is 1
            prompt, completion = inputs["prompt_ids"], inputs["completion_ids"]
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            output = copied(input_ids=torch.cat([prompt, completion], dim=1), attention_mask=mask,
                            output_router_logits=True)
            logits = output.logits[:, prompt.shape[1] - 1:-1]  # the logits that predict each completion token
            logps = torch.log_softmax(logits, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
            advantages = inputs["advantages"].double()
            policy = policy - (advantages[:, None] * logps * inputs["completion_mask"]).sum() / window_tokens
            routers.append(router_loss_by_hand(output.router_logits, copied.config.num_experts_per_tok, mask))
        router_term = self.coefficient * sum(routers) / len(routers)

        def flat(objective):
            grads = torch.autograd.grad(objective, list(params.values()), retain_graph=True, allow_unused=True)
            return {name: (g if g is not None else torch.zeros_like(p)).detach().reshape(-1)
                    for (name, p), g in zip(params.items(), grads)}

        applied = {name: p.grad.detach().double().reshape(-1) for name, p in model.named_parameters()
                   if p.requires_grad}
        return {"applied": applied, "truth": flat(policy + router_term), "policy_alone": flat(policy)}


def against(applied: dict, truth: dict, names) -> dict:
    """g against t over ``names``: scale g·t / t·t and residual ‖g − s·t‖ / ‖t‖."""
    g = torch.cat([applied[name] for name in sorted(names)])
    t = torch.cat([truth[name] for name in sorted(names)])
    scale = float(g @ t / (t @ t))
    return {"scale": scale, "residual": float((g - scale * t).norm() / t.norm())}


def audited_moe(trainer_class=None, coefficient=COEFFICIENT, **extra):
    """The user's GRPO script on the tiny Mixtral (dapo, k = 2 = steps_per_generation, no clipping) with the audit,
    and the truth by hand from the step's recorded micro-batches: (verdict, {the step against the truth on every
    weight and on the router weights, and against the truth without its router term on the router weights})."""
    from transformers import PrinterCallback, TrainerCallback

    trainer = script.trainer("dapo", 2, 2, build=lambda: tiny_mixtral(coefficient),
                             trainer_class=trainer_class or script.GRPOTrainer, max_grad_norm=0.0, **extra)
    trainer.remove_callback(PrinterCallback)
    truth = HandTruth(trainer, coefficient)
    measured = {}

    class Before(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if not measured and trainer.aux_loss_enabled and args.num_iterations == 1:
                grads = truth.gradients(trainer.model)
                everything = list(grads["truth"])
                routers = [name for name in everything if name.endswith(".mlp.gate.weight")]  # Mixtral's routers
                measured.update(all=against(grads["applied"], grads["truth"], everything),
                                routers=against(grads["applied"], grads["truth"], routers),
                                routers_vs_policy_alone=against(grads["applied"], grads["policy_alone"], routers),
                                micro_batches=len(truth.recorded),
                                lengths=[inputs["completion_mask"].sum(1).tolist() for inputs in truth.recorded])

    trainer.add_callback(Before())
    audit = audit_trainer(trainer)
    trainer.train()
    return audit.verdict, measured


def test_grpo_on_an_moe_model_with_trls_router_term_is_exact_against_the_truth_by_hand():
    """TRL adds coef · aux_loss ÷ k to each micro-batch's dapo loss: the step is dapo's window objective plus coef ×
    the micro-batches' mean router loss, by hand (scale 1, residual at float32's noise, on every weight and on the
    router weights, where the router term is a large share: without it the truth is far off there), and the audit
    says exact, the router term in it."""
    verdict, truth = audited_moe()
    assert truth["micro_batches"] == 2 and len({n for lengths in truth["lengths"] for n in lengths}) > 1
    for where in ("all", "routers"):
        assert truth[where]["scale"] == pytest.approx(1, abs=1e-5) and truth[where]["residual"] < 1e-5, truth
    assert truth["routers_vs_policy_alone"]["residual"] > 1e-2, truth  # the router term is in the step: it is seen
    assert verdict.kind == LossKind.GRPO and verdict.gradient == V.EXACT and verdict.ok, verdict.line
    assert verdict.fit.scale == pytest.approx(truth["all"]["scale"], abs=1e-5) and verdict.fit.residual < 1e-5
    assert verdict.router is not None and verdict.router.cause == V.EXACT
    assert verdict.router.coefficient == COEFFICIENT
    assert verdict.router.fit.scale == pytest.approx(truth["routers"]["scale"], abs=1e-5)
    assert "its router term coef·(the micro-batches' mean router loss) is in it, on the router weights (scale 1," \
        in verdict.meaning
    assert "plus coef × the micro-batches' mean router loss" in verdict.reference
    assert verdict.check(CheckName.ROUTER_LOSS).ok


@pytest.mark.parametrize("coefficient", [COEFFICIENT, MIXTRAL_DEFAULT])
def test_grpo_whose_router_term_is_added_whole_is_named_k_times_on_the_router_weights(coefficient):
    """Each micro-batch adds coef · aux_loss whole (TRL before its ÷ k): the truth by hand sees the step off on the
    router weights; the audit keeps dapo's objective exact (main objective 1×) and names the router term 2× (k = 2)
    on the router weights, not exact. At Mixtral's coefficient the whole gradient alone cannot tell (its residual
    against the truth is under float32's noise ceiling): the router weights do."""
    verdict, truth = audited_moe(trainer_class=WholeRouterTerm, coefficient=coefficient)
    assert truth["routers"]["residual"] > 1e-2, truth  # the step is not the truth there
    if coefficient == MIXTRAL_DEFAULT:
        assert truth["all"]["residual"] < NOISE["fp32"], truth
    assert not verdict.ok and verdict.gradient == Cause.ROUTER_K_TIMES, verdict.line
    assert verdict.router.fit.scale == pytest.approx(2, abs=1e-4) and verdict.router.fit.residual < 1e-4
    assert verdict.router.main_scale == pytest.approx(1, abs=1e-5)
    assert verdict.fit.scale == pytest.approx(1, abs=1e-5) and verdict.fit.residual < 1e-4  # dapo's part: exact
    assert verdict.meaning.startswith("2× coef·(the micro-batches' mean router loss) (k = 2): each micro-batch's "
                                      "router_aux_loss_coef · aux_loss is added whole")
    assert "router_aux_loss_coef * aux_loss / gradient_accumulation_steps" in verdict.fix
    assert "replayed again without the router loss" in verdict.replay


def test_an_moe_model_whose_aux_loss_is_not_the_load_balancing_loss_is_not_judged():
    """The audit computes the router loss itself and checks it against the model's aux_loss (what TRL adds): a model
    whose aux_loss is another (here 1.5× the load-balancing loss) is not judged, with the two values said."""
    def another_aux_loss(module, args, output):
        if output.aux_loss is not None:
            output.aux_loss = output.aux_loss * 1.5
        return output

    def build():
        model = tiny_mixtral()
        model.register_forward_hook(another_aux_loss)
        return model

    from transformers import PrinterCallback

    trainer = script.trainer("dapo", 2, 2, build=build, max_grad_norm=0.0)
    trainer.remove_callback(PrinterCallback)
    audit = audit_trainer(trainer)
    trainer.train()
    verdict = audit.verdict
    assert not verdict.judged, verdict.line
    assert "the model's router loss (aux_loss " in verdict.meaning
    assert "is not the load-balancing loss the audit computes from its router logits" in verdict.meaning
