"""analyze --source maps every planted anti-pattern of the scenario programs to its planted line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zoomer_ar.analyze import analyze_path
from zoomer_ar.cli import main
from zoomer_ar.sourcemap import SourceIndex, map_sources

REPO = Path(__file__).resolve().parents[1]
SCEN = REPO / "training_data" / "scenarios"
EXAMPLES = REPO / "examples" / "traces"
MANIFEST = yaml.safe_load((SCEN / "MANIFEST.yaml").read_text())["scenarios"]
PLANTED = sorted((n, e) for n, e in MANIFEST.items() if e["pattern"] != "clean")


@pytest.mark.parametrize("name,entry", PLANTED, ids=[n for n, _ in PLANTED])
def test_planted_pattern_maps_to_its_line(name, entry):
    analysis = map_sources(analyze_path(EXAMPLES / name), SCEN)
    finding = next(f for f in analysis.findings if f.pattern == entry["pattern"])
    top = finding.evidence.frames[0]
    lines = {entry["line"]} | {a["line"] for a in entry.get("also", [])}
    assert top.resolved_path == entry["file"]
    assert top.resolved_line in lines
    assert top.snippet and entry["contains"].split("(")[0] in (SCEN / entry["file"]).read_text()


def test_cli_source_option_writes_resolved_frames(tmp_path, capsys):
    rc = main(["analyze", str(EXAMPLES / "sync_point"), "--source", str(SCEN), "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    assert "sync_point.py:33" in capsys.readouterr().out
    doc = json.loads((tmp_path / "findings.json").read_text())
    frames = [fr for f in doc["findings"] if f["pattern"] == "sync-point" for fr in f["evidence"]["frames"]]
    assert frames[0]["resolved_path"] == "sync_point.py" and frames[0]["resolved_line"] == 33


def test_suffix_resolution_prefers_longest_match(tmp_path):
    (tmp_path / "a" / "pkg").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "pkg" / "train.py").write_text("x = 1\n")
    (tmp_path / "b" / "train.py").write_text("x = 1\n")
    idx = SourceIndex(tmp_path)
    assert idx.resolve("/home/u/proj/pkg/train.py").relative_to(tmp_path).as_posix() == "a/pkg/train.py"
    assert idx.resolve("elsewhere.py") is None


def test_unparsable_source_keeps_frame_line(tmp_path):
    (tmp_path / "sync_point.py").write_text("def broken(:\n")
    analysis = map_sources(analyze_path(EXAMPLES / "sync_point"), tmp_path)
    f = next(f for f in analysis.findings if f.pattern == "sync-point")
    assert f.evidence.frames[0].resolved_path == "sync_point.py"
