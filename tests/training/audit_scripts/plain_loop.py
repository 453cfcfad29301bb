"""A user's plain PyTorch training loop with gradient accumulation, written as the PyTorch docs and nanoGPT's
train.py write it, on tiny local models. Run unchanged by ``gradacc audit -- python plain_loop.py [flags]``.

    --model llama     a 🤗 causal LM trained on texts of uneven lengths: loss = model(**batch).loss / k
    --model nanogpt   nanoGPT's model(x, y) -> (logits, loss), with padding targets -1 ignored
    --fixed           the fix the audit names: each micro-batch's loss summed over its tokens ÷ the window's tokens
    --never-step      the loop forgets optimizer.step()
    --own-loss-fn     the script calls audit_loop itself with the loss_fn the docs give (nanoGPT)
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the tests' tiny models

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=["llama", "nanogpt"], default="llama")
parser.add_argument("--fixed", action="store_true")
parser.add_argument("--never-step", action="store_true")
parser.add_argument("--own-loss-fn", action="store_true")
args = parser.parse_args()

ddp = int(os.environ.get("RANK", -1)) != -1  # torchrun: one process group, as nanoGPT sets it up
if ddp:
    dist.init_process_group(backend="gloo")
torch.set_num_threads(1)
torch.manual_seed(0)
gradient_accumulation_steps = 4

if args.model == "llama":
    from transformers import LlamaForCausalLM

    from audit_support import llama, lm_collator, lm_data

    model = LlamaForCausalLM(llama(0.1))
    data, collate = lm_data(32), lm_collator()
else:
    from nano_gpt import GPT, nano_data, nano_collate

    model = GPT()
    data, collate = nano_data(32), nano_collate
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if ddp:
    model = DDP(model)
if args.own_loss_fn:
    from gradacc.audit import audit_loop
    from nano_gpt import loss_fn

    audit = audit_loop(model, optimizer, loss_fn=loss_fn)
sampler = DistributedSampler(data, shuffle=False) if ddp else None
loader = DataLoader(data, batch_size=4, shuffle=False, sampler=sampler, collate_fn=collate)


def window_tokens(window):
    if args.model == "llama":
        count = sum(int((b["labels"][:, 1:] != -100).sum()) for b in window)
    else:
        count = sum(int((y != -1).sum()) for _, y in window)
    if ddp:  # every rank's tokens; DDP averages the ranks' gradients, so × the world size
        total = torch.tensor(float(count))
        dist.all_reduce(total)
        return float(total) / dist.get_world_size()
    return count


model.train()
batches = list(loader)
for start in range(0, len(batches), gradient_accumulation_steps):
    window = batches[start:start + gradient_accumulation_steps]
    tokens = window_tokens(window)
    for micro_step, batch in enumerate(window):
        if ddp:  # nanoGPT's way: sync only on the window's last micro-batch
            model.require_backward_grad_sync = micro_step == len(window) - 1
        if args.model == "llama":
            logits = model(**batch).logits if args.fixed else None
            loss = (F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(),
                                    ignore_index=-100, reduction="sum") / tokens if args.fixed
                    else model(**batch).loss / gradient_accumulation_steps)
        else:
            x, y = batch
            logits, loss = model(x, y)
            loss = (F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum") / tokens
                    if args.fixed else loss / gradient_accumulation_steps)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if not args.never_step:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
if ddp:
    dist.destroy_process_group()
