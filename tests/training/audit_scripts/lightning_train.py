"""A Lightning user's script, as Lightning's docs write one: a LightningModule training a small causal LM with the
mean over each micro-batch's non-pad tokens, ``Trainer(accumulate_grad_batches=4)``; nothing of gradacc in it.
``--fixed``: the audit's fix (each micro-batch's summed loss, the gradients × k × processes ÷ the window's tokens
over all processes).
``--pytorch-lightning``: the same with ``import pytorch_lightning as L``. ``--ddp``: two CPU processes (DDP, gloo)."""

import sys

import torch
import torch.nn.functional as F
from transformers import DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

if "--pytorch-lightning" in sys.argv:
    import pytorch_lightning as L
else:
    import lightning as L
from tokenizers import Tokenizer, models, pre_tokenizers

FIXED = "--fixed" in sys.argv


class LitLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                                  pad_token_id=0, bos_token_id=2, eos_token_id=3))
        self.window_tokens = 0

    def training_step(self, batch, batch_idx):
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        target = batch["labels"][:, 1:]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                               reduction="sum" if FIXED else "mean")
        self.window_tokens += int((target != -100).sum())
        return loss

    def on_before_optimizer_step(self, optimizer):
        if FIXED:
            tokens = self.trainer.strategy.reduce(torch.tensor(float(self.window_tokens), device=self.device),
                                                  reduce_op="sum")
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.trainer.accumulate_grad_batches * self.trainer.world_size / tokens)
        self.window_tokens = 0

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    L.seed_everything(0)
    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2, "[EOS]": 3, **{f"w{i}": i + 4 for i in range(60)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    texts = [" ".join(f"w{(i * 7 + j) % 60}" for j in range(3 + i % 11)) for i in range(32)]
    data = [{"input_ids": tokenizer(t)["input_ids"]} for t in texts]
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True,
                                         collate_fn=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    ddp = dict(devices=2, strategy="ddp") if "--ddp" in sys.argv else {}
    trainer = L.Trainer(accelerator="cpu", max_steps=2, accumulate_grad_batches=4, logger=False, **ddp,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LitLM(), loader)


if __name__ == "__main__":
    main()
