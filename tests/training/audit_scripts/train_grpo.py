"""A user's GRPO script, as written from TRL's GRPOTrainer quickstart (a reward on the completions' length, a prompt
dataset, GRPOConfig, GRPOTrainer(...).train()), on a tiny Qwen2 built from a config (no model hub here). Its LM head
has a bias raised on EOS, so completions end at uneven lengths, as a trained model's do. Run unchanged by
``gradacc audit -- python train_grpo.py --loss-type dapo -k 2 --steps-per-generation 4``; the tests call
``trainer(...)`` for the same trainer in-process."""

import argparse
import os
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer

WORDS = [f"w{i}" for i in range(60)]


def tokenizer():
    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2, "[EOS]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]")


def tiny_qwen2():
    config = Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=128, vocab_size=len(WORDS) + 4,
                         pad_token_id=0, bos_token_id=2, eos_token_id=3, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[config.eos_token_id] = 2.5
    model.lm_head = head
    return model


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def trainer(loss_type="dapo", k=2, steps_per_generation=None, beta=0.0, steps=1, output_dir=None, build=tiny_qwen2,
            trainer_class=GRPOTrainer, **extra):
    """``build``: the model (the tests' tiny MoE model in its place); ``trainer_class``: GRPOTrainer or a subclass."""
    torch.manual_seed(0)
    output_dir = output_dir or tempfile.mkdtemp(prefix="grpo-")
    model = build()
    if beta:  # GRPOTrainer loads the KL reference from the model's name: save it, as a downloaded model would be
        model.save_pretrained(os.path.join(output_dir, "reference"))  # (loaded back as a plain Qwen2: no EOS bias)
        model.config._name_or_path = os.path.join(output_dir, "reference")
    generator = torch.Generator().manual_seed(7)
    prompts = [" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (2 + i % 3,), generator=generator).tolist())
               for i in range(16)]
    args = GRPOConfig(**{**dict(output_dir=output_dir, loss_type=loss_type, per_device_train_batch_size=4,
                                gradient_accumulation_steps=k, steps_per_generation=steps_per_generation,
                                num_generations=4, max_completion_length=8, beta=beta, learning_rate=0.03,
                                max_steps=steps, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                                disable_tqdm=True), **extra})
    return trainer_class(model=model, reward_funcs=reward_len, args=args, processing_class=tokenizer(),
                       train_dataset=Dataset.from_dict({"prompt": prompts}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("-k", type=int, default=2)
    parser.add_argument("--steps-per-generation", type=int, default=None)
    parser.add_argument("--beta", type=float, default=0.0)
    options = parser.parse_args()
    torch.set_num_threads(1)
    trainer(options.loss_type, options.k, options.steps_per_generation, options.beta).train()
