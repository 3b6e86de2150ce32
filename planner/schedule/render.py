"""Timeline pictures of a simulated step: a rich renderable for the terminal and SVG text.

Pure functions of a `SimResult` with its timeline: nothing here prints or writes files.
One row per rank; F, B, I and W blocks in their own colours (a second chunk of a rank in a
lighter shade), idle time blank; micro-batch numbers inside blocks wide enough to hold them.
"""

from __future__ import annotations

import bisect
import math
from xml.sax.saxutils import escape

from rich.console import Group
from rich.text import Text

from planner.errors import ScheduleError
from planner.schedule.simulate import SimResult, TimelineEntry

KIND_NAMES = {"F": "forward", "B": "backward (full)", "I": "backward, input grad", "W": "backward, weight grad"}
_TERMINAL_STYLE = {
    ("F", 0): "white on blue",
    ("F", 1): "black on bright_blue",
    ("B", 0): "white on green",
    ("B", 1): "black on bright_green",
    ("I", 0): "black on cyan",
    ("I", 1): "black on bright_cyan",
    ("W", 0): "white on magenta",
    ("W", 1): "black on bright_magenta",
}
_SVG_FILL = {
    ("F", 0): "#3b6fd8",
    ("F", 1): "#8fb0ee",
    ("B", 0): "#2e9d57",
    ("B", 1): "#8fd3a6",
    ("I", 0): "#19a6b8",
    ("I", 1): "#8bd8e2",
    ("W", 0): "#b0449d",
    ("W", 1): "#dea3d4",
}


def _rows(result: SimResult) -> list[list[tuple[TimelineEntry, int]]]:
    """Per rank, its (entry, chunk parity) in time order; the chunk is the rank of the stage
    id among the rank's stages."""
    if result.timeline is None:
        raise ScheduleError("render needs a timeline: call simulate(..., timeline=True)")
    ranks = 1 + max(e.rank for e in result.timeline)
    rows: list[list[TimelineEntry]] = [[] for _ in range(ranks)]
    for entry in result.timeline:
        rows[entry.rank].append(entry)
    out = []
    for row in rows:
        stages = sorted({e.action.stage_index for e in row})
        chunk = {s: i % 2 for i, s in enumerate(stages)}
        out.append([(e, chunk[e.action.stage_index]) for e in sorted(row, key=lambda e: e.start_s)])
    return out


def _nice_step(span: float, ticks: int) -> float:
    """A 1-2-5 tick step giving about `ticks` ticks over `span`."""
    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def timeline_renderable(result: SimResult, *, width: int = 100, time_scale: float = 1e3, unit: str = "ms") -> Group:
    """The timeline as rich Text rows scaled to `width` characters (labels included).

    Each character covers step_time/width of time and shows the action running at its
    middle; times on the axis are seconds x `time_scale` in `unit`.
    """
    rows = _rows(result)
    label_width = len(f"rank {len(rows) - 1} ")
    cells = max(10, width - label_width)
    total = result.step_time_s or 1.0
    dt = total / cells
    lines = []
    for rank, row in enumerate(rows):
        starts = [e.start_s for e, _ in row]
        text = Text(f"rank {rank}".ljust(label_width), style="bold")
        chars: list[tuple[str, str]] = []
        for c in range(cells):
            mid = (c + 0.5) * dt
            k = bisect.bisect_right(starts, mid) - 1
            if k >= 0 and row[k][0].end_s > mid:
                entry, chunk = row[k]
                chars.append((" ", _TERMINAL_STYLE[(entry.action.computation_type.value, chunk)]))
            else:
                chars.append(("·", "grey42"))
        for entry, _ in row:
            c0, c1 = math.ceil(entry.start_s / dt - 0.5), math.ceil(entry.end_s / dt - 0.5)
            label = str(entry.action.microbatch_index)
            if c1 - c0 >= len(label) + 1:
                at = c0 + (c1 - c0 - len(label)) // 2
                for i, ch in enumerate(label):
                    chars[at + i] = (ch, chars[at + i][1])
        for ch, style in chars:
            text.append(ch, style=style)
        lines.append(text)
    axis = Text(" " * label_width + "0", style="dim")
    step = _nice_step(total * time_scale, max(1, cells // 12))
    tick = step
    while tick <= total * time_scale + 1e-9:
        pos = round(tick / time_scale / dt)
        label = f"{tick:g}"
        pad = pos - (len(axis) - label_width) - len(label) + 1
        if pad > 0:
            axis.append(" " * pad + label, style="dim")
        tick += step
    axis.append(f" {unit}", style="dim")
    legend = Text(" " * label_width)
    kinds = sorted({e.action.computation_type.value for row in rows for e, _ in row}, key="FBIW".index)
    for kind in kinds:
        legend.append(f" {kind} ", style=_TERMINAL_STYLE[(kind, 0)])
        legend.append(f" {KIND_NAMES[kind]}  ")
    legend.append("·", style="grey42")
    legend.append(" idle")
    return Group(*lines, axis, legend)


def timeline_svg(
    result: SimResult, *, title: str = "", time_scale: float = 1e3, unit: str = "ms", width_px: int = 1000
) -> str:
    """A standalone SVG of the timeline: legend, one row per rank, time axis in `unit`.

    Blocks carry their micro-batch number when at least 14 px wide and a <title> tooltip
    (action text form, start and end).
    """
    rows = _rows(result)
    left, right, top, row_h, gap = 70, 20, 70 if title else 46, 26, 6
    plot_w = width_px - left - right
    total = result.step_time_s or 1.0
    scale = plot_w / total
    height = top + len(rows) * (row_h + gap) + 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_px}" height="{height}" '
        f'viewBox="0 0 {width_px} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<rect width="{width_px}" height="{height}" fill="white"/>',
    ]
    if title:
        out.append(f'<text x="{left}" y="24" font-size="16" font-weight="bold">{escape(title)}</text>')
    kinds = sorted({e.action.computation_type.value for row in rows for e, _ in row}, key="FBIW".index)
    x = left
    legend_y = top - 22
    for kind in kinds:
        out.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" fill="{_SVG_FILL[(kind, 0)]}"/>')
        name = f"{kind} {KIND_NAMES[kind]}"
        out.append(f'<text x="{x + 16}" y="{legend_y}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    out.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" fill="#f1f1f1" stroke="#bbb"/>')
    out.append(f'<text x="{x + 16}" y="{legend_y}">idle</text>')
    if any(chunk for row in rows for _, chunk in row):
        x += 60
        out.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" fill="{_SVG_FILL[("F", 1)]}"/>')
        out.append(f'<text x="{x + 16}" y="{legend_y}">lighter: second chunk of the rank</text>')
    for rank, row in enumerate(rows):
        y = top + rank * (row_h + gap)
        out.append(f'<text x="{left - 8}" y="{y + row_h / 2 + 4}" text-anchor="end">rank {rank}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{plot_w}" height="{row_h}" fill="#f1f1f1"/>')
        for entry, chunk in row:
            kind = entry.action.computation_type.value
            bx, bw = left + entry.start_s * scale, (entry.end_s - entry.start_s) * scale
            tip = f"{entry.action}: {entry.start_s * time_scale:.4g}-{entry.end_s * time_scale:.4g} {unit}"
            out.append(
                f'<g><title>{escape(tip)}</title><rect x="{bx:.2f}" y="{y}" width="{bw:.2f}" height="{row_h}" '
                f'fill="{_SVG_FILL[(kind, chunk)]}" stroke="white" stroke-width="0.5"/>'
            )
            if bw >= 14:
                color = "white" if chunk == 0 else "black"
                out.append(
                    f'<text x="{bx + bw / 2:.2f}" y="{y + row_h / 2 + 4}" text-anchor="middle" '
                    f'fill="{color}">{entry.action.microbatch_index}</text>'
                )
            out.append("</g>")
    axis_y = top + len(rows) * (row_h + gap) + 4
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" stroke="#333"/>')
    step = _nice_step(total * time_scale, 10)
    k = 0
    while k * step <= total * time_scale + 1e-9:
        tx = left + k * step / time_scale * scale
        out.append(f'<line x1="{tx:.2f}" y1="{axis_y}" x2="{tx:.2f}" y2="{axis_y + 5}" stroke="#333"/>')
        out.append(f'<text x="{tx:.2f}" y="{axis_y + 18}" text-anchor="middle">{k * step:g}</text>')
        k += 1
    out.append(f'<text x="{left + plot_w / 2}" y="{axis_y + 36}" text-anchor="middle">time ({escape(unit)})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
