"""analyze --source on large source files: a file above the fix stage's size limit is not parsed (an
11 MB file took over 7 minutes and 6 GB), and the frames of a finding's events, most often the same
frame again, are located once each (a 720 kB file took 48 s for 12 copies of two frames)."""

from __future__ import annotations

from pathlib import Path

from zoomer_ar import sourcemap
from conftest import copy_scenario_sources
from zoomer_ar.analyze import analyze_path
from zoomer_ar.fix import engine
from zoomer_ar.sourcemap import map_sources

REPO = Path(__file__).resolve().parents[1]
SCEN = REPO / "training_data" / "scenarios"
SYNC = REPO / "examples" / "traces" / "sync_point"  # frames sync_point.py(28): train_step; .item() on line 33


def _source(tmp_path: Path) -> Path:
    return copy_scenario_sources(tmp_path / "src")


def test_a_file_above_the_size_limit_keeps_the_trace_line_and_says_why(tmp_path, monkeypatch):
    src = _source(tmp_path)
    size = (src / "sync_point.py").stat().st_size
    monkeypatch.setattr(engine, "MAX_FILE_BYTES", size - 1)  # sync_point.py just over the limit
    analysis = map_sources(analyze_path(SYNC), src)
    sp = next(f for f in analysis.findings if f.pattern == "sync-point")
    frames = [*sp.evidence.frames, *(fr for e in sp.evidence.events for fr in e.frames)]
    assert frames and all((fr.resolved_path, fr.resolved_line, fr.function) == ("sync_point.py", 28, "train_step")
                          for fr in frames)
    assert frames[0].snippet and "def train_step" in frames[0].snippet
    notes = [n for n in analysis.notes if "sync_point.py is larger than" in n]
    assert len(notes) == 1 and "not analysed" in notes[0] and "the trace's line" in notes[0]


def test_a_file_within_the_limit_is_located_as_before(tmp_path):
    analysis = map_sources(analyze_path(SYNC), _source(tmp_path))
    sp = next(f for f in analysis.findings if f.pattern == "sync-point")
    assert (sp.evidence.frames[0].resolved_path, sp.evidence.frames[0].resolved_line) == ("sync_point.py", 33)
    assert not any("larger than" in n for n in analysis.notes)


def test_each_distinct_frame_is_located_once(tmp_path, monkeypatch):
    analysis = analyze_path(SYNC)
    located = [(f.pattern, fr.model_dump_json()) for f in analysis.findings
               for fr in [*f.evidence.frames, *(fr for e in f.evidence.events for fr in e.frames[:1])]]
    distinct = set(located)
    assert len(located) > len(distinct)  # the events repeat their finding's frame
    calls = []
    real = sourcemap.locate

    def counting(*args, **kwargs):
        calls.append(args[1:3])
        return real(*args, **kwargs)

    monkeypatch.setattr(sourcemap, "locate", counting)
    mapped = map_sources(analysis, _source(tmp_path))
    assert len(calls) == len(distinct)
    for f in mapped.findings:  # every copy located as the first
        first = f.evidence.frames[0]
        assert first.resolved_path == "sync_point.py"
        assert all(e.frames[0] == first for e in f.evidence.events if e.frames)
