"""The shareable report of a plan or a sweep: one self-contained HTML page (plotly.js
inlined, nothing fetched at view time). Pure functions from values to HTML or SVG text;
only the CLI writes files. Plotting needs the optional `report` extra."""

from __future__ import annotations

from planner.errors import PlannerError

INSTALL_HINT = "pip install 'planner[report]'"


class MissingReportExtra(PlannerError):
    """The report's plotting library is not installed."""


def require_plotly():
    """The plotly module, or MissingReportExtra naming what to install."""
    try:
        import plotly
    except ImportError:
        raise MissingReportExtra(f"reports need plotly: {INSTALL_HINT}") from None
    return plotly
