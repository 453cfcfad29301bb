"""Backend 1: a plain PyTorch loop.

Forward, scale the loss, ``backward()``; every k micro-batches (and at the end of the epoch) clip,
``optimizer.step()``, ``lr_scheduler.step()``, ``optimizer.zero_grad()``. Nothing hidden.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.data import DataLoader

from gradacc.backends.common import (StepReporter, check_finite, evaluate, grad_norm, make_optimizer,
                                     make_scheduler, to_device)
from gradacc.memory import ActivationMeter
from gradacc.windows import loss_weight


def train(job) -> None:
    config = job.config
    gradient_accumulation_steps = config.grad_accum_steps
    model = job.model
    dataloader = DataLoader(job.train_examples, batch_size=config.micro_batch_size, shuffle=False,
                            collate_fn=job.collate)
    optimizer = make_optimizer(model, config)
    lr_scheduler = make_scheduler(optimizer, config, job.total_steps)
    meter = ActivationMeter(model)
    report = StepReporter(job)

    step, window_loss, micro_batches, activation_bytes = 0, 0.0, 0, None
    for epoch in range(1, config.epochs + 1):
        model.train()
        for index, batch in enumerate(dataloader):
            job.check_stop()
            batch = to_device(batch, job.device)
            report.micro_batch(batch)
            # Activations are measured on the first micro-batch of each window (the hooks cost time).
            measuring = config.instrument and micro_batches == 0
            with meter.measure() if measuring else contextlib.nullcontext():
                outputs = model(**batch)
            loss = outputs.loss
            check_finite(loss, step + 1)
            loss = loss * loss_weight(config.loss_normalization, job.batch_items[index], job.window_items[index],
                                      gradient_accumulation_steps)
            loss.backward()
            window_loss += loss.item()
            micro_batches += 1
            activation_bytes = meter.bytes if measuring else activation_bytes

            if (index + 1) % gradient_accumulation_steps == 0 or index + 1 == len(dataloader):
                if job.before_optimizer_step:
                    job.before_optimizer_step(model)
                norm = grad_norm(model, config.max_grad_norm)
                lr = lr_scheduler.get_last_lr()[0]
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                step += 1
                report.step(step=step, epoch=epoch, micro_batches=micro_batches, loss=window_loss, grad_norm=norm,
                            lr=lr, activation_bytes=activation_bytes)
                window_loss, micro_batches = 0.0, 0
                if step == job.total_steps:
                    break
        report.evaluation(epoch=epoch, step=step, metrics=evaluate(model, job))
        if step == job.total_steps:
            break
