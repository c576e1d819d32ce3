"""`zoomer-ar compare` writes milliseconds in the reports' number style (render.filters): two decimals with
thousands separators, and a small non-zero figure to three significant digits instead of 0.000."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
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



@pytest.mark.parametrize("layout", ["keys reversed", "keys sorted, indented", "schema_version last, compact"])
def test_compare_reads_a_findings_document_whatever_its_key_order(tmp_path, capsys, layout):
    """A findings document saved under another name was recognised only when schema_version was its
    first key: `json.dump(doc, f, sort_keys=True)` (or jq -S) made it a trace without traceEvents."""
    import json

    from zoomer_ar.cli import main

    sync = REPO / "examples/traces/sync_point"
    assert main(["analyze", str(sync), "--no-files", "--format", "json", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    saved = tmp_path / "before.json"
    if layout == "keys reversed":
        saved.write_text(json.dumps(dict(reversed(list(doc.items())))))
    elif layout == "keys sorted, indented":
        saved.write_text(json.dumps(doc, sort_keys=True, indent=2))
    else:
        version = doc.pop("schema_version")
        saved.write_text(json.dumps({**doc, "schema_version": version}, separators=(",", ":")))
    assert main(["compare", str(saved), str(sync), "--format", "json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["speedup"] == 1.0 and out["resolved"] == [] and out["new"] == []
    doc["schema_version"] = "9.0"  # read as findings: another major version is named as such
    saved.write_text(json.dumps(doc, sort_keys=True))
    assert main(["compare", str(saved), str(sync)]) == 2
    assert "schema_version '9.0' is not one this zoomer-ar reads" in capsys.readouterr().err
