"""``steps --plot FILE``: a self-contained SVG (no plotting library) of step time against batch tokens and
against queued requests, one dot per step record in each panel, coloured by DP rank."""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

from .steps_stats import Point

WIDTH, HEIGHT = 480, 320
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 32, 48
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``high``."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    n = math.ceil(high / step)
    return [i * step for i in range(n + 1)]


def _label(value: float) -> str:
    return f"{value:g}"


def _panel(points: list[Point], x_of, x_title: str, x0: int, title: str) -> list[str]:
    inner_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    inner_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    xs = [float(x_of(p)) for p in points]
    ys = [p.wall * 1000.0 for p in points]
    x_ticks = _ticks(max(xs, default=0.0))
    y_ticks = _ticks(max(ys, default=0.0))
    x_max, y_max = x_ticks[-1], y_ticks[-1]

    def sx(v: float) -> float:
        return x0 + MARGIN_LEFT + v / x_max * inner_w

    def sy(v: float) -> float:
        return MARGIN_TOP + inner_h - v / y_max * inner_h

    left, bottom = x0 + MARGIN_LEFT, MARGIN_TOP + inner_h
    out = [
        f'<g class="panel" data-x="{escape(x_title)}">',
        f'<text x="{x0 + WIDTH / 2:.1f}" y="20" text-anchor="middle" font-weight="bold">{escape(title)}</text>',
        f'<line x1="{left}" y1="{bottom}" x2="{left + inner_w}" y2="{bottom}" stroke="#000"/>',
        f'<line x1="{left}" y1="{MARGIN_TOP}" x2="{left}" y2="{bottom}" stroke="#000"/>',
    ]
    for v in x_ticks:
        out.append(f'<text x="{sx(v):.1f}" y="{bottom + 16}" text-anchor="middle" font-size="11">{_label(v)}</text>')
    for v in y_ticks:
        out.append(
            f'<line x1="{left}" y1="{sy(v):.1f}" x2="{left + inner_w}" y2="{sy(v):.1f}" stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end" font-size="11">{_label(v)}</text>'
        )
    out.append(
        f'<text x="{left + inner_w / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle" font-size="12">'
        f"{escape(x_title)}</text>"
    )
    out.append(
        f'<text x="{x0 + 14}" y="{MARGIN_TOP + inner_h / 2:.1f}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 {x0 + 14} {MARGIN_TOP + inner_h / 2:.1f})">step time (ms)</text>'
    )
    for p, x, y in zip(points, xs, ys):
        colour = COLOURS[p.dp % len(COLOURS)] if p.dp >= 0 else "#777"
        out.append(
            f'<circle class="step" data-dp="{p.dp}" cx="{sx(x):.2f}" cy="{sy(y):.2f}" r="2" fill="{colour}" '
            f'fill-opacity="0.6"><title>{p.shape}, {_label(x)}: {y:.3f} ms</title></circle>'
        )
    out.append("</g>")
    return out


def svg(points: list[Point], title: str = "vLLM engine steps") -> str:
    """The picture: two panels (step time against batch tokens; against queued requests) and a legend of the
    DP ranks."""
    ranks = sorted({p.dp for p in points})
    total_w = 2 * WIDTH
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{HEIGHT + 24}" '
        f'viewBox="0 0 {total_w} {HEIGHT + 24}" font-family="sans-serif">',
        f"<title>{escape(title)}: {len(points)} steps</title>",
        f'<rect width="{total_w}" height="{HEIGHT + 24}" fill="#fff"/>',
    ]
    out += _panel(points, lambda p: p.tokens, "batch tokens (scheduled)", 0, "step time vs batch tokens")
    out += _panel(points, lambda p: p.queued, "queued requests", WIDTH, "step time vs queue depth")
    for i, dp in enumerate(ranks):
        colour = COLOURS[dp % len(COLOURS)] if dp >= 0 else "#777"
        x = MARGIN_LEFT + i * 90
        out.append(
            f'<g class="legend"><circle cx="{x}" cy="{HEIGHT + 12}" r="4" fill="{colour}"/>'
            f'<text x="{x + 8}" y="{HEIGHT + 16}" font-size="12">dp {dp}</text></g>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
