"""Backend 1: a plain PyTorch loop.

Forward, scale the loss, ``backward()``; every k micro-batches (and at the end of the epoch) clip,
``optimizer.step()``, ``lr_scheduler.step()``, ``optimizer.zero_grad()``. Nothing hidden, and nothing wrong: the
loop below is the right one whatever the run asks for.

"Break it on purpose" (``--pitfall NAME``, the Train page) leaves this loop as it is: each mistake is a hook that
gradacc.training.backends.pitfalls puts on the loop's model, optimizer, scheduler, window rule or loss log, doing
the one wrong thing where the wrong line would, and measuring what it did against the right loop in the same run.

On several processes (``accelerate launch`` / ``torchrun``) the model is wrapped in
``DistributedDataParallel`` and every micro-batch but the window's last runs inside ``model.no_sync()``:
gradients add up locally and the ranks all-reduce once per optimizer step instead of once per micro-batch.
With ``fsdp`` it is sharded instead (``gradacc.training.fsdp``), and ``grad_sync`` says whether its gradients are
reduce-scattered once per window or after every micro-batch.
"""

from __future__ import annotations

import contextlib

from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from gradacc.choices import PER_MICRO_BATCH
from gradacc.training import fsdp, process_state
from gradacc.training.backends import pitfalls
from gradacc.training.backends.device import to_device
from gradacc.training.backends.evaluation import evaluate
from gradacc.training.backends.optimizer import clip_gradients, make_optimizer, make_scheduler
from gradacc.training.backends.reporting import StepReporter, WindowTally, activation_meter, check_finite
from gradacc.training.windows import WindowRule, loss_weight


def train(job) -> None:
    config = job.config
    grad_accum_steps = config.grad_accum_steps
    num_processes = config.num_processes
    model = job.model
    # This rank's own micro-batches (on one process: consecutive micro-batches of m, in the seeded order). Its own
    # generator too: not the process's, which other threads seed for their models.
    dataloader = DataLoader(job.train_examples, batch_sampler=job.micro_batches, collate_fn=job.collate,
                            generator=process_state.own_generator(config.seed))
    precision = job.precision  # autocast for the forward pass; fp16 also scales the loss
    meter = activation_meter(job, model)
    report = StepReporter(job, num_processes)
    if config.fsdp:
        model = fsdp.shard(model, job.device, config.model)  # each rank keeps 1/P of every parameter
    elif num_processes > 1:
        model = DistributedDataParallel(model, device_ids=[job.device.index] if job.device.type == "cuda" else None)
    # After wrapping: FSDP replaces each parameter by this rank's shard, which is what the optimizer steps.
    optimizer = make_optimizer(model, config, job.device)
    lr_scheduler = make_scheduler(optimizer, config, job.total_steps)
    windows = WindowRule(grad_accum_steps)  # which micro-batch closes a window and steps
    step, window = 0, WindowTally()  # the window being accumulated: its loss, micro-batches, activation bytes
    report.watch(model)  # DDP's gradient syncs, FSDP's shards: nothing on one process
    pitfalls.install(job, report, model, optimizer, lr_scheduler, windows, window)  # nothing unless asked for

    for epoch in range(1, config.epochs + 1):
        model.train()
        for index, batch in enumerate(dataloader):
            job.check_stop()
            batch = to_device(batch, job.device)
            report.micro_batch(batch)
            # Every k-th micro-batch closes a window, and so does the epoch's last: a short last window still steps.
            last_of_window = windows.closes(index, len(dataloader))
            # DDP all-reduces gradients during backward(); inside no_sync() they only add up on this rank.
            # Forward and backward both go inside: DDP decides at forward time whether backward syncs.
            # FSDP reduce-scatters during backward() unless told not to (per window: only the window's last).
            syncs = last_of_window or job.sync_each_micro_batch or config.grad_sync == PER_MICRO_BATCH
            if config.fsdp:
                fsdp.set_grad_sync(model, syncs)
            skip_sync = num_processes > 1 and not config.fsdp and not syncs
            with model.no_sync() if skip_sync else contextlib.nullcontext():
                # Activations are measured on the first micro-batch of each window (the hooks cost time).
                measuring = config.instrument and window.micro_batches == 0
                with meter.measure() if measuring else contextlib.nullcontext(), precision.autocast():
                    outputs = model(**batch)
                loss = outputs.loss
                check_finite(loss, step + 1)  # a host sync (waits for the GPU): a NaN stops the run where it starts
                # Accumulation, 1 of 3: scale each micro-batch's loss (÷ k, or by its share of the window's items).
                loss = loss * loss_weight(config.loss_normalization, job.batch_items[index], job.window_items[index],
                                          grad_accum_steps, num_processes)
                # Accumulation, 2 of 3: backward() every micro-batch; the gradients add up in each .grad.
                precision.scale(loss).backward()
            report.backward_done()
            # .item() is a host sync too, for the log: the scaled losses of a window add up to its mean loss.
            window.add(loss.item(), meter.bytes if measuring else None)

            # Accumulation, 3 of 3: step and zero the gradients once per window of k micro-batches.
            if last_of_window:
                report.before_optimizer_step(model)
                precision.unscale(optimizer)  # fp16: clip the true gradients, not the scaled ones
                norm = clip_gradients(model, config.max_grad_norm)
                lr = lr_scheduler.get_last_lr()[0]
                precision.step(optimizer)  # optimizer.step(), through the fp16 scaler if any
                lr_scheduler.step()
                optimizer.zero_grad()
                step += 1
                report.step(window, step=step, epoch=epoch, grad_norm=norm, lr=lr)
                if step == job.total_steps:
                    break
        report.evaluation(epoch=epoch, step=step, metrics=evaluate(model, job))
        if step == job.total_steps:
            break
