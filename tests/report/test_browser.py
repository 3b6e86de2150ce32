"""The report in a real browser: headless Chromium loads the page offline, the charts render
without a script error, and the screenshot shows them. Skipped where no browser is installed
(.ci/run installs Debian's `chromium`)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pytest

from tests.report.png import colours, read_png
from tests.report.tables import plan_table

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for path in map(shutil.which, BROWSERS) if path), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason=f"no headless browser installed (looked for {', '.join(BROWSERS)}); .ci/run installs Debian's chromium",
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--virtual-time-budget=20000",
    "--no-first-run",
    "--disable-extensions",
)
TIMEOUT_S = 180
F_BLUE, ACTIVATIONS_RED = (0x4C, 0x78, 0xA8), (0xE4, 0x57, 0x56)
"""The timeline's forward colour and the memory chart's activations colour (charts.py)."""


WINDOW_WIDTH = 1400
MEASURE_PLAN_TABLE = """<script>
window.addEventListener('load', function () {
  var table = document.getElementById('plans');
  document.body.setAttribute('data-plan-table', JSON.stringify({
    window: window.innerWidth,
    page: document.documentElement.scrollWidth,
    container: table.parentElement.clientWidth,
    table: table.offsetWidth,
    content: table.scrollWidth,
    right: table.getBoundingClientRect().right,
    rows: Array.prototype.map.call(table.tBodies[0].rows, function (row) { return row.offsetHeight; })
  }));
});
</script>"""
"""Appended to a copy of the page: writes the plans table's widths (CSS px) into the DOM for --dump-dom."""


def _browser(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BROWSER, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _body(dom: str) -> str:
    return re.search(r"<body[^>]*>", dom).group(0)


def test_the_report_renders_without_script_errors(plan_report, tmp_path):
    _, page = plan_report
    run = _browser("--dump-dom", page.as_uri(), tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    body = _body(run.stdout)
    assert "data-script-error" not in body, body
    assert 'data-charts-rendered="4"' in body, body
    for chart in ("timeline", "memory", "activations", "breakdown"):
        drawn = re.search(rf'<div id="{chart}"[^>]*class="[^"]*js-plotly-plot', run.stdout)
        assert drawn, f"{chart} was not drawn"
    assert run.stdout.count('class="main-svg"') >= 4


def test_the_screenshot_shows_the_timeline_and_the_memory_chart(plan_report, tmp_path):
    _, page = plan_report
    shot = tmp_path / "report.png"
    run = _browser(f"--screenshot={shot}", "--window-size=1200,2200", page.as_uri(), tmp_path=tmp_path)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    width, height, rows = read_png(shot.read_bytes())
    assert (width, height) == (1200, 2200)
    seen = colours(rows, len(rows[0]) // width)
    assert len(seen) > 50, "the screenshot is (nearly) one colour"
    assert F_BLUE in seen and ACTIVATIONS_RED in seen


def test_the_sweep_svg_has_round_number_ticks(tmp_path, cli):
    """`sweep --svg` (kaleido drives the same browser): each y axis ticks at multiples of a step
    of 1, 2, 2.5 or 5 x 10^k; the x axis at the swept values."""
    pytest.importorskip("kaleido", reason="static images need kaleido (the `report` extra)")
    svg = tmp_path / "sweep.svg"
    code, _, err = cli(
        "sweep",
        "--model",
        "tiny-llama",
        "--gpu",
        "h100",
        "--global-batch",
        "32",
        "--seq",
        "512",
        "--vary",
        "gpus",
        "--values",
        "2,4,8",
        "--svg",
        str(svg),
    )
    assert code == 0, err
    text = svg.read_text()
    axes: dict[str, list[float]] = {}
    for axis, tick in re.findall(r'class="(y\d*)tick"><text[^>]*>([^<]+)<', text):
        scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(tick[-1], 1.0)
        axes.setdefault(axis, []).append(float(tick.replace("\u2212", "-").rstrip("kMG")) * scale)
    assert len(axes) == 2, axes
    for axis, values in axes.items():
        step = values[1] - values[0]
        mantissa = step / 10 ** int(f"{step:e}".split("e")[1])
        assert round(mantissa, 6) in (1, 2, 2.5, 5), (axis, values)
        assert all(abs(v / step - round(v / step)) < 1e-6 for v in values), (axis, values)
    xticks = re.findall(r'class="x\d*tick"><text[^>]*>([^<]+)<', text)
    assert xticks[:3] == ["2", "4", "8"]
    for label in ("tp", "pp", "dp"):
        assert label in text


def _plan_table_widths(page, tmp_path) -> dict:
    """The plans table's widths, its page's and its container's, laid out in a WINDOW_WIDTH px window."""
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", MEASURE_PLAN_TABLE + "</body>"))
    run = _browser("--dump-dom", f"--window-size={WINDOW_WIDTH},900", measured.as_uri(), tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r'data-plan-table="([^"]*)"', _body(run.stdout))
    assert found, _body(run.stdout)
    widths = json.loads(html.unescape(found.group(1)))
    assert widths["window"] == WINDOW_WIDTH
    return widths


def _alternate_cuts(plan: dict) -> None:
    """Rewrite the plan's cuts so that no two neighbouring virtual stages hold as many layers
    (each pair of equal stages a, a becomes a - 1, a + 1): the longest run-length text there is."""
    nested = not isinstance(plan["stage_layers"][0][0], int)
    ranks = plan["stage_layers"] if nested else [[r] for r in plan["stage_layers"]]
    ordered = sorted(tuple(r) for chunks in ranks for r in chunks)
    sizes = [end - start for start, end in ordered]
    for i in range(0, len(sizes) - 1, 2):
        if sizes[i] == sizes[i + 1] >= 2:
            sizes[i], sizes[i + 1] = sizes[i] - 1, sizes[i + 1] + 1
    starts = [ordered[0][0] + sum(sizes[:i]) for i in range(len(sizes))]
    moved = {old: [start, start + size] for old, start, size in zip(ordered, starts, sizes)}
    ranks = [[moved[tuple(r)] for r in chunks] for chunks in ranks]
    plan["stage_layers"] = ranks if nested else [chunks[0] for chunks in ranks]


@pytest.mark.parametrize("cuts", ["planned", "alternating"])
def test_the_plan_table_fits_a_1400_px_window(wide_plan_report, cuts, tmp_path, cli):
    """llama3-405b's 64 virtual stages: the table stays within the page's column and the page
    does not scroll sideways; the planned cuts, in runs, keep each row on one line; cuts with no
    runs at all wrap in their cell instead of widening the table."""
    plan, page = wide_plan_report
    if cuts == "alternating":
        document = json.loads(plan.read_text())
        for entry in document["plans"]:
            _alternate_cuts(entry)
        plan = tmp_path / "alternating.json"
        plan.write_text(json.dumps(document))
        page = tmp_path / "alternating.html"
        code, _, err = cli("report", str(plan), "-o", str(page), "--no-explain")
        assert code == 0, err
    table = plan_table(page.read_text())
    longest = max(len(row[table.header.index("cuts")]) for row in table.rows)
    assert longest > 60 if cuts == "alternating" else longest < 20
    widths = _plan_table_widths(page, tmp_path)
    assert widths["table"] <= widths["container"] < WINDOW_WIDTH, widths
    assert widths["content"] <= widths["table"] and widths["right"] <= WINDOW_WIDTH, widths
    assert widths["page"] <= WINDOW_WIDTH, widths
    if cuts == "planned":
        assert len(set(widths["rows"])) == 1, widths
