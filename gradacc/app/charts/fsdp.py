"""The charts of sharded (FSDP) runs, from their step events' ``sharding`` figures (what each rank measured): the
gradient bytes each rank held and the gradient bytes it sent per window, side by side, one bar per rank of each
run; a run without them draws nothing."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradacc import events as ev
from gradacc.app.charts.style import TEXT_SIZE, as_runs, empty_figure, of_kind, run_color, styled
from gradacc.units import MB

TITLE = "Per rank, each window: gradients held and sent"
PANELS = (("grad_bytes", "Gradient memory held (MB)"), ("grad_comm_bytes", "Gradients sent per window (MB)"))


def latest_sharding(events: list[dict]) -> dict | None:
    """The last step's per-rank figures; None for a run that is not sharded (or has not stepped)."""
    steps = [s for s in of_kind(events, ev.STEP) if s.get("sharding")]
    return steps[-1]["sharding"] if steps else None


def has_sharding(runs) -> bool:
    return any(latest_sharding(events) for _, events in as_runs(runs))


def sharding_figure(runs, title: str = TITLE) -> go.Figure:
    """Two panels, gradient bytes held (the most after a backward: the shard, or the unsharded gradients of a
    per-window sync) and gradient bytes handed to reduce-scatter per window; per run, one bar per rank, labelled
    with its value, from the run's latest step."""
    drawn = [(label, figures) for label, events in as_runs(runs) if (figures := latest_sharding(events))]
    if not drawn:
        return empty_figure(title, "", "MB", "No sharded steps yet")
    figure = styled(make_subplots(rows=1, cols=2, subplot_titles=[name for _, name in PANELS],
                                  horizontal_spacing=0.12), title, "", "")
    for index, (label, figures) in enumerate(drawn):
        ranks = [f"rank {rank}" for rank in range(len(figures["grad_bytes"]))]
        for column, (field, _) in enumerate(PANELS, start=1):
            values = [value / MB for value in figures[field]]
            figure.add_trace(go.Bar(x=ranks, y=values, name=f"{label} ({figures['grad_sync']})",
                                    legendgroup=label, showlegend=column == 1, marker_color=run_color(index),
                                    text=[f"{value:.2f}" for value in values], textposition="outside",
                                    hovertemplate="%{x}: %{y:.3f} MB<extra>" + label + "</extra>"),
                             row=1, col=column)
    figure.update_layout(barmode="group", hovermode="closest", legend=dict(orientation="h", y=-0.15))
    figure.update_annotations(font_size=TEXT_SIZE)
    return figure
