"""Backend 3: 🤗 Transformers ``Trainer``.

``TrainingArguments(gradient_accumulation_steps=k, eval_strategy="epoch")``, a ``compute_metrics`` with
accuracy and F1, and a ``TrainerCallback`` that turns Trainer's hooks into gradacc events.

Pitfall handled here (transformers 5): a model whose ``forward`` takes ``**kwargs`` (BERT does) makes
Trainer believe the model divides by ``num_items_in_batch`` and skip its own ÷k, so losses and gradients
come out k× too large. gradacc passes a ``compute_loss_func`` that really uses ``num_items_in_batch``
(``exact``) or divides each micro-batch mean by k (``naive``).

On several processes Trainer prepares (DDP-wraps) the model and shards the data through Accelerate, runs
every micro-batch but the window's last inside ``accelerator.no_sync``, sums ``num_items_in_batch`` over
ranks and multiplies each loss by the number of processes to undo DDP's average. With ``fsdp`` the model is
sharded through ``TrainingArguments(fsdp="full_shard", fsdp_config={"version": 2})`` instead (FSDP2 averages its
reduce-scatter as DDP does), and ``sync_each_batch`` is the per-micro-batch sync.
"""

from __future__ import annotations

import contextlib
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from accelerate.utils import FullyShardedDataParallelPlugin
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

from gradacc.choices import PER_MICRO_BATCH
from gradacc.conventions import IGNORE_INDEX
from gradacc.errors import RunStopped
from gradacc.events import BASELINE_METRICS
from gradacc.training import fsdp, process_state
from gradacc.training.backends.accelerate_fsdp import forget_fsdp_on_cpu, keep_fsdp_on_cpu, prepared_sharded
from gradacc.training.compat import accelerate as accelerate_compat
from gradacc.training.backends.evaluation import EVAL_BATCH_SIZE, evaluate, next_token_predictions
from gradacc.training.backends.optimizer import make_optimizer, warmup_steps
from gradacc.training.backends.reporting import StepReporter, WindowTally, activation_meter, check_finite
from gradacc.training.memory.measure import ActivationMeter
from gradacc.training.backends.metrics import classification_metrics, language_model_metrics
from gradacc.training.windows import loss_weight


def make_loss_function(normalization: str, grad_accum_steps: int, num_processes: int = 1, causal_lm: bool = False):
    """Trainer's ``compute_loss_func``: each micro-batch's mean cross-entropy times ``windows.loss_weight``, the
    weight every backend uses (its share of the window's items, or 1/k).

    ``num_items_in_batch`` counts the window on all ranks, and Trainer multiplies the returned loss by the
    number of processes (DDP then averages over them), so the weight is divided by it here.
    A causal LM predicts token t+1 at position t: logits and labels are shifted as ``*ForCausalLM`` does
    (and Trainer then counts ``num_items_in_batch`` over ``labels[..., 1:]``).
    """

    def compute_loss(outputs, labels, num_items_in_batch=None):
        # Accumulation, 1 of 3: scale the loss (Trainer does the backward every micro-batch and the step every k).
        logits = outputs["logits"]
        if causal_lm:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                 ignore_index=IGNORE_INDEX, reduction="sum")
        items = (labels != IGNORE_INDEX).sum().clamp(min=1)  # summed is 0 then too
        weight = loss_weight(normalization, items, num_items_in_batch, grad_accum_steps, num_processes)
        return summed / items * weight / num_processes

    return compute_loss


class GradaccTrainer(Trainer):
    """Trainer plus the readings a callback cannot take: each micro-batch's loss, size and activation bytes."""

    def __init__(self, *args, job, meter: ActivationMeter, report: StepReporter, window: WindowTally, **kwargs):
        super().__init__(*args, **kwargs)
        self.job = job
        self.meter = meter
        self.report = report
        self.window = window

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        if self.args.fsdp:  # on the CPU Accelerate drops the FSDP plugin (see keep_fsdp_on_cpu); keep it
            keep_fsdp_on_cpu(FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args))
            self.is_fsdp_enabled = True

    # Each loader draws a base seed per pass: from the run's own generator, not the process's (process_state).
    def get_train_dataloader(self):
        return _own_generator(super().get_train_dataloader(), self.args.seed)

    def get_eval_dataloader(self, eval_dataset=None):
        return _own_generator(super().get_eval_dataloader(eval_dataset), self.args.seed)

    def create_optimizer(self, model=None):
        # Trainer refuses an optimizer passed in with FSDP: it asks for one here, on the model it then shards.
        if self.optimizer is None:
            self.optimizer = make_optimizer(model or self.model, self.job.config, self.job.device)
        return self.optimizer

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.job.check_stop()  # within one micro-batch, even mid-window
        self.report.micro_batch(inputs)
        measuring = self.window.measuring = self.job.config.instrument and self.window.micro_batches == 0
        try:
            loss = super().training_step(model, inputs, num_items_in_batch)
        finally:
            self.window.measuring = False
        check_finite(loss, self.state.global_step + 1)
        self.report.backward_done()
        self.window.add(float(loss), self.meter.bytes if measuring else None)
        return loss

    def evaluate(self, *args, **kwargs):
        if not self.job.task.model_computes_loss:
            return super().evaluate(*args, **kwargs)
        # E.g. retrieval over the held-out pairs (every query against every positive), as the other backends do;
        # Trainer's prediction loop knows only labels and logits.
        metrics = evaluate(self.model, self.job)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def compute_loss(self, model, inputs, *args, **kwargs):
        # The forward pass only: hooks left open across backward cost about twice as much (measured).
        with self.meter.measure() if self.window.measuring else contextlib.nullcontext():
            return super().compute_loss(model, inputs, *args, **kwargs)


def _own_generator(loader, seed: int):
    accelerate_compat.draw_base_seeds_from(loader, process_state.own_generator(seed))
    return loader


class EventCallback(TrainerCallback):
    """Trainer's events → gradacc's events, without touching Trainer's loop."""

    def __init__(self, job, report: StepReporter, window: WindowTally):
        self.job = job
        self.report = report
        self.window = window
        self.trainer: GradaccTrainer | None = None  # only to reach the DDP-wrapped model when training begins
        self.lr = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        # Trainer has just DDP-wrapped the model (on several processes), or sharded it: watch its gradient syncs.
        if self.job.config.fsdp:
            prepared_sharded(self.trainer.accelerator, self.trainer.model_wrapped)
        self.report.watch(self.trainer.model_wrapped)

    def on_substep_end(self, args, state, control, **kwargs):
        if self.job.stop.is_set():
            control.should_training_stop = True

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.job.before_optimizer_step:
            self.job.before_optimizer_step(model)
        self.lr = optimizer.param_groups[0]["lr"]

    def on_log(self, args, state, control, logs=None, **kwargs):
        # One training log per optimizer step (logging_steps=1): the step event. Its "loss" is Trainer's
        # running figure; the window's own comes from the tally.
        if logs and "loss" in logs and "eval_loss" not in logs:
            self.report.step(self.window, step=state.global_step, epoch=int(-(-state.epoch // 1)),
                             grad_norm=logs.get("grad_norm"), lr=self.lr)

    def on_step_end(self, args, state, control, **kwargs):
        if self.job.stop.is_set():
            control.should_training_stop = True

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.job.stop.is_set():  # a stopped run ends now; no eval of a half epoch
            control.should_evaluate = False

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.job.task.next_token:
            # Trainer's own eval_loss averages batch means; every backend reports the token-weighted mean.
            metrics = {**metrics, "eval_loss": metrics["eval_token_loss"]}
        self.report.evaluation(epoch=round(state.epoch), step=state.global_step, metrics=metrics)


def _per_token(logits, labels):
    logits = logits[0] if isinstance(logits, tuple) else logits
    token_losses, predicted, _ = next_token_predictions(logits, labels)
    return torch.stack([token_losses, predicted.float()], dim=-1)  # token ids < 2**24 are exact in float32


class _Samples(torch.utils.data.Dataset):
    """Keeps Trainer from treating a list of dicts as something else; sequential access only."""

    def __init__(self, examples):
        self.examples = examples

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, index):
        return self.examples[index]


def sharding_arguments(model) -> dict:
    """TrainingArguments for FSDP2: each of the model's repeated blocks its own group, as the other loops shard it."""
    block_classes = sorted({type(block).__name__ for block in fsdp.blocks(model)})
    wrap = {"transformer_layer_cls_to_wrap": block_classes} if block_classes else {"auto_wrap_policy": "NO_WRAP"}
    return {"fsdp": "full_shard", "fsdp_config": {"version": 2, "reshard_after_forward": True, **wrap}}


def train(job) -> None:
    config = job.config
    forget_fsdp_on_cpu()  # TrainingArguments reads Accelerate's process-wide state: as Accelerate made it
    if config.fsdp:
        fsdp.check_shardable(job.model, config.model)  # before Trainer's prepare tries
    report = StepReporter(job, config.num_processes)
    meter = activation_meter(job, job.model)
    window = WindowTally()
    with tempfile.TemporaryDirectory(prefix="gradacc-trainer-") as output_dir:
        args = TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=config.micro_batch_size,
            per_device_eval_batch_size=EVAL_BATCH_SIZE,
            # Accumulation: Trainer runs backward() every micro-batch and steps and zeroes every k; the loss scaling is
            # compute_loss_func's (below).
            gradient_accumulation_steps=config.grad_accum_steps,
            eval_strategy="epoch",
            num_train_epochs=config.epochs,
            max_steps=config.max_steps or -1,
            learning_rate=config.learning_rate,
            weight_decay=config.weight_decay,
            warmup_steps=warmup_steps(config, job.total_steps),
            lr_scheduler_type="linear",
            max_grad_norm=config.max_grad_norm,
            # Contract: step events come from EventCallback.on_log, which Trainer calls after an optimizer step
            # only when it logs; logging every step gives exactly one step event per optimizer step.
            logging_strategy="steps",
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            seed=config.seed,
            train_sampling_strategy="sequential",  # the data is pre-shuffled with the seed: same order everywhere
            use_cpu=job.device.type == "cpu",
            disable_tqdm=True,
            dataloader_num_workers=0,
            bf16=config.precision == "bf16",
            fp16=config.precision == "fp16",
            activation_checkpointing=config.gradient_checkpointing,  # transformers 5's gradient_checkpointing
            activation_checkpointing_kwargs={"use_reentrant": False} if config.gradient_checkpointing else None,
            # Several processes: all-reduce after every micro-batch when asked to (what no_sync saves, measured), or
            # reduce-scatter after every micro-batch (FSDP's per-micro-batch sync).
            accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}
            if job.sync_each_micro_batch or config.grad_sync == PER_MICRO_BATCH else None,
            **(sharding_arguments(job.model) if config.fsdp else {}),
        )
        callback = EventCallback(job, report, window)

        def compute_metrics(eval_prediction):
            scores = classification_metrics(eval_prediction.predictions.argmax(-1), eval_prediction.label_ids,
                                            job.num_labels)
            return {"accuracy": scores["accuracy"], "f1": scores["f1"],
                    **{name: scores[name] for name in BASELINE_METRICS}}

        def compute_lm_metrics(eval_prediction):
            # Batches are concatenated padded with -100 on the right, which keeps position t beside token t+1.
            per_token, labels = eval_prediction.predictions, eval_prediction.label_ids
            targets = np.pad(labels[:, 1:], ((0, 0), (0, 1)), constant_values=IGNORE_INDEX)
            scores = language_model_metrics(per_token[..., 0], per_token[..., 1].astype(np.int64), targets)
            return {"token_loss": scores["eval_loss"], "perplexity": scores["eval_perplexity"],
                    "next_token_accuracy": scores["eval_next_token_accuracy"]}

        # Trainer writes Accelerate's state and reseeds torch's generator (set_seed): not under another thread's
        # init or run.
        with process_state.guard(accelerate=True, generator=True):
            trainer = GradaccTrainer(
                model=job.model,
                args=args,
                train_dataset=_Samples(job.train_examples),
                eval_dataset=_Samples(job.eval_examples),
                data_collator=job.collate,
                processing_class=job.tokenizer,
                compute_metrics=compute_lm_metrics if job.task.next_token else compute_metrics,
                # A causal LM's eval keeps each token's loss and prediction, not (examples × tokens × vocabulary)
                # logits.
                preprocess_logits_for_metrics=_per_token if job.task.next_token else None,
                # The run's optimizer (the same groups and class the other backends build); Trainer adds its schedule.
                # With FSDP Trainer asks GradaccTrainer.create_optimizer for it instead.
                optimizers=(None, None) if config.fsdp else (make_optimizer(job.model, config, job.device), None),
                # A model that computes its loss (contrastive: the micro-batch's in-batch-negatives mean) keeps it;
                # Trainer divides it by k, as sentence-transformers' own Trainer subclass does.
                compute_loss_func=None if job.trainer_library_default or job.task.model_computes_loss
                else make_loss_function(config.loss_normalization, config.grad_accum_steps, config.num_processes,
                                        job.task.next_token),
                callbacks=[callback],
                job=job,
                meter=meter,
                report=report,
                window=window,
            )
        callback.trainer = trainer
        trainer.remove_callback(PrinterCallback)  # with tqdm off, Trainer prints every log dict to stdout
        trainer.train()
        if job.stop.is_set():
            raise RunStopped()
