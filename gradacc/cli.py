"""``python -m gradacc``: the engine headless.

    train   one run; progress and a summary, or JSON events (one per line) with --json
    check   the gradient-equivalence errors, naive vs exact
    audit   what a stock 🤗 Trainer's accumulation gets wrong on a model (gradacc.audit's verdict)
    compare the headline of two runs from their --metrics-out files
    export-html  a demo or runs as one self-contained web page that replays them (offline; a static Space)
    bench   benchmark suites (see gradacc.bench)
    app     the Streamlit app (what follows goes to ``streamlit run``, e.g. --server.port 8502)

``gradacc`` (the installed console script) is the same command.

Exit codes: 0 success, 2 bad input (one ``error:`` line on stderr), 1 a run that failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

from gradacc import events, paths
from gradacc.config import (BACKENDS, CONTRASTIVE, LOSS_NORMALIZATIONS, OPTIMIZERS, PITFALLS, PRECISIONS, TASKS,
                            RunConfig)
from gradacc.labels import in_cli_words
from gradacc.errors import GradaccError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (no usage dump), exit 2."""

    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _value(text: str):
    """A number as typed, or the text itself: RunConfig.validate refuses it in the flag's words
    ("--micro-batch-size must be a whole number ...; got 2.5."), where argparse would say "invalid int value"."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def build_parser() -> argparse.ArgumentParser:
    from gradacc import __version__

    parser = _Parser(prog="gradacc", description="See, and trust, gradient accumulation.")
    parser.add_argument("--version", action="version", version=f"gradacc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser("app", help="start the Streamlit app; other options go to streamlit run "
                                    "(e.g. --server.port 8502)")

    train = commands.add_parser("train", help="train one run")
    _add_run_options(train)
    recipe = "default: the model's recipe"
    train.add_argument("--epochs", type=_value, default=None, help=recipe)
    train.add_argument("--max-steps", type=_value, default=None, help="stop after this many optimizer steps")
    train.add_argument("--lr", type=_value, default=None, dest="learning_rate", help=recipe)
    train.add_argument("--warmup-ratio", type=_value, default=None, help=recipe)
    train.add_argument("--weight-decay", type=_value, default=RunConfig.weight_decay)
    train.add_argument("--max-grad-norm", type=_value, default=RunConfig.max_grad_norm, help="0 disables clipping")
    train.add_argument("--train-samples", type=_value, default=RunConfig.train_samples)
    train.add_argument("--eval-samples", type=_value, default=RunConfig.eval_samples)
    train.add_argument("--dropout", type=_value, default=None, help=recipe)
    train.add_argument("--trainer-library-default", action="store_true",
                       help="Trainer backend: keep Trainer's own loss scaling (k× too large on BERT in transformers 5)")
    train.add_argument("--pitfall", action="append", default=None, dest="pitfalls", metavar="NAME",
                       help="PyTorch loop only, repeatable: run one deliberately wrong line and say what it broke: "
                            + ", ".join(PITFALLS))
    train.add_argument("--memory-budget-mb", type=_value, default=None,
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

    plan = commands.add_parser("plan", help="measure every memory lever on a model and plan m and k for a budget")
    plan.add_argument("--model", default=RunConfig.model)
    plan.add_argument("--max-seq-length", type=_value, default=128)
    plan.add_argument("--memory-budget-mb", type=_value, required=True)
    plan.add_argument("--target-effective-batch", type=_value, required=True)
    plan.add_argument("--optimizer", choices=OPTIMIZERS, default=RunConfig.optimizer,
                      help="the optimizer the run will use: the pick keeps it (another needs its own learning rate)")
    plan.add_argument("--change-optimizer", action="store_true",
                      help="let the pick use another optimizer whose learning rate the model's recipe holds "
                           "(the pick says it: pass it as --lr)")
    plan.add_argument("--json", action="store_true")

    check = commands.add_parser("check", help="gradient equivalence: naive vs exact normalisation")
    _add_run_options(check)
    check.add_argument("--samples", type=int, default=None, help="examples in the window (default m×k×processes)")
    check.add_argument("--json", action="store_true")

    audit = commands.add_parser("audit", help="audit a stock 🤗 Trainer's first accumulated step on a model")
    audit.add_argument("--model", required=True, help="a folder written by save_pretrained, a hub id, or tiny-bert")
    audit.add_argument("--dataset", default=None,
                       help="builtin-sentiment, builtin-text (causal-lm), a CSV/JSONL file, a save_to_disk folder or "
                            "a hub id (default: builtin-text for a causal-lm model, else builtin-sentiment)")
    audit.add_argument("--task", choices=TASKS, default=None)
    audit.add_argument("--dataset-split", default=RunConfig.dataset_split, help="split of a hub dataset id")
    audit.add_argument("--text-column", default=None)
    audit.add_argument("--label-column", default=None)
    audit.add_argument("--micro-batch-size", "-m", type=_value, default=RunConfig.micro_batch_size)
    audit.add_argument("--grad-accum-steps", "-k", type=_value, default=RunConfig.grad_accum_steps)
    audit.add_argument("--max-seq-length", type=_value, default=None, help="default: the model's recipe")
    audit.add_argument("--seed", type=_value, default=RunConfig.seed)
    audit.add_argument("--json", action="store_true", help="the report as one JSON object")

    compare = commands.add_parser("compare", help="the headline of two runs from their --metrics-out event files")
    compare.add_argument("run_a", metavar="A.jsonl")
    compare.add_argument("run_b", metavar="B.jsonl", help="described against A (\"activations 4× smaller\")")
    compare.add_argument("--json", action="store_true", help="the figures as JSON keys, plus 'headline'")

    export = commands.add_parser("export-html", help="a demo (its last completed runs) or stored runs / --metrics-out "
                                                     "files as one self-contained HTML page replaying them")
    export.add_argument("sources", nargs="+", metavar="RUN_OR_DEMO",
                        help="a demo name, or run ids from this machine's store and --metrics-out files")
    export.add_argument("--out", required=True, help="the HTML file to write, e.g. demo.html")

    try:
        from gradacc import bench
    except ImportError:
        bench = None
    if bench is not None and hasattr(bench, "add_parser"):
        bench.add_parser(commands)
    return parser


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default=RunConfig.backend)
    parser.add_argument("--model", default=None,
                        help="tiny-bert, all-MiniLM-L6-v2, tiny-gpt, bow-batchnorm, bow-layernorm, a folder or a hub id "
                             "(default: tiny-bert; all-MiniLM-L6-v2 for --task contrastive)")
    parser.add_argument("--dataset", default=None,
                        help="builtin-sentiment, builtin-text (causal-lm), a CSV/JSONL file, a save_to_disk folder or "
                             "a hub id (default: builtin-text for a causal-lm run, else builtin-sentiment)")
    parser.add_argument("--task", choices=TASKS, default=None,
                        help="default: the model's (a *ForCausalLM model or tiny-gpt means causal-lm); contrastive: "
                             "a sentence-transformers model on builtin-pairs with in-batch negatives")
    parser.add_argument("--gradcache-mini-batch", type=_value, default=None,
                        help="contrastive only: CachedMultipleNegativesRankingLoss (GradCache) with mini-batches of "
                             "this many texts (default: MultipleNegativesRankingLoss on each micro-batch)")
    parser.add_argument("--dataset-split", default=RunConfig.dataset_split, help="split of a hub dataset id")
    parser.add_argument("--text-column", default=None)
    parser.add_argument("--label-column", default=None)
    parser.add_argument("--micro-batch-size", "-m", type=_value, default=RunConfig.micro_batch_size)
    parser.add_argument("--grad-accum-steps", "-k", type=_value, default=RunConfig.grad_accum_steps)
    parser.add_argument("--loss-normalization", choices=LOSS_NORMALIZATIONS, default=RunConfig.loss_normalization)
    parser.add_argument("--seed", type=_value, default=RunConfig.seed)
    parser.add_argument("--max-seq-length", type=_value, default=None, help="default: the model's recipe")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in backward instead of keeping them (use_reentrant=False)")
    parser.add_argument("--precision", choices=PRECISIONS, default=RunConfig.precision,
                        help="autocast precision: bf16 also on CPU; fp16 only on CUDA (with a grad scaler)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default=RunConfig.optimizer,
                        help="adamw-fused where torch fuses it on the device; adamw-8bit needs bitsandbytes and CUDA")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run's config; ``num_processes`` is always the launch's (accelerate launch / torchrun set it)."""
    from gradacc.training import distributed

    warning = distributed.launch_warning()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if getattr(args, "config_file", None):
        try:
            with open(args.config_file, encoding="utf-8") as file:
                values = json.load(file)
        except (OSError, ValueError) as error:
            raise GradaccError(f"Could not read the config file {args.config_file!r}: {error}", "config") from None
    else:
        values = {k: v for k, v in vars(args).items() if v is not None or k in ("max_steps",)}
        if values.get("task") == CONTRASTIVE and "model" not in values:
            values["model"] = "all-MiniLM-L6-v2"  # a sentence-transformers model, trained this way
        if "dataset" not in values:
            values["dataset"] = default_dataset(RunConfig.from_dict(values))
    return RunConfig.from_dict(values).replace(num_processes=distributed.world_size())


def default_dataset(config: RunConfig) -> str:
    """A language model's run without --dataset trains on builtin-text, a classifier's on builtin-sentiment."""
    from gradacc.config import BUILTIN_MODEL_TASKS, CAUSAL_LM

    if config.task == CONTRASTIVE:
        return "builtin-pairs"
    task = config.task or BUILTIN_MODEL_TASKS.get(config.model)
    if task is None:  # a folder: read its architecture (cheap, no torch)
        from gradacc.training.sources.models import infer_task

        task = infer_task(config)
    return "builtin-text" if task == CAUSAL_LM else "builtin-sentiment"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "app":
        return _app(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from gradacc.training import distributed

    if distributed.world_size() > 1:  # a rank of accelerate launch / torchrun: leave its process group at exit
        import atexit

        atexit.register(distributed.leave_process_group)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "plan":
            return _plan(args)
        if args.command == "check":
            return _check(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "export-html":
            return _export_html(args)
        if args.command == "audit":
            return _audit(args)
        return args.run(args)
    except GradaccError as error:
        print(f"error: {in_cli_words(error.message, error.field)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # e.g. `... --json | head`: the reader left; leave quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def _train(args) -> int:
    from gradacc.training import distributed
    from gradacc.training.engine import train
    from gradacc.training.options import RunOptions

    from gradacc.export.trackers import parse_report_to

    parse_report_to(args.report_to)  # a misspelt tracker fails here, before torch is imported
    config = config_from_args(args).validate()
    limits = _apply_limits(config)
    writes = distributed.is_main_process()  # only rank 0 prints and writes events
    metrics_file = open(args.metrics_out, "w", encoding="utf-8") if args.metrics_out and writes else None
    show = _print_json if args.json else _Progress()

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
                         max_run_memory_mb=limits.max_run_memory_mb if limits else None)
    try:
        ended = train(config, on_event, stop, options)
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
        _say_where_trackers_wrote(args, options.run_id)
    return EXIT_OK


def _say_where_trackers_wrote(args, run_id: str) -> None:
    """On stderr: stdout may be the JSON event stream."""
    from gradacc.export import trackers

    names = trackers.parse_report_to(args.report_to)
    if "tensorboard" in names:
        log_dir = args.log_dir or trackers.DEFAULT_LOG_DIR
        print(f"TensorBoard: {log_dir}/{run_id}/ (tensorboard --logdir {log_dir})", file=sys.stderr)
    if "trackio" in names:
        where = f"TRACKIO_DIR={args.log_dir} " if args.log_dir else ""
        print(f"Trackio: run {run_id} in project {trackers.TRACKIO_PROJECT} "
              f"({where}trackio show --project {trackers.TRACKIO_PROJECT})", file=sys.stderr)


def _app(streamlit_options: list[str]) -> int:
    """Become ``streamlit run``: Ctrl-C and a container's SIGTERM then reach the server itself."""
    import os

    from gradacc.app.command import streamlit_command

    command = streamlit_command(streamlit_options)
    sys.stdout.flush()
    os.execv(command[0], command)
    return EXIT_FAILED  # not reached


def _apply_limits(config: RunConfig):
    try:
        from gradacc.serving.limits import Limits
    except ImportError:
        return None
    limits = Limits.from_env()
    limits.check(config)
    return limits


def _print_json(event: dict) -> None:
    print(events.to_json(event), flush=True)


class _Progress:
    """A one-line progress display and a short summary, for people at a terminal."""

    def __init__(self):
        self.total = 0
        self.tty = sys.stdout.isatty()

    def __call__(self, event: dict) -> None:
        kind = event["event"]
        if kind == events.RUN_STARTED:
            self.total = event["total_steps"]
            config = event["config"]
            print(f"{config['backend']}: micro-batch {config['micro_batch_size']} × {config['grad_accum_steps']} "
                  f"accumulation steps × {config['num_processes']} process(es) = effective batch "
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


def _print_contrastive_check(report: dict) -> int:
    from gradacc.analysis.contrastive import WAY_NAMES, explanation
    from gradacc.units import format_bytes

    print(f"{report['backend']}, {report['model']}: in-batch negatives at effective batch {report['effective_batch']}; "
          "relative error of each way's gradient against the batch's, and its activations")
    print(f"{'way':<50}{'m':>5}{'k':>5}{'mini':>6}{'rel. error':>12}{'activations':>14}")
    for name, way in report["ways"].items():
        mini = way["gradcache_mini_batch"] or "-"
        shown = format_bytes(way["activation_bytes"]) if way["activation_bytes"] is not None else "-"
        print(f"{WAY_NAMES[name]:<50}{way['micro_batch_size']:>5}{way['grad_accum_steps']:>5}{mini!s:>6}"
              f"{way['rel_error']:>12.2e}{shown:>14}")
    for sentence in explanation(report):
        print(sentence)
    return EXIT_OK


def _compare(args) -> int:
    from gradacc.analysis import headline

    figures = headline.headline(events.read_events(args.run_a), events.read_events(args.run_b))
    if args.json:
        print(json.dumps(figures))
    else:  # the headline says B's values first: name the files in that order
        print(figures["headline"])
        print(f"({Path(args.run_b).name} against {Path(args.run_a).name})")
    return EXIT_OK


def _export_html(args) -> int:
    from pathlib import Path

    from gradacc.app import web_page
    from gradacc.serving.store import RunStore

    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise GradaccError(f"--out {args.out!r} must be a file in a folder that exists.")
    title, runs, scenario, compares = web_page.resolve(args.sources, RunStore())
    page = web_page.demo_page(scenario, runs) if scenario else web_page.page_html(title, runs, compares=compares)
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as error:
        raise GradaccError(f"--out {args.out!r} could not be written: {error.strerror or error}.") from None
    print(f"Wrote {out} ({len(page) / 1e6:.1f} MB): {title}, {len(runs)} runs; open it in any browser, no network "
          "needed.")
    return EXIT_OK


def _plan(args) -> int:
    from gradacc.analysis import planner
    from gradacc.units import format_bytes

    RunConfig(model=args.model, max_seq_length=args.max_seq_length).validate()
    if isinstance(args.memory_budget_mb, str):
        raise GradaccError(f"--memory-budget-mb must be a number; got {args.memory_budget_mb!r}.")
    planner.check_plan_inputs(float(args.memory_budget_mb), args.target_effective_batch)  # before measuring
    result = planner.plan_levers(planner.measure_levers(args.model, args.max_seq_length), float(args.memory_budget_mb),
                                 args.target_effective_batch)
    top = planner.pick(result, args.optimizer, args.change_optimizer, model=args.model)
    if args.json:
        print(json.dumps(result | {"pick": top}, default=str))
        return EXIT_OK
    print(f"{args.model} at {args.max_seq_length} tokens, budget {result['budget_mb']:g} MB, effective batch "
          f"{result['target_effective_batch']}; fastest first (seconds per example from a short timed run)")
    print(f"{'checkpointing':<14}{'precision':<10}{'optimizer':<11}{'m':>6}{'k':>6}{'peak':>11}{'static':>11}"
          f"{'ms/example':>12}")
    for row in result["rows"]:
        print(f"{'on' if row['gradient_checkpointing'] else 'off':<14}{row['precision']:<10}{row['optimizer']:<11}"
              f"{row['micro_batch_size'] or '—':>6}{row['grad_accum_steps'] or '—':>6}"
              f"{format_bytes(row['predicted_peak_bytes']):>11}{format_bytes(row['static_bytes']):>11}"
              f"{row['seconds_per_example'] * 1000:>12.2f}")
    for name in ("fastest", "cheapest_memory"):
        row = result[name]
        if row is not None:
            print(f"{name.replace('_', ' ')}: {planner.setting_label(row)}, m={row['micro_batch_size']}, "
                  f"k={row['grad_accum_steps']}")
    if top is not None:
        row = top["row"]
        print(f"pick: {planner.setting_label(row)}, m={row['micro_batch_size']}, k={row['grad_accum_steps']}. "
              f"{top['why']}")
        if top["learning_rate"] is not None:  # another optimizer: the run takes its flags and its own rate
            print(f"train it with: --optimizer {row['optimizer']} --lr {top['learning_rate']:g}")
    elif result["fastest"] is not None:
        unrated = planner.unrated_optimizers(result, args.optimizer, args.model)
        if args.change_optimizer and unrated:
            print(f"pick: nothing with {args.optimizer} fits; {' and '.join(unrated)} would, but {args.model}'s "
                  "recipe has no learning rate measured for it: give --lr yourself if you run one")
        else:
            print(f"pick: nothing with {args.optimizer} fits"
                  + ("" if args.change_optimizer else "; --change-optimizer lets the pick use another one"))
    if result["reason"]:
        print(in_cli_words(result["reason"], "budget_mb"))  # the page's label, the flag here
    print(f"activation line checked on a micro-batch of {planner.HELD_OUT_SIZE} it was not fitted on: largest error "
          f"{result['largest_held_out_error']:+.2%}")
    return EXIT_OK if result["fastest"] else EXIT_FAILED


def _audit(args) -> int:
    from gradacc.training.audit import audit_stock_trainer

    from gradacc.training import distributed

    report = audit_stock_trainer(config_from_args(args), confinement=paths.TRUST_USER)  # the user's own folders
    if not distributed.is_main_process():  # under accelerate launch / torchrun every rank audits; rank 0 says it
        return EXIT_OK
    print(json.dumps(report, default=str) if args.json else report["line"])
    return EXIT_OK


def _check(args) -> int:
    from gradacc.analysis import equivalence
    from gradacc.training import distributed

    config = config_from_args(args)  # under accelerate launch / torchrun: the check runs on every rank
    # The command line trusts its user: a model folder anywhere they can read (the app confines its visitors).
    report = equivalence.check(config, samples=args.samples, confinement=paths.TRUST_USER)
    if not distributed.is_main_process():
        return EXIT_OK
    if args.json:
        print(json.dumps(report))
        return EXIT_OK
    if report.get("task") == CONTRASTIVE:
        return _print_contrastive_check(report)
    processes = report["num_processes"]
    print(f"{report['backend']}: micro-batch {report['micro_batch_size']}, k={report['grad_accum_steps']}"
          + (f", {processes} processes" if processes > 1 else "")
          + "; relative error of the accumulated gradient against the full-batch gradient")
    print(f"{'case':<20}{'items per micro-batch':<26}{'naive':>11}{'exact':>11}")
    for case, result in report["cases"].items():
        items = ",".join(str(i) for i in result["micro_batch_items"])
        print(f"{case:<20}{items:<26}{result['naive_rel_error']:>11.2e}{result['exact_rel_error']:>11.2e}"
              + (f"   library default {result['library_default_rel_error']:.2e}"
                 if "library_default_rel_error" in result else ""))
    if processes > 1:
        rounds = report["sync_rounds"]
        print(f"gradient all-reduces per optimizer step (steps 1, 2; k={report['grad_accum_steps']}): "
              f"{', '.join(map(str, rounds['no_sync']))} with no_sync, "
              f"{', '.join(map(str, rounds['without_no_sync']))} without; exact error "
              f"{rounds['no_sync_rel_error']:.2e} and {rounds['without_no_sync_rel_error']:.2e}")
        print("(DDP all-reduces every gradient in one bucket until its first sync, then rebuilds its buckets)")
    if "by_micro_batch" in report:
        print(f"{report['model']}, exact normalisation, the same effective batch "
              f"{report['micro_batch_size'] * report['grad_accum_steps']} split into micro-batches of m:")
        for row in report["by_micro_batch"]:
            print(f"  m={row['micro_batch_size']:<4} k={row['grad_accum_steps']:<4} relative error {row['rel_error']:.2e}")
        if report["model"] == "bow-batchnorm":
            print("BatchNorm normalises with each micro-batch's own statistics: accumulation is not the big batch "
                  "(k=1 is the big batch itself).")
    return EXIT_OK
