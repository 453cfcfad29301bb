"""The demos a speaker runs with one click: every scenario, as data (the Demos page draws whatever is here).

How to add a scenario: append a ``Scenario`` to ``SCENARIOS``. Give it

- ``name``: short and URL-safe; ``?demo=NAME`` on the Demos page opens it, so it is a public link;
- ``title`` and ``explanation`` (Markdown, a few sentences a speaker can read out: what to look at);
- ``base``: the RunConfig fields every run of the scenario shares (unset fields take the model's recipe);
- ``runs``: one ``DemoRun(label, changes)`` per run, the RunConfig fields that run changes on top of ``base``;
  they are queued in this order;
- ``compares``: which two runs the headline describes, ``(a, b)`` indices into ``runs`` (b is described
  against a: "activations 4× smaller" means b's are); ``controls``: further pairs said on the line under the
  headline ("exact against the full batch: identical"); ``expect``: one sentence of what the headline shows;
- ``chart``: the figure that shows the page's claim, drawn first (``STORY_CHARTS``): "gradient-scale" (what
  each window's gradient was scaled by), "loss-difference" (each run's loss against the first run's), "sharding"
  (what each rank of a sharded run held and sent); None: the loss curves say it;
- ``checks``: gradient checks run beside the runs and shown under them (``gradacc.serving.checks.CHECK_SETS``);
- sizes (``train_samples``, ``eval_samples``, ``epochs``) for a speaker's pace: the whole scenario should take
  about 20–90 s on a 2-vCPU machine at load ≤ 2 (measure it with ``python -m gradacc.analysis.demos NAME``, and
  put the figure in docs/demos.md's table); ``min_steps``: the whole windows per epoch its story needs to show,
  which a shrunken run keeps (2 unless said).

``tests/analysis/test_demos.py`` checks every scenario builds valid configs; the tests shrink them with
``GRADACC_DEMO_SCALE`` (a fraction of the training samples, and of epochs past two; 1 on stage), so the same
data serves both. A much faster machine than 2 vCPUs finishes a demo before a speaker has said it: raise
``train_samples`` (or ``epochs``) of the scenario by the ratio of the machine's speed, measured with the command
above.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from gradacc import env as env_numbers
from gradacc.choices import PITFALLS
from gradacc.config import RunConfig

SCALE_ENV = "GRADACC_DEMO_SCALE"
# Label prefix of a demo's runs in the store (the Compare page shows them like any other run).
LABEL_PREFIX = "demo"


@dataclass(frozen=True)
class DemoRun:
    label: str
    changes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    explanation: str
    base: dict
    runs: tuple[DemoRun, ...]
    expect: str
    compares: tuple[int, int] = (0, 1)
    controls: tuple[tuple[int, int], ...] = ()
    chart: str | None = None
    # Gradient checks shown under the runs (``gradacc.serving.checks.CHECK_SETS``): "in-batch-negatives", "norms".
    checks: str | None = None
    # Whole windows (optimizer steps) per epoch the story needs to show: a shrunken run (GRADACC_DEMO_SCALE) keeps them.
    min_steps: int = 2

    def configs(self, scale: float | None = None) -> list[tuple[str, RunConfig]]:
        """(label, checked config) per run, sized by ``scale`` (default: GRADACC_DEMO_SCALE or 1)."""
        scale = demo_scale() if scale is None else scale
        built = [(run.label, RunConfig.from_dict({**self.base, **run.changes})) for run in self.runs]
        largest = max(config.effective_batch for _, config in built)
        return [(label, sized(config, largest, scale, self.min_steps).check()) for label, config in built]

    def run_label(self, run_label: str) -> str:
        return f"{LABEL_PREFIX} {self.name}: {run_label}"


def sized(config: RunConfig, effective_batch: int, scale: float, min_steps: int = 2) -> RunConfig:
    """``config`` with its data (and a long story's epochs) scaled by ``scale``, in whole windows of
    ``effective_batch``, at least ``min_steps`` of them."""
    changes = {"train_samples": scaled(config.train_samples, effective_batch, scale, min_steps)}
    if config.eval_samples:
        changes["eval_samples"] = max(16, math.ceil(config.eval_samples * scale))
    if config.epochs > 2:  # a story told over many epochs keeps two (each ends in its own short window)
        changes["epochs"] = max(2, math.ceil(config.epochs * scale))
    return config.replace(**changes)


# The figures a scenario's ``chart`` may name (drawn by gradacc.app.charts.demos).
STORY_CHARTS = ("gradient-scale", "loss-difference", "sharding")


def scaled(train_samples: int, effective_batch: int, scale: float, min_steps: int = 2) -> int:
    """``train_samples`` × ``scale`` in whole windows of the largest effective batch, keeping the remainder
    (a scenario's short last window survives the shrinking), and never less than ``min_steps`` windows (nor more
    than it had)."""
    if scale == 1:
        return train_samples
    windows, remainder = divmod(train_samples, effective_batch)
    return min(windows, max(min_steps, round(windows * scale))) * effective_batch + remainder


def demo_scale() -> float:
    """GRADACC_DEMO_SCALE: a fraction of the training samples (tests use a small one); 1 when unset."""
    value = env_numbers.number(os.environ, SCALE_ENV, 1.0)
    return min(value, 1.0) if value > 0 else 1.0


SAME_CURVE = Scenario(
    name="same-curve",
    title="Same curve, a quarter of the activations",
    explanation=(
        "all-MiniLM-L6-v2, a real pretrained model (22M parameters), fine-tuned twice on the same examples, 32 "
        "per optimizer step. The first run puts all 32 through the model at once (m=32, k=1); the second puts 8 "
        "at a time through and adds up the gradients of 4 micro-batches before stepping (m=8, k=4). Dropout is "
        "off, so nothing random differs.\n\n"
        "**Look at:** the two loss curves lie on top of each other, and the second run holds about a quarter of "
        "the activation memory. Its time per step is in the table, not in the result: two runs made one after the "
        "other on a shared machine do not measure a time difference (`python -m gradacc bench sweep` does, "
        "paired)."),
    # A pretrained model at its recipe's gentle learning rate: the curves agree to ~1e-6 at every step. tiny-bert
    # from scratch at its lr 5e-3 has loss spikes (gradient norms past 30) that amplify the 1e-7 of float
    # summation order to 2e-3 by step 63: a true "match", not "identical".
    base={"model": "all-MiniLM-L6-v2", "backend": "pytorch", "dropout": 0.0, "epochs": 1, "train_samples": 512,
          "eval_samples": 200},
    runs=(DemoRun("m=32, k=1", {"micro_batch_size": 32, "grad_accum_steps": 1}),
          DemoRun("m=8, k=4", {"micro_batch_size": 8, "grad_accum_steps": 4})),
    expect="Loss curves identical · activations about 4× smaller · the same F1.",
)

NAIVE_VS_EXACT = Scenario(
    name="naive-vs-exact",
    title="Naive ÷k against exact normalisation",
    explanation=(
        "The same accumulation run (m=8, k=4) twice: once with the textbook recipe (each micro-batch's mean "
        "loss ÷ k, Accelerate's default) and once weighting each micro-batch by its share of the window's "
        "examples. The training set is 8 examples past a whole number of windows, so every epoch ends with a "
        "window of a single micro-batch: naive divides it by 4 anyway, and that step applies a quarter of the "
        "window's gradient. The loss is per example here, so the short window is the only place the two differ "
        "(a token-level loss differs in every window: see the language-model demo).\n\n"
        "**Look at:** the first chart, each step's gradient against its window's own: exact applies every window "
        "whole (1×); naive applies the last window of each epoch at 0.25×: 6 epochs, 6 dips. The loss curves "
        "are the same up to the first short window (step 73); from there the weights differ, and every later "
        "loss a little (the result says by how much)."),
    # 2,312 examples (72 windows of 32, then one micro-batch of 8) for 6 epochs: 438 steps, the headline within 90 s
    # of the click on a 2-vCPU machine (732 steps took 104-119 s there). tiny-bert's recipe rate
    # (5e-3) collapses to chance over that many (both runs ended below the majority's F1), and 24 epochs of 968
    # examples memorise them (a loss spike warned in each run): at 1e-4 on more data both learn steadily.
    base={"backend": "pytorch", "dropout": 0.0, "epochs": 6, "train_samples": 2312, "eval_samples": 200,
          "micro_batch_size": 8, "grad_accum_steps": 4, "learning_rate": 1e-4},
    runs=(DemoRun("exact", {"loss_normalization": "exact"}),
          DemoRun("naive ÷k", {"loss_normalization": "naive"})),
    chart="gradient-scale",
    expect="Naive ÷k applies the short last window of each epoch at 0.25× its gradient; the loss curves part there.",
)

TRAINER_PITFALL = Scenario(
    name="trainer-pitfall",
    title="Trainer's default on BERT: k× the loss and the gradient",
    explanation=(
        "🤗 Trainer with gradient_accumulation_steps=4 on all-MiniLM-L6-v2, a pretrained BERT, twice. In "
        "transformers 5 Trainer sees "
        "that BERT's forward takes **kwargs, assumes the model divides the loss by the items in the window, "
        "and skips its own ÷k: the loss it reports and the gradients it steps with are 4× too large. gradacc "
        "passes a compute_loss_func that really uses num_items_in_batch.\n\n"
        "**Look at:** the library default's loss curve sits 4× above the fixed one. AdamW hides most of a "
        "constant gradient scale, and gradient clipping hides the rest, which is why this goes unnoticed."),
    # all-MiniLM-L6-v2, a real BERT (22M parameters), at its pretrained recipe: few steps, each real work, and the
    # two runs stay close enough that their losses keep the k× ratio (tiny-bert over 150 steps drifts to 4.9×).
    base={"model": "all-MiniLM-L6-v2", "backend": "trainer", "dropout": 0.0, "epochs": 1, "train_samples": 384,
          "eval_samples": 200,
          "micro_batch_size": 8, "grad_accum_steps": 4},
    runs=(DemoRun("Trainer library default", {"trainer_library_default": True}),
          DemoRun("gradacc's fix", {"trainer_library_default": False})),
    expect="Loss 4× smaller with the fix, at the same samples seen: Trainer's default did not divide by k=4.",
)

NAIVE_VS_EXACT_LM = Scenario(
    name="naive-vs-exact-lm",
    title="The October 2024 bug: naive ÷k on a language model",
    explanation=(
        "tiny-gpt, a small GPT-2-style language model, learns builtin-text: reviews from two words to a dozen "
        "sentences long. Three runs see the same 32 texts per optimizer step from the same start: the full batch "
        "(m=32, k=1), then m=2, k=16 twice. The loss is the mean over *predicted tokens*, and micro-batches of "
        "uneven texts predict very different numbers of them. **Naive** divides each micro-batch's mean by k, "
        "so a micro-batch of two short texts counts as much as one of two long ones: not the full-batch "
        "gradient, in every window. **Exact** weights each micro-batch by its share of the window's predicted "
        "tokens (what transformers' num_items_in_batch fix does).\n\n"
        "**Look at:** the first chart, each m=2, k=16 run's loss against the full batch's at the same step: "
        "naive's drifts away from it; exact's stays at 0."),
    # m=2, k=16 and texts up to 128 tokens: micro-batches of two texts differ most in their token counts, so
    # naive's weighting is furthest from the full batch's and its drift shows on the chart. The drift grows step by
    # step: 0.26 % at most after 10 steps (too little to see), past 0.5 % by 25, so a shrunken demo keeps 25.
    base={"backend": "pytorch", "model": "tiny-gpt", "dataset": "builtin-text", "task": "causal-lm",
          "dropout": 0.0, "epochs": 1, "train_samples": 3200, "eval_samples": 100, "max_seq_length": 128},
    runs=(DemoRun("full batch m=32, k=1", {"micro_batch_size": 32, "grad_accum_steps": 1}),
          DemoRun("naive ÷k m=2, k=16", {"micro_batch_size": 2, "grad_accum_steps": 16,
                                         "loss_normalization": "naive"}),
          DemoRun("exact m=2, k=16", {"micro_batch_size": 2, "grad_accum_steps": 16, "loss_normalization": "exact"})),
    compares=(0, 1),
    controls=((0, 2),),
    chart="loss-difference",
    expect="Naive's loss drifts from the full batch's; exact's stays on it (float rounding).",
    min_steps=25,
)

MEMORY_WALL = Scenario(
    name="memory-wall",
    title="The memory wall: out of memory, then fit with accumulation",
    explanation=(
        "all-MiniLM-L6-v2 (22M parameters, its pretrained recipe) under a 450 MB memory budget. Its parameters, "
        "gradients and AdamW state alone take 363 MB, and every example of a micro-batch adds about 3 MB of "
        "activations, so a micro-batch of 64 needs well over 450 MB: the first run measures that before its "
        "first step and stops with out of memory, as a GPU would (its reason gives the measured figures). **Fit "
        "with accumulation** (the button a failed run offers on the Train page) takes the largest power-of-two "
        "micro-batch that fits, m=16, and k=4 to keep the effective batch at 64. The third run is m=64 without a "
        "budget: what a bigger device would do.\n\n"
        "**Look at:** the first run's reason (the figures, and the way out), then the fitted run's loss curve "
        "on top of the unbudgeted one at a quarter of the activations."),
    # 960 examples: 15 optimizer steps of 64 per trained run, each real work on a 22M-parameter model (20 took 92 s to
    # the headline on a 2-vCPU machine; a speaker's demo has it within 90 s).
    base={"model": "all-MiniLM-L6-v2", "backend": "pytorch", "dropout": 0.0, "epochs": 1, "train_samples": 960,
          "eval_samples": 200},
    runs=(DemoRun("m=64, k=1 in 450 MB", {"micro_batch_size": 64, "grad_accum_steps": 1, "memory_budget_mb": 450}),
          DemoRun("fit: m=16, k=4 in 450 MB", {"micro_batch_size": 16, "grad_accum_steps": 4,
                                               "memory_budget_mb": 450}),
          DemoRun("m=64, k=1, no budget", {"micro_batch_size": 64, "grad_accum_steps": 1})),
    expect="The first run fails out of memory; the fitted run trains the same effective batch: loss curves "
           "identical to the unbudgeted run, activations about 4× smaller.",
    compares=(2, 1),
)


def pitfall_scenario(pitfall: str, name: str, title: str, explanation: str, expect: str, min_steps: int = 2,
                     **base) -> Scenario:
    """The right plain loop, then the same run with one deliberately wrong line (``pitfalls``); the broken run's
    warnings say what the line broke, measured against the right loop in that same run."""
    report = PITFALLS[pitfall]
    return Scenario(
        # The upstream report ("accelerate #963") where there is one. zero_grad's entry has none, only the mistake's
        # name, which its title already says: "... inside the accumulation window (zero_grad inside the window)".
        name=name, title=f"{title} ({report})" if "#" in report else title,
        explanation=explanation + f"\n\nThe Code page shows the wrong line in red beside the right one (pick "
                                  f"**{pitfall}** under *Break it on purpose*).",
        # tiny-bert over 20,800 examples (325 steps): enough for a speaker to talk over, the headline within 90 s of
        # the click on a 2-vCPU machine (500 steps took 107 s there). Its recipe's learning rate
        # (5e-3) collapses to chance over this many steps; at 3e-4 the right loop learns steadily, so what the
        # wrong line costs is the only difference on the chart.
        base={"backend": "pytorch", "dropout": 0.0, "epochs": 1, "train_samples": 20800, "eval_samples": 200,
              "micro_batch_size": 16, "grad_accum_steps": 4, "learning_rate": 3e-4, **base},
        runs=(DemoRun("right loop", {"pitfalls": []}), DemoRun(f"broken: {pitfall}", {"pitfalls": [pitfall]})),
        expect=expect, min_steps=min_steps)


PITFALL_SCHEDULER = pitfall_scenario(
    "scheduler-per-micro-batch", "pitfall-scheduler", "The LR scheduler stepped every micro-batch",
    "The same run (tiny-bert, m=16, k=4, 325 optimizer steps) twice. The broken loop calls `lr_scheduler.step()` "
    "after every micro-batch instead of once per optimizer step, as in the Accelerate report: the schedule planned "
    "for 325 steps runs 4× too fast.\n\n**Look at:** the broken run's warning: the step where its learning rate "
    "reached 0, measured against the planned schedule; after it the model stops learning.",
    "The broken run's learning rate reaches 0 about a quarter of the way through; the right run's follows the plan.")
PITFALL_CLIP = pitfall_scenario(
    "clip-per-micro-batch", "pitfall-clip", "Gradient clipping every micro-batch",
    "The same run twice, with a tight max gradient norm (0.1, so clipping engages on tiny-bert's small gradients). "
    "The broken loop clips after every backward(), so each partial sum of the window is clipped, not the "
    "window's gradient once.\n\n**Look at:** the broken run's warning: the gradient each step used against the "
    "right one (the window's gradient clipped once), in norm and in direction.",
    "The broken run steps with a gradient that points away from the right one.", max_grad_norm=0.1,
    # tiny-bert's partial gradients stay under 0.1 until it starts learning: after 100 steps clipping had never
    # engaged ("no effect in this run"), after 125 it had, in every micro-batch.
    min_steps=125)
PITFALL_ZERO_GRAD = pitfall_scenario(
    "zero-grad-per-micro-batch", "pitfall-zero-grad", "zero_grad() inside the accumulation window",
    "The same run twice. The broken loop calls `optimizer.zero_grad()` before every micro-batch, the habit of a "
    "loop without accumulation: every window's gradients are wiped but the last micro-batch's, so accumulation is "
    "silently off and each step sees 16 examples, not 64 (and divided by 4).\n\n**Look at:** the warning's "
    "examples per step, and the broken run's noisier loss curve.",
    "Each broken step uses 16 examples, not 64.")
PITFALL_LOG_LOSS = pitfall_scenario(
    "log-undivided-loss", "pitfall-log-loss", "The logged loss not divided by k",
    "The same run twice. The broken loop logs each micro-batch's loss before it is scaled, so a window of 4 logs "
    "4× its loss; the training itself is the same.\n\n**Look at:** the loss curves 4× apart while the eval "
    "scores are equal.",
    "Loss curves 4× apart, the same F1: only the logging is wrong.")
PITFALL_DROP_LAST = pitfall_scenario(
    "drop-last-window", "pitfall-drop-last", "The epoch's short last window dropped",
    "12,056 examples with m=8, k=8: 188 full windows of 64 and a short last one of 24. The broken loop steps only "
    "when `(index + 1) % k == 0`, so the short window's gradients are computed and never stepped.\n\n**Look at:** "
    "the loss curves agree up to the step that never happens (the loss curve does not show this bug); the "
    "warning counts the examples that never trained.",
    "The broken run trains 24 examples fewer, in one optimizer step fewer.",
    train_samples=12056, micro_batch_size=8, grad_accum_steps=8)

# In-batch negatives: 384 pairs, 6 optimizer steps of 64 on a 22M-parameter model per run.
PAIRS = {"task": "contrastive", "model": "all-MiniLM-L6-v2", "dataset": "builtin-pairs", "train_samples": 384,
         "eval_samples": 200, "max_seq_length": 32, "learning_rate": 5e-5}

IN_BATCH_NEGATIVES = Scenario(
    name="in-batch-negatives",
    title="In-batch negatives: accumulation is not the big batch",
    explanation=(
        "all-MiniLM-L6-v2 learns (query, positive) pairs with MultipleNegativesRankingLoss: each query is scored "
        "against every positive of its batch, the others being its negatives. One batch of 64 gives each query 63 "
        "negatives; 16 accumulated 4 times give 15: a different loss, so a different gradient, whatever the "
        "normalisation. GradCache (CachedMultipleNegativesRankingLoss) computes the batch-64 loss with the "
        "activations of 16.\n\n"
        "**Look at:** the accumulated run's loss curve apart from the batch's, GradCache's on it; the gradient "
        "table under the runs (accumulation far off, GradCache at rounding) and the activations each way holds."),
    base={"backend": "pytorch", "dropout": 0.0, "epochs": 1, **PAIRS},
    runs=(DemoRun("MNRL batch 64", {"micro_batch_size": 64, "grad_accum_steps": 1}),
          DemoRun("MNRL m=16, k=4", {"micro_batch_size": 16, "grad_accum_steps": 4}),
          DemoRun("GradCache batch 64, mini-batch 16", {"micro_batch_size": 64, "grad_accum_steps": 1,
                                                        "gradcache_mini_batch": 16})),
    compares=(0, 1),
    controls=((0, 2),),
    expect="Accumulated in-batch negatives: a different loss curve; GradCache's is the batch's.",
    checks="in-batch-negatives",
)

# bow models over 10,240 examples for 3 epochs (their recipe's): 960 optimizer steps of 32 per run, a few seconds
# each (under the 1,000 points a chart draws per line, so the replay page sends each point once). LayerNorm, the
# control, runs first: the result (BatchNorm's pair) is written once all four have run, 20-30 s in.
BAGS = {"train_samples": 10240, "eval_samples": 200, "epochs": 3}

BATCH_NORM = Scenario(
    name="batchnorm",
    title="BatchNorm: a micro-batch is not the batch",
    explanation=(
        "A bag-of-embeddings classifier learns the same examples two ways, 32 per optimizer step: m=32, k=1, then "
        "m=4, k=8. First, as the control, with LayerNorm, which normalises each example alone: accumulation gives "
        "the batch's gradient. Then with BatchNorm, which normalises each micro-batch with its own mean and "
        "variance: 8 micro-batches of 4 are not one batch of 32, whatever the loss normalisation.\n\n"
        "**Look at:** the first chart, each m=4, k=8 run's loss against its m=32 run's at the same step: "
        "LayerNorm's at 0 (until float rounding, once the loss is near its floor, moves a few late steps apart), "
        "BatchNorm's apart from the start; the gradient table under the runs (BatchNorm off, the more the smaller m; "
        "LayerNorm exact)."),
    base={"backend": "pytorch", "dropout": 0.0, **BAGS},
    runs=(DemoRun("LayerNorm m=32, k=1", {"model": "bow-layernorm", "micro_batch_size": 32, "grad_accum_steps": 1}),
          DemoRun("LayerNorm m=4, k=8", {"model": "bow-layernorm", "micro_batch_size": 4, "grad_accum_steps": 8}),
          DemoRun("BatchNorm m=32, k=1", {"model": "bow-batchnorm", "micro_batch_size": 32, "grad_accum_steps": 1}),
          DemoRun("BatchNorm m=4, k=8", {"model": "bow-batchnorm", "micro_batch_size": 4, "grad_accum_steps": 8})),
    compares=(2, 3),
    controls=((0, 1),),
    chart="loss-difference",
    expect="LayerNorm's curves the same at the same effective batch (1e-07 at the median step); BatchNorm's apart.",
    checks="norms",
)

FSDP_SYNC = Scenario(
    name="fsdp-sync",
    title="Sharded (FSDP) on 2 processes: sync per window or per micro-batch",
    # tiny-bert: 2 processes on 2 shared cores; all-MiniLM-L6-v2's 22M parameters took 102 and 169 s (load 3.1).
    # 4 epochs: 40 optimizer steps, enough to learn (1 epoch's 10 ended on one label for every example, warned).
    explanation=(
        "tiny-bert (192k parameters) sharded over 2 processes with FSDP: each keeps half of the parameters, "
        "gradients and AdamW state. The same window (m=8, k=4 on each process) twice. **Per-window** sync "
        "reduce-scatters the gradients once, at the window's last micro-batch: until then every process adds up the "
        "whole model's gradients, unsharded (what torchtitan and Accelerate's sync_each_batch avoid when memory is "
        "tight). **Per-micro-batch** sync reduce-scatters after every backward: each process keeps only its half, and "
        "sends the gradients 4 times per window instead of once.\n\n"
        "**Look at:** the same loss curve; below it, what each process measured: per-window holds twice the "
        "gradient memory (the 2 processes' sharding undone), per-micro-batch sends 4× the bytes."),
    base={"model": "tiny-bert", "backend": "pytorch", "fsdp": True, "num_processes": 2, "dropout": 0.0,
          "epochs": 4, "train_samples": 640, "eval_samples": 100, "micro_batch_size": 8, "grad_accum_steps": 4},
    runs=(DemoRun("per-window sync", {"grad_sync": "per-window"}),
          DemoRun("per-micro-batch sync", {"grad_sync": "per-micro-batch"})),
    chart="sharding",
    expect="Loss curves that match · per-window sync holds 2× the gradient memory per process, per-micro-batch sync "
           "sends 4× the bytes.",
)

# The quickest and the slowest demo's result, in seconds from the click: the "Headline" column of docs/demos.md
# (the lowest and highest of its passes), measured at stage size on a shared 2-vCPU machine. The landing page
# promises this range, no other figure; tests/analysis/test_demos.py keeps it equal to that table.
MEASURED_RESULT_S = (18.2, 30.1)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (SAME_CURVE, NAIVE_VS_EXACT, TRAINER_PITFALL,
                                                      NAIVE_VS_EXACT_LM, MEMORY_WALL, IN_BATCH_NEGATIVES, BATCH_NORM,
                                                      PITFALL_SCHEDULER,
                                                      PITFALL_CLIP, PITFALL_ZERO_GRAD, PITFALL_LOG_LOSS,
                                                      PITFALL_DROP_LAST, FSDP_SYNC)}


def get(name: str | None) -> Scenario | None:
    return SCENARIOS.get((name or "").strip())


if __name__ == "__main__":  # time a scenario as the app runs it: python -m gradacc.analysis.demos same-curve
    import sys
    import time

    import torch

    torch.set_num_threads(int(os.environ.get("GRADACC_TORCH_THREADS") or 1))  # the app's default: one thread
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s)")

    from gradacc.analysis.headline import headline
    from gradacc.events import Recorder
    from gradacc.training.run.launch import train_for

    for scenario in [SCENARIOS[n] for n in sys.argv[1:]] or SCENARIOS.values():
        began, recorded, load = time.perf_counter(), [], os.getloadavg()[0]
        for label, config in scenario.configs():
            recorder = Recorder()
            ended = train_for(config)(config, recorder)  # several processes: through accelerate launch
            recorded.append(recorder.events)
            print(f"{scenario.name} · {label}: {ended['status']} in {ended['wall_s']:.1f} s {ended['warnings']}")
        a, b = scenario.compares
        # The load average (1 min) when the demo began and ended: a time measured on a busy machine says so.
        print(f"{scenario.name}: {time.perf_counter() - began:.1f} s in all (load {load:.1f} → "
              f"{os.getloadavg()[0]:.1f}) · {headline(recorded[a], recorded[b])['headline']}", flush=True)
