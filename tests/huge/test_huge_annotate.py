"""`analyze --annotate OUT.json.gz`: a valid trace that this tool loads, with markers at the
evidence times on a "zoomer" track and flows bound to the evidence events."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.annotate import ZOOMER_PID, annotate
from zoomer_ar.cli import main
from zoomer_ar.surgery import check_trace
from zoomer_ar.surgery.ops import PID_STRIDE

from conftest import SHARED_TRACES

NS = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
NANO = SHARED_TRACES / "hta/ns_resolution_trace"
DLRM = SHARED_TRACES / "param/dlrm_8ranks"
STACKS = SHARED_TRACES / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"


def doc_of(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def first_ts(events: list[dict]) -> float:
    return min(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") not in ("Trace", "zoomer"))


@pytest.mark.parametrize("src", [NS, STACKS], ids=["ns_resolution", "with_stack"])
def test_annotated_trace_has_markers_at_the_evidence(tmp_path, shared_traces, src):
    analysis = analyze_path(src)
    assert analysis.findings, "needs a trace with findings"
    out = tmp_path / "annotated.json.gz"
    report = annotate(analysis, out)
    n, problems = check_trace(out)
    assert not problems
    doc = doc_of(out)
    original = doc_of(src)
    events = doc["traceEvents"]
    assert events[: len(original["traceEvents"])] == original["traceEvents"]  # the original, untouched
    assert {k: v for k, v in doc.items() if k != "traceEvents"} == {k: v for k, v in original.items() if k != "traceEvents"}
    zoomer = [e for e in events if e.get("pid") == ZOOMER_PID]
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in zoomer)
    t0 = first_ts(original["traceEvents"])
    instants = [e for e in zoomer if e["ph"] == "i"]
    wanted = [(f.pattern, ev) for f in analysis.findings for ev in f.evidence.events]
    assert len(instants) == len(wanted) == report.markers
    for (pattern, ev), e in zip(wanted, instants):
        assert e["args"]["pattern"] == pattern and e["name"].startswith(pattern)
        assert abs((e["ts"] - t0) / 1000.0 - ev.ts_ms) <= 2e-3, (e["name"], e["ts"], ev.ts_ms)
    # flows: start on the marker, end bound to an event of that name at that time
    starts = {e["id"]: e for e in zoomer if e["ph"] == "s"}
    ends = [e for e in events if e.get("ph") == "f" and e.get("cat") == "zoomer"]
    assert len(ends) == len(starts) == report.bound > 0
    by_key = {(e.get("pid"), e.get("tid"), e.get("ts")): e for e in original["traceEvents"] if e.get("ph") == "X"}
    for f in ends:
        assert f["bp"] == "e" and f["id"] in starts
        target = by_key[(f["pid"], f["tid"], f["ts"])]
        assert starts[f["id"]]["ts"] == target["ts"]
    # the markers change no feature: the annotated trace analyses as the original
    again = analyze_path(out)
    assert again.features == analysis.features
    assert [x.pattern for x in again.findings] == [x.pattern for x in analysis.findings]


def test_annotated_job_of_several_ranks_is_one_merged_trace(tmp_path, shared_traces):
    analysis = analyze_path(DLRM)
    out = tmp_path / "job.json.gz"
    report = annotate(analysis, out)
    assert report.markers == sum(len(f.evidence.events) for f in analysis.findings)
    n, problems = check_trace(out)
    assert not problems
    events = doc_of(out)["traceEvents"]
    assert {e["pid"] // PID_STRIDE for e in events if isinstance(e.get("pid"), int)} == set(range(8))
    assert sum(1 for e in events if e.get("pid") == ZOOMER_PID and e["ph"] == "i") == report.markers
    analyze_path(out)  # this tool loads it
    folder = tmp_path / "per-rank"
    annotate(analysis, folder)
    assert len(list(folder.iterdir())) == 8


def test_cli_annotate_option(tmp_path, shared_traces, capsys):
    out = tmp_path / "a.json.gz"
    rc = main(["analyze", str(NS), "--no-files", "--no-progress", "--annotate", str(out)])
    assert rc == 0
    assert "annotated trace" in capsys.readouterr().err
    assert not check_trace(out)[1]
    # streaming analysis annotates the same way
    out2 = tmp_path / "b.json.gz"
    assert main(["analyze", str(NANO), "--no-files", "--no-progress", "--stream", "--annotate", str(out2)]) == 0
    capsys.readouterr()
    assert doc_of(out2)["traceEvents"] == doc_of(out)["traceEvents"]


def test_annotate_never_writes_over_its_input(tmp_path, shared_traces, capsys):
    """`--annotate` onto the trace itself replaced the original with the annotated copy; into the
    rank folder it adds a file a later `analyze DIR` reads as another rank. Both are refused first."""
    import hashlib
    import shutil

    src = next((shared_traces / "hta" / "ns_resolution_trace").glob("*.json.gz"))
    trace = tmp_path / "t.json.gz"
    shutil.copy(src, trace)
    before = hashlib.sha256(trace.read_bytes()).hexdigest()
    assert main(["analyze", str(trace), "--annotate", str(trace), "--no-files"]) == 2
    assert "is the input" in capsys.readouterr().err
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == before
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(src, job / "rank-0.json.gz")
    assert main(["analyze", str(job), "--annotate", str(job / "annotated.json.gz"), "--no-files"]) == 2
    assert "inside the input job folder" in capsys.readouterr().err
    assert sorted(p.name for p in job.iterdir()) == ["rank-0.json.gz"]


def test_annotate_into_a_folder_for_one_trace(tmp_path, shared_traces, capsys):
    """`--annotate FOLDER` (a name without a trace suffix) is one annotated copy per trace file in the
    folder, a single trace too: it used to write a file named like the folder (JSON without a suffix),
    or, the folder existing, fail with an internal `cannot write DIR: Is a directory` after the whole
    analysis. A copy in the trace's own folder (under its own name: the trace itself) and a folder name
    that is an existing file are refused first."""
    import shutil

    out = tmp_path / "marked"
    out.mkdir()
    assert main(["analyze", str(NS), "--no-files", "--no-progress", "--annotate", str(out)]) == 0
    assert f"annotated trace: {out / NS.name} " in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == [NS.name]
    assert not check_trace(out / NS.name)[1]
    fresh = tmp_path / "fresh"
    assert main(["analyze", str(NS), "--no-files", "--no-progress", "--annotate", str(fresh)]) == 0
    capsys.readouterr()
    assert fresh.is_dir() and [p.name for p in fresh.iterdir()] == [NS.name]
    trace = tmp_path / "own" / "t.json.gz"
    trace.parent.mkdir()
    shutil.copy(NS, trace)
    before = trace.read_bytes()
    assert main(["analyze", str(trace), "--no-files", "--no-progress", "--annotate", str(trace.parent)]) == 2
    err = capsys.readouterr().err
    assert "is the input" in err and len(err.strip().splitlines()) == 1, err
    assert trace.read_bytes() == before
    (tmp_path / "afile").write_text("x")
    assert main(["analyze", str(NS), "--no-files", "--no-progress", "--annotate", str(tmp_path / "afile")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    (tmp_path / "d.json.gz").mkdir()
    assert main(["analyze", str(NS), "--no-files", "--no-progress", "--annotate", str(tmp_path / "d.json.gz")]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_annotate_says_when_it_replaced_an_existing_file(tmp_path, capsys):
    """--annotate replaced an existing output silently, where every `trace` command notes it."""
    out = tmp_path / "annotated.json.gz"
    assert main(["analyze", str(NS), "--no-files", "--no-progress", "--annotate", str(out)]) == 0
    assert "replaced" not in capsys.readouterr().err
    assert main(["analyze", str(NS), "--no-files", "--no-progress", "--annotate", str(out)]) == 0
    assert f"note: replaced the existing file {out}" in capsys.readouterr().err
