"""What an equivalence check's numbers mean, for the Equivalence page: rows for the chart, a table, sentences.

The checks themselves run in ``gradacc.serving.checks``.
"""

from __future__ import annotations

import json
from pathlib import Path

# The module, not its names: this module has an explanation() of its own (the equivalence check's).
from gradacc.analysis import contrastive
from gradacc.analysis.equivalence import EXACT_LIMIT, library_default_verdict
from gradacc.analysis.equivalence import rows as report_rows  # light: torch is imported only inside check()
from gradacc.training.audit.vocabulary import words  # no torch: the page paints before it loads
from gradacc.training.tasks import task_named

EXACT_LOOKS_LIKE = EXACT_LIMIT  # float32 rounding of a sum of micro-batch gradients stays well below this
# `python -m gradacc bench families`' rows (see gradacc.bench.families.PAGE_TABLE): measured, not computed here.
FAMILY_TABLE = Path(__file__).with_name("trainer_default_by_family.json")
# gradacc.audit with the family's dropout on, where accumulation is right: bench.families.AUDIT_WAYS' verdicts. The
# header is short: at 1280×720 the long one pushed the table past the page, and the last column was cut. Its whole
# meaning is in AUDIT_HELP (the header's tooltip) and the caption.
AUDIT_COLUMN = "audit, dropout on"
AUDIT_HELP = ("gradacc's audit on the same model with its dropout at 0.1: a Trainer with the fix / the Accelerate "
              "recipe. Accumulation is right there, so anything but exact would be a false alarm.")
AUDIT_WAYS = ("audit_trainer_fixed", "audit_accelerate_recipe")
# Which data and collator the family table used, and why the Audit page finds a causal LM miscounted where the table
# says "right": both are measured; they differ in the first label of each text (gradacc.analysis.stock_audit).
FAMILY_DATA = ("The data and batches are gradacc's own (builtin-sentiment; builtin-text for the causal LMs), and "
               "gradacc sets each text's first label to -100 (the first token predicts nothing), so Trainer's count "
               "of labels, num_items_in_batch, is the tokens the loss predicts. A stock Trainer batched by 🤗's "
               "DataCollatorForLanguageModeling keeps that first label, and on a GPT-2-style model Trainer counts "
               "it: the Audit page trains that stock Trainer and finds the items miscounted, one per text too many.")
CASE_NAMES = {"equal_windows": "equal windows", "short_last_window": "short last window",
              "token_level": "token-level loss", "language_model": "language model (tiny-gpt)"}

def coupled_summary(reports: list[dict]) -> tuple[list[str], list[dict]]:
    """Sentences and one table for the coupled checks (``checks.coupled_check_configs``): each way or model,
    its m and k, and its gradient's relative error against the big batch."""
    sentences, table_rows = [], []
    for report in reports:
        if task_named(report.get("task")).in_batch_negatives:
            sentences += contrastive.explanation(report)
            for name, way in report["ways"].items():
                if name == "batch":
                    continue
                activations = way.get("activation_bytes")
                table_rows.append({"what": contrastive.WAY_NAMES[name], "m": way["micro_batch_size"],
                                   "k": way["grad_accum_steps"],
                                   "relative error": way["rel_error"],
                                   "activations (MB)": NOT_MEASURED if activations is None else f"{activations / 1e6:.1f}"})
        elif "by_micro_batch" in report:
            by_m = report["by_micro_batch"]
            worst = max(row["rel_error"] for row in by_m)
            if report["model"] == "bow-batchnorm":
                sentences.append(f"BatchNorm: up to {worst:.0%} off at the same effective batch, the more the smaller m "
                                 "(each micro-batch normalises with its own mean and variance).")
            else:
                sentences.append(f"LayerNorm: at most {worst:.1e} off for every m: it normalises each example alone.")
            table_rows += [{"what": report["model"], "m": row["micro_batch_size"], "k": row["grad_accum_steps"],
                            "relative error": row["rel_error"], "activations (MB)": NOT_MEASURED} for row in by_m]
    return sentences, table_rows


# A cell of the coupled table that the check does not measure (the norms' activations): a dash, not "None".
NOT_MEASURED = "—"


def coupled_columns(rows: list[dict]) -> list[str]:
    """The coupled table's columns, without one that no row measured."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    return [column for column in columns if any(row.get(column) != NOT_MEASURED for row in rows)]


def rows(report: dict) -> list[dict]:
    """(case, normalization, rel_error) rows for the chart, with readable case names."""
    return [{**row, "case": CASE_NAMES.get(row["case"], row["case"])} for row in report_rows(report)]


def table(report: dict) -> list[dict]:
    """One row per case: items per micro-batch and each normalisation's relative error."""
    out = []
    for case, result in report["cases"].items():
        row = {"case": CASE_NAMES.get(case, case),
               "items per micro-batch": ", ".join(str(i) for i in result.get("micro_batch_items", [])),
               "naive": result.get("naive_rel_error"), "exact": result.get("exact_rel_error")}
        if "library_default_rel_error" in result:
            row["Trainer library default"] = result["library_default_rel_error"]
        out.append(row)
    return out


def explanation(report: dict) -> list[str]:
    """Plain sentences: exact matches the full batch; where naive is off and by how much; Trainer's default."""
    cases = report["cases"]
    k = report["grad_accum_steps"]
    sentences = []
    worst_exact = max(result["exact_rel_error"] for result in cases.values())
    if worst_exact <= EXACT_LOOKS_LIKE:
        sentences.append(f"Exact normalisation: every relative error is at most {worst_exact:.1e}, float32 rounding. "
                         "Accumulating these micro-batches gives the full-batch gradient.")
    else:
        sentences.append(f"Exact normalisation is off by up to {worst_exact:.1e}: more than rounding. "
                         "Something in this backend changes the gradient.")
    naive_off = {case: result["naive_rel_error"] for case, result in cases.items()
                 if result["naive_rel_error"] > EXACT_LOOKS_LIKE}
    equal = cases.get("equal_windows")
    if equal is not None and equal["naive_rel_error"] <= EXACT_LOOKS_LIKE:
        sentences.append("Naive (each micro-batch mean ÷ k) is right only when every window holds m × k examples "
                         "of equal weight.")
    if naive_off:
        parts = [f"{error:.0%} off with a {CASE_NAMES.get(case, case)}" for case, error in naive_off.items()]
        sentences.append("Naive is " + " and ".join(parts) + ": the epoch's short last window and token-level "
                         "losses give micro-batches unequal weight, which ÷ k ignores.")
    language_model = cases.get("language_model")
    if language_model is not None and "library_default_rel_error" in language_model:
        error = language_model["library_default_rel_error"]
        verdict = ("matches the full-batch gradient: GPT-2 forwards **kwargs to its loss, so num_items_in_batch "
                   "reaches it" if error <= EXACT_LOOKS_LIKE else f"is {error:.0%} off")
        sentences.append(f"On the language model, Trainer's library default {verdict}.")
    if equal is not None and "library_default_rel_error" in equal:
        error = equal["library_default_rel_error"]
        if error > EXACT_LOOKS_LIKE:
            sentences.append(f"Trainer's library default (no compute_loss_func) is {error:.0%} off even with equal "
                             f"windows: about {1 + error:.1f}× the full-batch gradient with k = {k}. In transformers 5 "
                             "Trainer skips its own ÷ k for models whose forward takes **kwargs (BERT does); gradacc "
                             "passes a compute_loss_func that fixes it.")
        else:
            sentences.append("Trainer's library default matches the full-batch gradient with equal windows here.")
    return sentences


def family_table() -> tuple[str, list[dict]]:
    """"Trainer's default, by model family": a caption saying where the numbers come from, and one row per family
    (exact, naive and Trainer's library default errors, and the default's verdict)."""
    table = json.loads(FAMILY_TABLE.read_text(encoding="utf-8"))
    settings = table["settings"]
    k = settings["grad_accum_steps"]
    caption = (f"Measured by `{table['made_by']}` with transformers {settings['transformers']}: a tiny random model "
               f"of each family written with save_pretrained, checked on the Trainer backend with m = "
               f"{settings['micro_batch_size']}, k = {k}, equal windows (dropout set to 0 on every family). Trainer's "
               "library default skips its own ÷ k for a model whose forward takes **kwargs: a causal LM's loss "
               "uses num_items_in_batch and comes out right on this data, a classifier head ignores it and gets k× "
               f"the gradient. {FAMILY_DATA} The last column: gradacc's audit on the same model with its dropout at "
               "0.1, where accumulation is right (a Trainer with the fix, the Accelerate recipe): anything but exact "
               "would be a false alarm.")
    rows = []
    for row in table["rows"]:
        if "exact" in row:
            rows.append({"family": row["family"], "kind": row["kind"], "exact": row["exact"], "naive": row["naive"],
                         "Trainer library default": row["library_default"],
                         "Trainer's default": library_default_verdict(row["library_default"], k),
                         AUDIT_COLUMN: " / ".join(words(row[way]) if way in row else "-" for way in AUDIT_WAYS)})
        else:
            rows.append({"family": row["family"], "kind": row["kind"], "exact": None, "naive": None,
                         "Trainer library default": None,
                         "Trainer's default": f"not checked: {row.get('refused') or row.get('failed')}",
                         AUDIT_COLUMN: "-"})
    return caption, rows
