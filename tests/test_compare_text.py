"""`zoomer-ar compare` writes milliseconds in the reports' number style (render.filters): two decimals with
thousands separators, and a small non-zero figure to three significant digits instead of 0.000."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from zoomer_ar.compare import _ms, compare_cmd

REPO = Path(__file__).resolve().parents[1]


def test_ms_style():
    assert _ms(13250.654) == "13,250.65 ms"
    assert _ms(0.0) == "0.00 ms"
    assert _ms(0.004123) == "0.00412 ms"
    assert _ms(-0.004123) == "-0.00412 ms"
    assert _ms(None) == "-"


def test_compare_text_uses_it():
    out = CliRunner().invoke(compare_cmd, [str(REPO / "examples/traces/sync_point"),
                                           str(REPO / "examples/traces/sync_point_clean")])
    assert out.exit_code == 0, out.output
    step = next(line for line in out.output.splitlines() if line.startswith("step time"))
    assert re.fullmatch(r"step time   [\d,]+\.\d\d ms -> [\d,]+\.\d\d ms  \(\d+\.\d\dx\)", step)
    assert not re.search(r"\d\.\d{3} ms", out.output)
