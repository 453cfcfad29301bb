"""A user's training script, as written from the 🤗 docs, on tiny local models: a Trainer on GPT-2 (causal LM, the
standard collator), an Accelerate loop on BERT (accelerate's by_feature/gradient_accumulation.py), and TRL's
SFTTrainer on Qwen2. ``--fixed``: GPT-2 with the fix gradacc names. Run unchanged by ``gradacc audit -- python ...``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the tests' tiny models

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import (BertForSequenceClassification, GPT2LMHeadModel, Qwen2ForCausalLM, Trainer,  # noqa: E402
                          TrainingArguments, get_linear_schedule_with_warmup)

from audit_support import bert, cls_data, gpt2, lm_collator, lm_data, padding_collator, qwen2, texts, tokenizer, \
    trainer_args  # noqa: E402

torch.set_num_threads(1)
torch.manual_seed(0)
model = GPT2LMHeadModel(gpt2())
if "--fixed" in sys.argv:
    model.loss_type = "ForCausalLM"
Trainer(model=model, args=TrainingArguments(**trainer_args(steps=2)), train_dataset=lm_data(),
        data_collator=lm_collator()).train()

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
model = BertForSequenceClassification(bert(num_labels=2))
train_dataloader = DataLoader(cls_data(32), shuffle=True, collate_fn=padding_collator(), batch_size=4)
optimizer = torch.optim.AdamW(params=model.parameters(), lr=2e-3)
lr_scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=100)
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)
for epoch in range(2):
    model.train()
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

if "--with-sft" in sys.argv:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    SFTTrainer(model=Qwen2ForCausalLM(qwen2(0.1)), train_dataset=Dataset.from_dict({"text": texts(48)}),
               processing_class=tokenizer(),
               args=SFTConfig(**trainer_args(), max_length=32, bf16=False, gradient_checkpointing=False)).train()
