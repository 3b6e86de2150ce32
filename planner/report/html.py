"""The report pages: self-contained HTML (styles and plotly.js inlined, no network at view
time). `plan_page` and `sweep_page` take values and return the page's text. After the
charts have rendered the page sets `data-charts-rendered` on <body> to their count; a script
error sets `data-script-error` (what the browser test reads from the DOM)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from html import escape

from planner.report import require_plotly
from planner.report.charts import figure_json

STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
tr.best td { background: #eef5ff; font-weight: bold; }
code, pre { background: #f6f6f6; font-size: 12px; } pre { padding: 8px; overflow-x: auto; }
.chart { width: 100%; } .note { color: #666; font-size: 12px; }
"""
RENDER_SCRIPT = """
window.addEventListener('error', function (e) {
  document.body.setAttribute('data-script-error', String(e.message || e));
});
(function () {
  var figures = %s;
  var config = {responsive: true, scrollZoom: true, displaylogo: false};
  var drawn = Object.keys(figures).map(function (id) {
    return Plotly.newPlot(id, figures[id].data, figures[id].layout, config);
  });
  Promise.all(drawn).then(function () {
    document.body.setAttribute('data-charts-rendered', String(drawn.length));
  }, function (err) {
    document.body.setAttribute('data-script-error', String(err));
  });
})();
"""


@dataclass(frozen=True, slots=True)
class Table:
    """A table for the page: header cells, rows of cells, which columns are text (left
    aligned), which row to highlight (-1: none), and per row the cells' titles by column (what
    hovering a cell shows)."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    text_columns: frozenset[str] = frozenset()
    highlight: int = -1
    titles: tuple[dict[str, str], ...] = ()


BREAK_AFTER = re.compile(r"([,|])(?=\S)")
"""Where a text cell may wrap: after a comma or bar that a word follows ('2,3×26,2')."""


def cell_text(value: str, text: bool) -> str:
    """A cell's escaped text; in a text cell a line may break after each comma or bar (<wbr>)."""
    escaped = escape(value)
    return BREAK_AFTER.sub(r"\1<wbr>", escaped) if text else escaped


def table_html(table: Table, element_id: str = "") -> str:
    """The table as an HTML <table> (with the id `element_id`), every cell escaped."""

    def cell(tag: str, column: str, value: str, title: str | None = None) -> str:
        text = column in table.text_columns
        attributes = (' class="text"' if text else "") + (f' title="{escape(title)}"' if title else "")
        return f"<{tag}{attributes}>{cell_text(value, text and tag == 'td')}</{tag}>"

    titles = table.titles or ({},) * len(table.rows)
    head = "".join(cell("th", c, c) for c in table.header)
    body = "".join(
        ("<tr class='best'>" if i == table.highlight else "<tr>")
        + "".join(cell("td", c, v, title.get(c)) for c, v in zip(table.header, row))
        + "</tr>"
        for i, (row, title) in enumerate(zip(table.rows, titles))
    )
    opening = f'<table id="{escape(element_id)}">' if element_id else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, sections: list[tuple[str, str]], figures: dict) -> str:
    """A whole page: a title, (heading, inner HTML) sections and the plotly figures to draw
    into the <div> of the same id (created by `chart_div`)."""
    plotly = require_plotly()
    from plotly.offline import get_plotlyjs

    body = "".join(f"<h2>{escape(heading)}</h2>\n{inner}\n" for heading, inner in sections)
    payload = "{" + ",".join(f"{json.dumps(key)}: {figure_json(fig)}" for key, fig in figures.items()) + "}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{STYLE}</style>"
        f"<!-- plotly.js {plotly.__version__} (MIT), inlined so the page works offline -->"
        f"<script>{get_plotlyjs()}</script></head>\n<body>\n<h1>{escape(title)}</h1>\n{body}"
        f"<script>{RENDER_SCRIPT % payload}</script>\n</body></html>\n"
    )


def chart_div(chart_id: str) -> str:
    """The element a figure is drawn into."""
    return f'<div id="{escape(chart_id)}" class="chart"></div>'


def paragraph(text: str, note: bool = False) -> str:
    """One escaped paragraph."""
    return ("<p class='note'>" if note else "<p>") + escape(text) + "</p>"


def preformatted(lines: list[str]) -> str:
    """Commands or inputs, one a line, escaped."""
    return "<pre>" + escape("\n".join(lines)) + "</pre>"
