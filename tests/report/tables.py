"""The report's plans table read back from a page's HTML (the standard library's parser), for
the tests that hold it to the JSON and measure it in a browser."""

from __future__ import annotations

from html.parser import HTMLParser


class PlanTable(HTMLParser):
    """The header, the cells' text and the cells' titles of the <table id="plans"> of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.header: list[str] = []
        self.rows: list[list[str]] = []
        self.titles: list[list[str | None]] = []
        self._inside = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "table" and attributes.get("id") == "plans":
            self._inside = True
        elif self._inside and tag == "tr" and self.header:
            self.rows.append([])
            self.titles.append([])
        elif self._inside and tag in ("th", "td"):
            self._cell = []
            if tag == "td":
                self.titles[-1].append(attributes.get("title"))

    def handle_endtag(self, tag):
        if not self._inside:
            return
        if tag == "table":
            self._inside = False
        elif tag in ("th", "td") and self._cell is not None:
            (self.header if tag == "th" else self.rows[-1]).append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def plan_table(html: str) -> PlanTable:
    """The page's plans table, parsed."""
    table = PlanTable()
    table.feed(html)
    assert table.header and table.rows, "the page has no <table id='plans'>"
    return table
