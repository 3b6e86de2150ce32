"""The chart of `planner sweep --svg` and `--report`: the best plan per value of the varied
input, drawn with plotly (planner/report/charts.py). Two series that do not say the same
thing: total tokens/s, and below it MFU when the GPU count varies (the scaling efficiency)
or the step time otherwise (with a fixed GPU count MFU is proportional to tokens/s)."""

from __future__ import annotations

from planner.layout import Layout
from planner.report.html import Table

SECOND_SERIES = {"gpus": "mfu", "global-batch": "step", "seq": "step"}


def layout_label(layout: Layout) -> str:
    """The winning layout in a few words, e.g. 'tp8 pp4 dp32 1f1b' or 'tp4 pp8 dp8 cp2 zbv V2'."""
    return (
        f"tp{layout.tp} pp{layout.pp} dp{layout.dp}{f' cp{layout.cp}' if layout.cp > 1 else ''} "
        f"{layout.schedule}{f' V{layout.vpp}' if layout.vpp > 1 else ''}"
    )


def chart_points(rows) -> list[dict | None]:
    """Per sweep row (value, job, best, entry, note), what the chart plots (None: no plan)."""
    return [
        None
        if best is None
        else {
            "tokens_per_s": best.prediction.tokens_per_s,
            "mfu": best.prediction.mfu,
            "step_time_s": best.prediction.step_time_s,
            "layout": layout_label(best.layout),
        }
        for _, _, best, _, _ in rows
    ]


def sweep_svg(title: str, vary: str, values: list[int], points: list[dict | None]) -> str:
    """The chart as a static SVG document."""
    from planner.report.charts import figure_svg, sweep_figure

    return figure_svg(sweep_figure(title, vary, values, points, SECOND_SERIES[vary]))


def sweep_html(title: str, vary: str, values: list[int], points: list[dict | None], table: Table) -> str:
    """The sweep's report page: the chart and the table."""
    from planner.report.pages import sweep_page

    return sweep_page(title, vary, values, points, SECOND_SERIES[vary], table)
