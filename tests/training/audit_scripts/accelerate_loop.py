"""A user's Accelerate loop as accelerate's examples/by_feature/gradient_accumulation.py writes it, on a tiny BERT.
Run unchanged by ``gradacc audit -- accelerate launch ...`` or ``-- torchrun ...``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the tests' tiny models

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import BertForSequenceClassification  # noqa: E402

from audit_support import bert, cls_data, padding_collator  # noqa: E402

torch.set_num_threads(1)
torch.manual_seed(0)
accelerator = Accelerator(gradient_accumulation_steps=4)
model = BertForSequenceClassification(bert(num_labels=2))
train_dataloader = DataLoader(cls_data(32), shuffle=True, collate_fn=padding_collator(), batch_size=4)
optimizer = torch.optim.AdamW(params=model.parameters(), lr=2e-3)
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
model.train()
for batch in train_dataloader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
