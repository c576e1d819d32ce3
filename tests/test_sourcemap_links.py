"""analyze --source on a folder holding files it cannot read: links are not followed (as `zoomer-ar fix`
never reads or replaces them), and a traced file that only a link under the folder could be is said to be
so, rather than 'no Python frame of the trace resolves to a file under DIR' while the file is listed there;
a traced file that cannot be decoded is named too, not silently shown at the trace's line."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import copy_scenario_sources
from zoomer_ar.analyze import analyze_path
from zoomer_ar.sourcemap import map_sources

REPO = Path(__file__).resolve().parents[1]
SCEN = REPO / "training_data" / "scenarios"
SYNC = REPO / "examples" / "traces" / "sync_point"  # frames sync_point.py(28): train_step


def _real(tmp_path: Path) -> Path:
    return copy_scenario_sources(tmp_path / "real")


def _located(analysis) -> set[str | None]:
    return {fr.resolved_path for f in analysis.findings for fr in f.all_frames()}


def test_a_linked_file_is_named_in_a_note(tmp_path):
    real = _real(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    (src / "sync_point.py").symlink_to(real / "sync_point.py")
    shutil.copy(SCEN / "_common.py", src / "_common.py")
    analysis = map_sources(analyze_path(SYNC), src)
    assert _located(analysis) == {None}  # not followed
    notes = [n for n in analysis.notes if n.startswith("source:")]
    linked = [n for n in notes if "symbolic link" in n]
    assert len(linked) == 1 and "sync_point.py" in linked[0] and str(real / "sync_point.py") in linked[0]


def test_a_linked_folder_is_named_in_a_note(tmp_path):
    real = _real(tmp_path)
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "other.py").write_text("x = 1\n")
    (src / "code").symlink_to(real, target_is_directory=True)
    analysis = map_sources(analyze_path(SYNC), src)
    assert _located(analysis) == {None}
    linked = [n for n in analysis.notes if "symbolic link" in n]
    assert len(linked) == 1 and "code" in linked[0] and str(real) in linked[0]


def test_a_source_folder_that_is_itself_a_link_is_read(tmp_path):
    real = _real(tmp_path)
    src = tmp_path / "src"
    src.symlink_to(real, target_is_directory=True)
    analysis = map_sources(analyze_path(SYNC), src)
    assert _located(analysis) == {"sync_point.py"}
    assert not any("symbolic link" in n for n in analysis.notes)


def test_a_file_that_cannot_be_decoded_is_named_in_a_note(tmp_path):
    # a Latin-1 byte without a coding cookie: the file was silently not read, its frames shown as the trace's
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SCEN / "_common.py", src / "_common.py")
    (src / "sync_point.py").write_bytes((SCEN / "sync_point.py").read_bytes() + b"# caf\xe9\n")
    analysis = map_sources(analyze_path(SYNC), src)
    assert _located(analysis) == {None}
    said = [n for n in analysis.notes if "sync_point.py" in n and "cannot be read" in n]
    assert len(said) == 1 and "the trace's line" in said[0]
