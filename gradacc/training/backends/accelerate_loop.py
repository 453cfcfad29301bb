"""Backend 2: 🤗 Accelerate.

``Accelerator(gradient_accumulation_steps=k)``, ``prepare``, and inside ``with accelerator.accumulate(model):``
the usual forward, ``accelerator.backward(loss)``, ``optimizer.step()``, ``lr_scheduler.step()``,
``optimizer.zero_grad()`` — Accelerate skips the step (and the gradient sync) until the window's last
micro-batch, or the end of the dataloader.

On several processes ``prepare`` wraps the model in DDP and shards the dataloader (rank r takes micro-batches
r, r+P, ...), and ``accumulate`` runs every micro-batch but the window's last inside ``no_sync``. With ``fsdp``
Accelerate's FSDP plugin (``fsdp_version=2``) shards it instead, and ``sync_each_batch`` is the per-micro-batch sync.
"""

from __future__ import annotations

import contextlib

from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin
from torch.utils.data import DataLoader

from gradacc.choices import PER_MICRO_BATCH
from gradacc.training import fsdp, process_state
from gradacc.training.backends import accelerate_fsdp
from gradacc.training.backends.evaluation import evaluate
from gradacc.training.backends.optimizer import clip_gradients, make_optimizer, make_scheduler
from gradacc.training.backends.reporting import StepReporter, WindowTally, activation_meter, check_finite
from gradacc.training.compat import accelerate as compat
from gradacc.training.windows import loss_weight

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def new_accelerator(job):
    # The run's engine holds Accelerate's state for the whole training; held here too, so no build goes unguarded.
    with process_state.guard(accelerate=True):
        return _new_accelerator(job)


def _new_accelerator(job):
    # A fresh accumulation state per run (these are process-wide singletons); the process group stays.
    accelerate_fsdp.forget_fsdp_on_cpu()
    compat.reset_accumulation_state()
    # Accelerate's own autocast (and grad scaler for fp16) around the prepared model's forward.
    options = dict(cpu=job.device.type == "cpu", mixed_precision=MIXED_PRECISION[job.config.precision])
    plugin = accelerate_fsdp.fsdp_plugin(job.model) if job.config.fsdp else None
    if plugin is not None:
        options["fsdp_plugin"] = plugin
    # Sync after every micro-batch: DDP's all-reduce (what no_sync saves, measured), or FSDP's per-micro-batch sync.
    if job.sync_each_micro_batch or job.config.grad_sync == PER_MICRO_BATCH:
        accumulation = GradientAccumulationPlugin(num_steps=job.config.grad_accum_steps, sync_each_batch=True)
        accelerator = Accelerator(gradient_accumulation_plugin=accumulation, **options)
    else:
        accelerator = Accelerator(gradient_accumulation_steps=job.config.grad_accum_steps, **options)
    if plugin is not None:
        accelerate_fsdp.keep_fsdp_on_cpu(plugin)
    return accelerator


def train(job) -> None:
    config = job.config
    grad_accum_steps = config.grad_accum_steps
    if config.fsdp:
        fsdp.check_shardable(job.model, config.model)  # before Accelerate's prepare tries
    accelerator = new_accelerator(job)
    num_processes = accelerator.num_processes
    dataloader = DataLoader(job.train_examples, batch_size=config.micro_batch_size, shuffle=False,
                            collate_fn=job.collate, generator=process_state.own_generator(config.seed))
    optimizer = make_optimizer(job.model, config, job.device)
    # AcceleratedScheduler steps once per process per optimizer step: size it (warmup too) to match.
    lr_scheduler = make_scheduler(optimizer, config, job.total_steps, calls_per_step=num_processes)
    model, optimizer, dataloader, lr_scheduler = accelerator.prepare(job.model, optimizer, dataloader, lr_scheduler)
    if config.fsdp:
        accelerate_fsdp.prepared_sharded(accelerator, model)
    meter = activation_meter(job, model)
    report = StepReporter(job, num_processes)
    report.watch(model)  # DDP's gradient syncs, FSDP's shards, where prepare wrapped the model so

    step, window = 0, WindowTally()  # the window being accumulated: its loss, micro-batches, activation bytes
    for epoch in range(1, config.epochs + 1):
        model.train()
        for index, batch in enumerate(dataloader):
            job.check_stop()
            report.micro_batch(batch)
            measuring = config.instrument and window.micro_batches == 0
            # Inside accumulate(): no gradient sync until the window's last micro-batch (or the dataloader's last).
            with accelerator.accumulate(model):
                with meter.measure() if measuring else contextlib.nullcontext():
                    outputs = model(**batch)
                loss = outputs.loss
                check_finite(loss, step + 1)  # a host sync (waits for the GPU): a NaN stops the run where it starts
                # Accumulation, 1 of 3: scale the loss. accelerator.backward divides by k itself (even in a short
                # last window); the exact weights undo that.
                weight = loss_weight(config.loss_normalization, job.batch_items[index], job.window_items[index],
                                     grad_accum_steps, num_processes)
                # Accumulation, 2 of 3: backward every micro-batch.
                accelerator.backward(loss * weight * grad_accum_steps)
                report.backward_done()
                # .item() is a host sync too, for the log: the scaled losses of a window add up to its mean loss.
                window.add(loss.item() * weight, meter.bytes if measuring else None)
                norm = None
                if accelerator.sync_gradients:
                    report.before_optimizer_step(model)
                    norm = clip_gradients(model, config.max_grad_norm, accelerator)
                lr = lr_scheduler.get_last_lr()[0]  # the rate this window's step uses (the scheduler steps below)
                # Accumulation, 3 of 3: step and zero; the prepared optimizer and scheduler act once per window.
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

            if accelerator.sync_gradients:
                step += 1
                report.step(window, step=step, epoch=epoch, grad_norm=norm, lr=lr)
                if step == job.total_steps:
                    break
        report.evaluation(epoch=epoch, step=step, metrics=evaluate(model, job))
        if step == job.total_steps:
            break
    accelerator.free_memory()

