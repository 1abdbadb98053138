"""The benchmark's ratios as a bar chart: an SVG written with the standard library alone.

Each bar is one ratio of the run (the protected create against the unprotected one,
this app against each peer), drawn from 0 with a line at 1.0 where both sides are
equal and a tick at the ratio's target. Bars of a met target are green, of a
missed one orange, of one without a target grey.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

from benchmarks.report import Ratio

LABEL_WIDTH = 430
BAR_WIDTH = 360
ROW = 26
TOP = 40
COLOURS = {"met": "#2e7d32", "missed": "#ef6c00", "-": "#78909c"}


def ratios_svg(ratios: Sequence[Ratio], title: str = "Throughput ratios") -> str:
    """The SVG document of ``ratios``, one horizontal bar each."""
    finite = [ratio for ratio in ratios if ratio.value == ratio.value]  # NaN: not measured
    scale_max = max([2.0, *(ratio.value for ratio in finite)]) * 1.1
    width = LABEL_WIDTH + BAR_WIDTH + 70
    height = TOP + ROW * len(finite) + 30

    def x(value: float) -> float:
        return LABEL_WIDTH + BAR_WIDTH * value / scale_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<text x="10" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    for row, ratio in enumerate(finite):
        parts += _bar(row, ratio, x)
    one = x(1.0)
    bottom = TOP + ROW * len(finite)
    parts += [
        f'<line x1="{one:.1f}" y1="{TOP - 6}" x2="{one:.1f}" y2="{bottom}" '
        'stroke="#212121" stroke-dasharray="4 3"/>',
        f'<text x="{one:.1f}" y="{bottom + 16}" text-anchor="middle">1.0 (equal)</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def _bar(row: int, ratio: Ratio, x: Callable[[float], float]) -> list[str]:
    y = TOP + ROW * row
    end = x(max(ratio.value, 0.0))
    parts = [
        f'<text x="{LABEL_WIDTH - 8}" y="{y + 15}" text-anchor="end">{escape(ratio.name)}</text>',
        f'<rect x="{LABEL_WIDTH}" y="{y + 3}" width="{end - LABEL_WIDTH:.1f}" height="{ROW - 8}" '
        f'fill="{COLOURS.get(ratio.verdict, COLOURS["-"])}"/>',
        f'<text x="{end + 5:.1f}" y="{y + 15}">{ratio.value:.2f}</text>',
    ]
    if ratio.target:
        bound = x(float(ratio.target.split()[1]))
        parts.append(
            f'<line x1="{bound:.1f}" y1="{y + 1}" x2="{bound:.1f}" y2="{y + ROW - 3}" '
            f'stroke="#212121" stroke-width="2"><title>target {escape(ratio.target)}</title></line>'
        )
    return parts


def write_chart(ratios: Sequence[Ratio], path: Path, title: str = "Throughput ratios") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ratios_svg(ratios, title))
    return path
