"""A small standalone SVG line chart for `planner sweep` (no plotting library needed)."""

from __future__ import annotations

from html import escape

WIDTH, HEIGHT = 640, 400
MARGIN = {"left": 80, "right": 80, "top": 40, "bottom": 60}


def line_chart(title: str, x_label: str, xs: list[float], series: list[tuple[str, str, list[float | None]]]) -> str:
    """An SVG document plotting each (label, colour, ys) against xs; the first series on the
    left axis, a second one on the right axis; None ys leave a gap (no feasible plan)."""
    left, right, top, bottom = MARGIN["left"], WIDTH - MARGIN["right"], MARGIN["top"], HEIGHT - MARGIN["bottom"]
    x_pos = {x: left + (right - left) * (i / max(1, len(xs) - 1)) for i, x in enumerate(xs)}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
        f'font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/>',
        f'<text x="{(left + right) / 2}" y="{HEIGHT - 15}" text-anchor="middle">{escape(x_label)}</text>',
    ]
    for x in xs:
        parts.append(f'<text x="{x_pos[x]:.1f}" y="{bottom + 18}" text-anchor="middle">{_fmt(x)}</text>')
    for index, (label, colour, ys) in enumerate(series[:2]):
        known = [y for y in ys if y is not None]
        if not known:
            continue
        lo, hi = 0.0, max(known) * 1.1 or 1.0
        axis_x = left if index == 0 else right
        anchor, dx = ("end", -6) if index == 0 else ("start", 6)
        parts.append(f'<line x1="{axis_x}" y1="{top}" x2="{axis_x}" y2="{bottom}" stroke="{colour}"/>')
        parts.append(f'<text x="{axis_x}" y="{top - 8}" text-anchor="middle" fill="{colour}">{escape(label)}</text>')
        for tick in range(5):
            value = lo + (hi - lo) * tick / 4
            y = bottom - (bottom - top) * tick / 4
            parts.append(f'<text x="{axis_x + dx}" y="{y + 4:.1f}" text-anchor="{anchor}" fill="{colour}">'
                         f'{_fmt(value)}</text>')
        points = [(x_pos[x], bottom - (bottom - top) * (y - lo) / (hi - lo)) for x, y in zip(xs, ys) if y is not None]
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.extend(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}"/>' for px, py in points)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _fmt(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"
