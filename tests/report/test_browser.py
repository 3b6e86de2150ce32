"""The report in a real browser: headless Chromium loads the page offline, the charts render
without a script error, and the screenshot shows them. Skipped where no browser is installed
(.ci/run installs Debian's `chromium`)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.report.png import colours, read_png

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
