"""``gradacc train``: one run, with a progress line and a summary, or every event as JSON."""

from __future__ import annotations

import sys
import threading

from gradacc import events, paths
from gradacc.choices import PITFALLS
from gradacc.cli.options import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, add_run_options, config_from_args, value
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.export import trackers
from gradacc.labels import in_cli_words
from gradacc.serving.limits import Limits
from gradacc.training import distributed
from gradacc.training.run import engine
from gradacc.training.run.options import RunOptions


def add_parser(commands) -> None:
    train = commands.add_parser("train", help="train one run")
    add_run_options(train)
    recipe = "default: the model's recipe"
    train.add_argument("--epochs", type=value, default=None, help=recipe)
    train.add_argument("--max-steps", type=value, default=None, help="stop after this many optimizer steps")
    train.add_argument("--lr", type=value, default=None, dest="learning_rate", help=recipe)
    train.add_argument("--warmup-ratio", type=value, default=None, help=recipe)
    train.add_argument("--weight-decay", type=value, default=RunConfig.weight_decay)
    train.add_argument("--max-grad-norm", type=value, default=RunConfig.max_grad_norm, help="0 disables clipping")
    train.add_argument("--train-samples", type=value, default=RunConfig.train_samples)
    train.add_argument("--eval-samples", type=value, default=RunConfig.eval_samples)
    train.add_argument("--dropout", type=value, default=None, help=recipe)
    train.add_argument("--trainer-library-default", action="store_true",
                       help="Trainer backend: keep Trainer's own loss scaling (k× too large on BERT in transformers 5)")
    train.add_argument("--pitfall", action="append", default=None, dest="pitfalls", metavar="NAME",
                       help="PyTorch loop only, repeatable: run one deliberately wrong line and say what it broke: "
                            + ", ".join(PITFALLS))
    train.add_argument("--memory-budget-mb", type=value, default=None,
                       help="fail like out-of-memory when the run needs more than this (measured before step 1 and "
                            "on every measured micro-batch; a real allocator cap on CUDA)")
    train.add_argument("--no-instrument", action="store_false", dest="instrument",
                       help="skip activation/RSS measurement (for overhead comparisons)")
    train.add_argument("--metrics-out", default=None, help="also write every event to this JSONL file")
    train.add_argument("--json", action="store_true", help="print each event as one JSON object per line")
    train.add_argument("--report-to", default="none", metavar="none|tensorboard|trackio",
                       help="also log to TensorBoard and/or a local Trackio project (comma-separated), written from "
                            "gradacc's events: the same scalars for every backend, steps are optimizer steps")
    train.add_argument("--log-dir", default=None,
                       help="TensorBoard event files go to LOG_DIR/<run id>/ (default runs/); Trackio's store to "
                            "LOG_DIR (default Trackio's own folder)")
    train.add_argument("--config", default=None, dest="config_file",
                       help="a RunConfig as a JSON file; replaces the other run options (the app's launcher uses it)")
    train.add_argument("--confine", action="store_true",
                       help="keep local paths inside GRADACC_DATA_DIRS / GRADACC_MODEL_DIRS, as the app does for its "
                            "visitors (its launcher passes this); without it, any file you can read")
    train.add_argument("--sync-each-micro-batch", action="store_true",
                       help="several processes: all-reduce gradients after every micro-batch (no no_sync), "
                            "to measure what no_sync saves")
    train.set_defaults(run=run)


def run(args) -> int:
    trackers.parse_report_to(args.report_to)  # a misspelt tracker fails here, before torch is imported
    config = config_from_args(args).check()
    if config.fsdp and args.sync_each_micro_batch:
        raise GradaccError("--sync-each-micro-batch is DDP's; a sharded run syncs after every micro-batch with "
                           "--grad-sync per-micro-batch.")
    limits = Limits.from_env()
    limits.check(config)
    writes = distributed.is_main_process()  # only rank 0 prints and writes events
    metrics_file = open(args.metrics_out, "w", encoding="utf-8") if args.metrics_out and writes else None
    show = print_json if args.json else Progress()

    def on_event(event: dict) -> None:
        if not writes:
            return
        if metrics_file:
            metrics_file.write(events.to_json(event) + "\n")
            metrics_file.flush()
        show(event)

    stop = threading.Event()
    options = RunOptions(report_to=args.report_to, log_dir=args.log_dir, run_id=events.new_run_id(),
                         sync_each_micro_batch=args.sync_each_micro_batch,
                         confinement=None if args.confine else paths.TRUST_USER,  # None: the visitors' folders
                         max_run_memory_mb=limits.max_run_memory_mb)
    try:
        ended = engine.train(config, on_event, stop, options)
    except KeyboardInterrupt:  # Ctrl-C: the engine stops within one micro-batch on its own next check
        stop.set()
        raise
    finally:
        if metrics_file:
            metrics_file.close()
    if ended["status"] == events.FAILED:
        # Every rank says why it failed: a launcher reports the failed rank's last error line.
        where = f"rank {distributed.rank()}: " if distributed.world_size() > 1 else ""
        print(f"error: {where}{in_cli_words(ended['reason'], ended.get('field'))}", file=sys.stderr)
        return EXIT_BAD_INPUT if ended.get("field") else EXIT_FAILED
    if writes:
        say_where_trackers_wrote(args, options.run_id)
    return EXIT_OK


def say_where_trackers_wrote(args, run_id: str) -> None:
    """On stderr: stdout may be the JSON event stream."""
    names = trackers.parse_report_to(args.report_to)
    if "tensorboard" in names:
        log_dir = args.log_dir or trackers.DEFAULT_LOG_DIR
        print(f"TensorBoard: {log_dir}/{run_id}/ (tensorboard --logdir {log_dir})", file=sys.stderr)
    if "trackio" in names:
        where = f"TRACKIO_DIR={args.log_dir} " if args.log_dir else ""
        print(f"Trackio: run {run_id} in project {trackers.TRACKIO_PROJECT} "
              f"({where}trackio show --project {trackers.TRACKIO_PROJECT})", file=sys.stderr)


def print_json(event: dict) -> None:
    print(events.to_json(event), flush=True)


class Progress:
    """A one-line progress display and a short summary, for people at a terminal."""

    def __init__(self):
        self.total = 0
        self.tty = sys.stdout.isatty()

    def __call__(self, event: dict) -> None:
        kind = event["event"]
        if kind == events.RUN_STARTED:
            self.total = event["total_steps"]
            config = event["config"]
            sharded = f" sharded (FSDP, {config['grad_sync']} sync)" if config.get("fsdp") else ""
            print(f"{config['backend']}: micro-batch {config['micro_batch_size']} × {config['grad_accum_steps']} "
                  f"accumulation steps × {config['num_processes']} process(es){sharded} = effective batch "
                  f"{event['effective_batch']}; {self.total} optimizer steps on {event['device']}")
            for note in event.get("notes") or []:
                print(f"note: {note}")
        elif kind == events.STEP:
            line = (f"step {event['step']:>5}/{self.total}  loss {event['loss']:.4f}  lr {event['lr']:.2e}  "
                    f"{event['samples_per_s']:.0f} samples/s")
            print(f"\r{line}", end="", flush=True) if self.tty else (
                print(line, flush=True) if event["step"] % 10 == 0 or event["step"] == self.total else None)
        elif kind == events.EVAL:
            if event.get("eval_mrr_at_10") is not None:
                scores = f"MRR@10 {event['eval_mrr_at_10']:.4f}  recall@1 {event['eval_recall_at_1']:.4f}"
            elif event.get("eval_perplexity") is not None:
                scores = (f"perplexity {event['eval_perplexity']:.2f}  "
                          f"next-token accuracy {event['eval_next_token_accuracy']:.4f}")
            else:
                scores = f"accuracy {event['eval_accuracy']:.4f}  F1 {event['eval_f1']:.4f}"
            print(f"{chr(10) if self.tty else ''}epoch {event['epoch']}: eval loss {event['eval_loss']:.4f}  {scores}",
                  flush=True)
        elif kind == events.RUN_ENDED:
            if event["status"] == events.FAILED and event.get("field"):
                return  # bad input: the one error line on stderr says it, in the flag's words
            print(f"{event['status']} after {event['steps']} optimizer steps in {event['wall_s']:.1f} s"
                  + (f": {event['reason']}" if event["reason"] else ""))
            for warning in event.get("warnings") or []:
                print(f"warning: {warning}")
