"""`batch --out`: each trace's report folder is written into a hidden folder beside it and renamed into place, so a
batch killed (or failing) while writing leaves no half-written folder that looks complete (a findings.json without
its reports); a folder of this input's earlier reports gets the new files, findings.json last."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.service.batch import TraceResult, _record_and_write, analyze_one

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "examples" / "traces" / "sync_point"


@pytest.fixture(scope="module")
def analysis_json() -> str:
    out = analyze_one(str(TRACE))
    assert out["ok"], out
    return out["analysis"]


def _write(analysis_json: str, out_dir: Path) -> TraceResult:
    r = TraceResult(path=str(TRACE), ok=True)
    _record_and_write(r, analysis_json, store=None, team=None, out_dir=out_dir)
    return r


def test_reports_land_whole_in_a_new_folder(analysis_json, tmp_path):
    r = _write(analysis_json, tmp_path)
    assert r.ok and r.out == str(tmp_path / "sync_point"), r.error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sync_point"]  # no staging folder left
    assert sorted(p.name for p in (tmp_path / "sync_point").iterdir()) == ["findings.json", "report.html", "report.md"]
    mode = (tmp_path / "sync_point").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o777 & ~umask  # a plain folder's mode, not mkdtemp's 0700


def test_a_batch_killed_while_writing_leaves_no_folder_that_looks_complete(analysis_json, tmp_path):
    """Killed (SIGKILL, no cleanup at all) after findings.json and report.md were written, while report.html was
    being rendered: the job's folder held findings.json and report.md, as if complete; now there is none."""
    data = tmp_path / "analysis.json"
    data.write_text(analysis_json)
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "import zoomer_ar.render.report as report\n"
        "from zoomer_ar.service.batch import TraceResult, _record_and_write\n"
        "report.render_html = lambda analysis: os.kill(os.getpid(), signal.SIGKILL)\n"
        "r = TraceResult(path=sys.argv[1], ok=True)\n"
        "_record_and_write(r, Path(sys.argv[2]).read_text(), store=None, team=None, out_dir=Path(sys.argv[3]))\n"
    )
    out = tmp_path / "reports"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", script, str(TRACE), str(data), str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / "sync_point").exists(), sorted(p.name for p in (out / "sync_point").iterdir())
    left = [p.name for p in out.iterdir()]
    assert len(left) == 1 and left[0].startswith(".zoomer-writing.")  # hidden: no report folder


def test_a_failure_while_writing_leaves_nothing(analysis_json, tmp_path, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) while report.html is rendered: no report folder, no staging folder."""
    import zoomer_ar.render.report as report

    def interrupted(_analysis):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "render_html", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _write(analysis_json, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_this_inputs_earlier_folder_gets_the_new_reports(analysis_json, tmp_path):
    earlier = tmp_path / "sync_point"
    earlier.mkdir()
    (earlier / "findings.json").write_text(json.dumps({"job": {"path": str(TRACE)}}))
    (earlier / "report.md").write_text("old")
    (earlier / "notes.txt").write_text("the user's")
    r = _write(analysis_json, tmp_path)
    assert r.ok and r.out == str(earlier), r.error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sync_point"]
    assert (earlier / "report.md").read_text() != "old" and (earlier / "notes.txt").read_text() == "the user's"
    assert json.loads((earlier / "findings.json").read_text())["findings"]
