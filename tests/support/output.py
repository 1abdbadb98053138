"""What the management commands print, read by tests: run one, drop the timings."""

from __future__ import annotations

import io
import re
from typing import Any

from django.core.management import call_command

DURATION = r"\d+(?:\.\d)? s|\d+ min \d\d s|\d+ h \d\d min"
RATE = r"[\d,]+(?:\.\d)? records/s"
# The timing at the end of a summary: `` (12.3 s, 98 records/s)`` or `` (0.1 s)``.
TIMING = re.compile(rf" \((?:{DURATION})(?:, {RATE})?\)(?=\.$)", re.MULTILINE)


def run(command: str, *args: str, stdout: io.StringIO | None = None, **options: Any) -> str:
    """The command's output, as a pipe (not a terminal) would get it."""
    out = stdout or io.StringIO()
    call_command(command, *args, stdout=out, **options)
    return out.getvalue()


def timeless(output: str) -> str:
    """``output`` without the summaries' timings, which change from run to run."""
    return TIMING.sub("", output)
