"""benchmarks/run.py draws its ratios as an SVG: a valid document, one bar per ratio."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from benchmarks.chart import write_chart
from benchmarks.report import Ratio

SVG = "{http://www.w3.org/2000/svg}"

SAMPLE = [
    Ratio("first requests, throughput: idempotency / unprotected", 0.85, ">= 0.9"),
    Ratio("replays / fresh creates, throughput", 2.09, ">= 2"),
    Ratio("first requests, throughput: idempotency / drf-idempotency", 1.14, "> 1"),
    Ratio("first requests, throughput: lease / atomic mode", 0.95),
    Ratio("not measured in this run", math.nan, "> 1"),
]


def test_the_chart_is_an_svg_with_a_bar_per_measured_ratio(tmp_path):
    path = write_chart(SAMPLE, tmp_path / "results" / "latest.svg", title="Quick <run> & co")

    root = ET.parse(path).getroot()  # well-formed XML, names escaped

    assert root.tag == f"{SVG}svg"
    bars = root.findall(f"{SVG}rect")
    assert len(bars) == 4  # the NaN ratio is left out
    texts = [text.text for text in root.iter(f"{SVG}text")]
    assert "Quick <run> & co" in texts
    assert "0.85" in texts and "2.09" in texts
    fills = [bar.get("fill") for bar in bars]
    assert fills[0] != fills[1]  # a missed target and a met one look different


def test_bars_are_proportional_to_the_ratios(tmp_path):
    root = ET.parse(write_chart(SAMPLE[:2], tmp_path / "c.svg")).getroot()
    short, long = (float(bar.get("width")) for bar in root.findall(f"{SVG}rect"))
    assert math.isclose(long / short, 2.09 / 0.85, rel_tol=0.01)
