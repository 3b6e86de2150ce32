"""Timeline rendering: SVG structure and the terminal picture."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from planner.errors import ScheduleError
from planner.schedule import StageCosts, generate, simulate
from planner.schedule.render import timeline_renderable, timeline_svg

SVG = "{http://www.w3.org/2000/svg}"


def _result(name="zb_h1", pp=4, m=8, vpp=1):
    return simulate(generate(name, pp, m, vpp), StageCosts.uniform(pp, vpp, 1e-3, 1e-3, 1e-3), timeline=True)


def test_svg_has_legend_axis_blocks_and_microbatch_numbers():
    result = _result()
    root = ET.fromstring(timeline_svg(result, title="zb_h1 P=4 M=8"))
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "zb_h1 P=4 M=8" in texts
    assert {"F forward", "I backward, input grad", "W backward, weight grad", "idle", "time (ms)"} <= set(texts)
    assert {"rank 0", "rank 3"} <= set(texts)
    assert {"0", "5", "25"} <= set(texts) and "30" not in texts  # 1-2-5 ticks over the 27 ms step
    tips = [t.text for t in root.iter(f"{SVG}title")]
    assert len(tips) == 3 * 4 * 8 and "0F0: 0-1 ms" in tips
    numbers = [t.text for g in root.iter(f"{SVG}g") for t in g.iter(f"{SVG}text")]
    assert sorted(set(numbers), key=int) == [str(m) for m in range(8)]


def test_svg_marks_second_chunks():
    root = ET.fromstring(timeline_svg(_result("zbv", 2, 4, 2)))
    assert "lighter: second chunk of the rank" in [t.text for t in root.iter(f"{SVG}text")]


def test_terminal_picture_fits_the_width():
    console = Console(width=80, record=True, color_system=None)
    console.print(timeline_renderable(_result(), width=80))
    lines = console.export_text().splitlines()
    assert [line.split()[0:2] for line in lines[:4]] == [["rank", str(r)] for r in range(4)]
    assert all(len(line) <= 80 for line in lines)
    assert lines[4].rstrip().endswith("ms") and "F  forward" in lines[5]
    assert "·" in lines[0]  # rank 0 waits for the first I


def test_render_needs_a_timeline():
    result = simulate(generate("1f1b", 2, 2), StageCosts.uniform(2, 1, 1, 1, 1))
    with pytest.raises(ScheduleError, match="timeline=True"):
        timeline_svg(result)
