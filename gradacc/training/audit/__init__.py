"""Audit a user's own accumulation: their ``Trainer`` (TRL's trainers included), their Accelerate loop, their plain
PyTorch loop, or their Lightning ``Trainer``.

On the run's first optimizer step the audit recomputes, on the same micro-batches and the same weights, the gradient
of the window's mean loss over its items (the reference: each micro-batch replayed from the random state the run
used for it, so dropout masks match), projects the gradient about to be applied on it, and names the one cause of
any difference with its fix for this model: a plain scale (k×, 1/k, j/k on a short window, an item miscount),
micro-batches weighted by their mean instead of by their items, clipping inside the window, zero_grad in the wrong
place; beside it, the scheduler's steps, the clipping it did, the logged loss. docs/audit.md is the user's guide.

Laid out by idea: ``capture`` (what the window did, recorded as it ran), ``losses`` (what a micro-batch's loss is,
by the model's kind), ``reference`` (the replay), ``measure`` (the one measurement both integrations make),
``verdict`` (the typed verdict and its checks), ``causes`` (naming the cause, and its fix), ``fixes`` (the
``compute_loss_func``s gradacc ships), ``trainer_audit``, ``accelerate_audit``, ``loop_audit`` and ``lightning_audit``
(the ways in), ``autoattach``
(``gradacc audit -- python train.py``). ``gradacc.audit`` is the public face (importable without torch).
"""
