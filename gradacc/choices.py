"""The names a run chooses from: backends, tasks, built-in models and data, memory levers, pitfalls.

Plain tuples and dicts, importing nothing: every layer (the config's checks, the CLI's choices, the pages'
select boxes) reads them from here.
"""

BACKENDS = ("pytorch", "accelerate", "trainer")
LOSS_NORMALIZATIONS = ("exact", "naive")
CLASSIFICATION, CAUSAL_LM, CONTRASTIVE = "classification", "causal-lm", "contrastive"
# contrastive: a sentence-transformers model learns (query, positive) pairs with in-batch negatives.
TASKS = (CLASSIFICATION, CAUSAL_LM, CONTRASTIVE)
# The built-in data each task trains on when a run names none (gradacc.training.tasks holds the rest of each task).
TASK_DATASETS = {CLASSIFICATION: "builtin-sentiment", CAUSAL_LM: "builtin-text", CONTRASTIVE: "builtin-pairs"}
# Tasks whose micro-batch's examples are each other's negatives: accumulation is not the big batch there, so they run
# on one process and GradCache's mini-batch applies.
IN_BATCH_NEGATIVE_TASKS = (CONTRASTIVE,)
# bow-batchnorm and bow-layernorm: a bag-of-embeddings classifier with BatchNorm (statistics over the micro-batch,
# which couples its examples: accumulation is not the big batch) or LayerNorm (per example: it is).
BUILTIN_MODELS = ("tiny-bert", "all-MiniLM-L6-v2", "tiny-gpt", "bow-batchnorm", "bow-layernorm")
BUILTIN_DATASETS = ("builtin-sentiment", "builtin-text", "builtin-pairs")
# What each built-in model is for: a run that names no task gets its model's.
# all-MiniLM-L6-v2 is a sentence-transformers model too: with --task contrastive it trains as one.
BUILTIN_MODEL_TASKS = {"tiny-bert": CLASSIFICATION, "all-MiniLM-L6-v2": CLASSIFICATION, "tiny-gpt": CAUSAL_LM,
                       "bow-batchnorm": CLASSIFICATION, "bow-layernorm": CLASSIFICATION}
# Built-in models the contrastive task trains (as sentence-transformers models).
CONTRASTIVE_MODELS = ("all-MiniLM-L6-v2",)
# Models that cannot train on a micro-batch of one example (BatchNorm): the memory probes, which measure one, refuse them.
SINGLE_EXAMPLE_UNMEASURABLE = ("bow-batchnorm",)
# Models made here from random weights (the rest start from trained ones).
FROM_SCRATCH_MODELS = ("tiny-bert", "tiny-gpt", "bow-batchnorm", "bow-layernorm")
# Memory levers beside accumulation (gradacc.training.backends.device and .optimizer apply them; the device decides what runs).
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "adamw-fused", "sgd", "adafactor", "adamw-8bit")
# How a sharded (FSDP) run syncs gradients while it accumulates: reduce-scatter once per window (each rank holds the
# whole model's unsharded gradients meanwhile) or after every micro-batch (each rank holds only its shard).
PER_WINDOW, PER_MICRO_BATCH = "per-window", "per-micro-batch"
GRAD_SYNCS = (PER_WINDOW, PER_MICRO_BATCH)
# Built-in models FSDP cannot shard as gradacc trains them: BatchNorm's running statistics are buffers that FSDP
# neither shards nor synchronises (gradacc.training.fsdp.unwrappable finds the same in a folder's model).
FSDP_UNSHARDABLE = {"bow-batchnorm": "its BatchNorm keeps running statistics, buffers FSDP neither shards nor "
                                     "synchronises across processes"}
# Mistakes the plain PyTorch loop makes on purpose when a run asks for them (one wrong line each, a hook in
# gradacc/training/backends/pitfalls.py), with the upstream report of each.
PITFALLS = {
    "scheduler-per-micro-batch": "accelerate #963",
    "clip-per-micro-batch": "accelerate #641",
    "zero-grad-per-micro-batch": "zero_grad inside the window",
    "log-undivided-loss": "transformers #35204",
    "drop-last-window": "Lightning #19987",
}
