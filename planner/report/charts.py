"""The report's charts as plotly figures: the plan's timeline, memory per pipeline rank,
activation memory over the step, the step-time breakdown, and the sweep's best plan per
value. Each function returns a `plotly.graph_objects.Figure`; `figure_json` and `figure_svg`
turn one into what a page embeds or a static SVG."""

from __future__ import annotations

import math

from planner.plan import time_part_name
from planner.report import require_plotly
from planner.report.data import PlanFigures
from planner.units import GiB

KIND_STYLE = {
    "idle": ("idle", "#e6e6e6"),
    "F": ("F forward", "#4c78a8"),
    "B": ("B full backward", "#f58518"),
    "I": ("I input-grad backward", "#e45756"),
    "W": ("W weight-grad backward", "#72b7b2"),
    "recv": ("send/recv (pipeline p2p)", "#222222"),
    "dp": ("DP communication exposed", "#b279a2"),
    "step": ("grad norm + optimizer", "#9d755d"),
}
"""Legend name and colour of each kind of timeline bar, in drawing order."""
MEMORY_PARTS = (
    ("weights", "#4c78a8"),
    ("grads", "#f58518"),
    ("optimizer", "#54a24b"),
    ("activations", "#e45756"),
    ("other", "#bab0ac"),
)
THIN_KINDS = {"recv": 0.25}
"""Bar heights (in rows) of the kinds drawn as a thin strip over the compute row."""
MS = 1e3
FONT = dict(family="Helvetica, Arial, sans-serif", size=12)


def _go():
    require_plotly()
    import plotly.graph_objects as go

    return go


def _layout(title: str, **extra) -> dict:
    return dict(
        title=dict(text=title, x=0, xref="paper", xanchor="left"),
        font=FONT,
        template="plotly_white",
        margin=dict(l=70, r=30, t=60, b=50),
        **extra,
    )


def rank_label(rank: int) -> str:
    """The timeline's row name of a pipeline rank."""
    return f"rank {rank}"


def timeline_figure(figures: PlanFigures, title: str):
    """Every action of the simulated step on its pipeline rank's row, in ms, with the
    transfers, idle gaps and the step's tail; hover names the action, its chunk and layers."""
    go = _go()
    fig = go.Figure()
    pp = 1 + max(bar.rank for bar in figures.bars)
    for kind, (name, colour) in KIND_STYLE.items():
        bars = [b for b in figures.bars if b.kind == kind]
        if not bars:
            continue
        fig.add_trace(
            go.Bar(
                name=name,
                orientation="h",
                marker=dict(color=colour, line=dict(width=0)),
                y=[rank_label(b.rank) for b in bars],
                base=[b.start_s * MS for b in bars],
                x=[(b.end_s - b.start_s) * MS for b in bars],
                width=THIN_KINDS.get(kind, 0.8),
                customdata=[[b.label, b.start_s * MS, b.end_s * MS] for b in bars],
                hovertemplate="%{y}: %{customdata[0]}<br>%{customdata[1]:.3f} - %{customdata[2]:.3f} ms "
                "(%{x:.3f} ms)<extra></extra>",
            )
        )
    fig.update_layout(
        **_layout(
            title,
            barmode="overlay",
            height=200 + 34 * pp,
            bargap=0.1,
            legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"),
        )
    )
    fig.update_layout(margin=dict(b=110))
    fig.update_yaxes(categoryorder="array", categoryarray=[rank_label(r) for r in reversed(range(pp))])
    fig.update_xaxes(title_text="time in the step (ms)", rangemode="tozero")
    return fig


def memory_figure(figures: PlanFigures, title: str):
    """Peak memory of every pipeline rank, stacked by what holds it, against the GPU's limit."""
    go = _go()
    memory = figures.prediction.memory
    ranks = [rank_label(r) for r in range(len(memory))]
    fig = go.Figure(
        [
            go.Bar(
                name=part,
                x=ranks,
                y=[getattr(m, part) / GiB for m in memory],
                marker_color=colour,
                hovertemplate=f"%{{x}} {part}: %{{y:.2f}} GiB<extra></extra>",
            )
            for part, colour in MEMORY_PARTS
        ]
    )
    limit = figures.memory_limit_bytes / GiB
    fig.add_hline(
        y=limit,
        line=dict(color="#d62728", dash="dash"),
        annotation_text=f"GPU limit {limit:.0f} GiB",
        annotation_position="top left",
    )
    fig.update_layout(**_layout(title, barmode="stack", height=380))
    fig.update_yaxes(title_text="GiB", rangemode="tozero", range=[0, limit * 1.1])
    return fig


def activation_figure(figures: PlanFigures, title: str):
    """Each pipeline rank's saved activations over the step (a step function, GiB)."""
    go = _go()
    fig = go.Figure(
        [
            go.Scatter(
                name=rank_label(r),
                x=[t * MS for t in times],
                y=[v / GiB for v in values],
                mode="lines",
                line_shape="hv",
                hovertemplate=f"{rank_label(r)}: %{{y:.2f}} GiB at %{{x:.2f}} ms<extra></extra>",
            )
            for r, (times, values) in enumerate(figures.activation_curves)
        ]
    )
    fig.update_layout(**_layout(title, height=340))
    fig.update_xaxes(title_text="time in the step (ms)", rangemode="tozero")
    fig.update_yaxes(title_text="saved activations (GiB)", rangemode="tozero")
    return fig


def breakdown_figure(time_breakdown_s: dict[str, float], title: str):
    """Where the step time goes: one bar per `time_breakdown_s` term, seconds and share."""
    go = _go()
    total = sum(time_breakdown_s.values()) or 1.0
    names = [time_part_name(name) for name in time_breakdown_s]
    seconds = list(time_breakdown_s.values())
    fig = go.Figure(
        go.Bar(
            x=seconds,
            y=names,
            orientation="h",
            marker_color="#4c78a8",
            text=[f"{s:.3f} s ({s / total:.1%})" for s in seconds],
            textposition="auto",
            hovertemplate="%{y}: %{x:.4f} s<extra></extra>",
        )
    )
    fig.update_layout(**_layout(title, height=120 + 28 * len(names)))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="seconds per step", rangemode="tozero")
    return fig


def sweep_figure(title: str, vary: str, values: list[int], points: list[dict | None], second: str):
    """The best plan per value: total tokens/s on top and `second` ("mfu" or "step") below,
    each point labelled with the layout that wins there; values without a plan are gaps."""
    go = _go()
    from plotly.subplots import make_subplots

    second_name = {"mfu": "MFU (%)", "step": "step time (s)"}[second]
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=("total tokens/s", second_name)
    )
    tokens = [p["tokens_per_s"] if p else None for p in points]
    other = [(p["mfu"] * 100 if second == "mfu" else p["step_time_s"]) if p else None for p in points]
    labels = [p["layout"] if p else "no plan" for p in points]
    fig.add_trace(
        go.Scatter(
            x=values,
            y=tokens,
            mode="lines+markers+text",
            text=labels,
            textposition="top center",
            textfont=dict(size=10),
            name="total tokens/s",
            line=dict(color="#4c78a8"),
            hovertemplate="%{x}: %{y:,.0f} tokens/s<br>%{text}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=values,
            y=other,
            mode="lines+markers",
            name=second_name,
            line=dict(color="#e45756"),
            text=labels,
            hovertemplate="%{x}: %{y:.3g}<br>%{text}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    axis = _x_axis(values)
    fig.update_xaxes(title_text=vary, row=2, col=1, **axis)
    fig.update_xaxes(row=1, col=1, **axis)
    known = [t for t in tokens if t is not None]
    fig.update_yaxes(range=[0, 1.2 * max(known, default=1.0)], tickformat="~s", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_layout(**_layout(title, height=560, showlegend=False))
    return fig


def _x_axis(values: list[int]) -> dict:
    """A log axis ticked at the values when they double or more from one to the next, else a
    linear one; padded so the end points' labels fit."""
    low, high = min(values), max(values)
    if _geometric(values):
        pad = 0.08 * (math.log10(high) - math.log10(low))
        return dict(
            type="log",
            tickvals=values,
            ticktext=[f"{v:,}" for v in values],
            range=[math.log10(low) - pad, math.log10(high) + pad],
        )
    pad = 0.08 * (high - low or 1)
    return dict(range=[low - pad, high + pad])


def _geometric(values: list[int]) -> bool:
    """Whether the values double (or more) from one to the next: drawn on a log axis."""
    ordered = sorted(values)
    return len(ordered) > 2 and all(b >= 2 * a for a, b in zip(ordered, ordered[1:]))


def figure_json(fig) -> str:
    """The figure as JSON, safe to place inside a <script> element."""
    import plotly.io

    return plotly.io.to_json(fig, validate=False).replace("</", "<\\/")


def figure_svg(fig, width: int = 900, height: int | None = None) -> str:
    """The figure as a static SVG document (kaleido renders it with a headless Chrome)."""
    from planner.report import INSTALL_HINT, MissingReportExtra

    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise MissingReportExtra(f"static images need kaleido: {INSTALL_HINT}") from None
    try:
        return fig.to_image(format="svg", width=width, height=height or fig.layout.height or 500).decode()
    except RuntimeError as exc:  # choreographer's ChromeNotFoundError / BrowserFailedError
        raise MissingReportExtra(
            f"static images need Chrome or Chromium for kaleido (e.g. `apt-get install "
            f"chromium`, or `kaleido_get_chrome`): {str(exc).splitlines()[0]}"
        ) from None


__all__ = [
    "KIND_STYLE",
    "activation_figure",
    "breakdown_figure",
    "figure_json",
    "figure_svg",
    "memory_figure",
    "sweep_figure",
    "timeline_figure",
]
