"""Plotly figures from the event stream, by idea: ``cache`` (one build for every watcher), ``style`` (how every chart
looks), ``runs`` (loss, evaluation and memory of one run or several), ``checks`` (the memory plan, the equivalence
check), ``demos`` (the figures that show a demo's claim). The pages draw the names below."""

from gradacc.app.charts.cache import MAX_POINTS, FigureCache, FrozenFigure, freeze, thin
from gradacc.app.charts.checks import LOG_FLOOR, equivalence_figure, memory_plan_figure
from gradacc.app.charts.demos import gradient_scale_figure, loss_difference_figure
from gradacc.app.charts.fsdp import sharding_figure
from gradacc.app.charts.runs import eval_figure, loss_figure, memory_breakdown_figure, memory_figure
from gradacc.app.charts.style import TITLE_CHARS, WIDE_TITLE_CHARS, X_TITLES, fit_legend, unwrap, wrap

__all__ = ["FigureCache", "FrozenFigure", "LOG_FLOOR", "MAX_POINTS", "TITLE_CHARS", "WIDE_TITLE_CHARS",
           "X_TITLES", "equivalence_figure", "eval_figure", "fit_legend", "freeze", "gradient_scale_figure", "loss_difference_figure",
           "loss_figure", "memory_breakdown_figure", "memory_figure", "memory_plan_figure", "sharding_figure", "thin", "unwrap", "wrap"]
