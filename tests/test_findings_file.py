"""`compare` and `record` given a findings.json that is not one: one line naming the file and what is wrong,
exit 2. Before, JSON of the wrong shape said only "N validation errors for Analysis", and a findings.json
from an unknown schema_version (a newer zoomer-ar) was compared as if it were this version's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.models import Analysis, Bottleneck, Evidence, Finding, Impact, JobInfo, RankInfo


def _analysis(name: str = "j", pct: float = 10.0) -> Analysis:
    return Analysis(
        tool_version="0.1.0", feature_schema_version="1.0.0",
        job=JobInfo(name=name, path=f"/t/{name}.json", ranks=[RankInfo(
            path=f"/t/{name}.json", rank=0, rank_source="default", sha256="ab" * 32, size_bytes=1, n_events=1)]),
        features={"step_ms": 100.0, "wall_ms": 1000.0, "world_size": 1},
        bottleneck=Bottleneck(type="unknown", shares={}, summary=""),
        findings=[Finding(pattern="sync-point", title="t", severity="high", confidence=0.9,
                          impact=Impact(ms_per_step=pct, pct_of_step=pct, gpu_hours_per_1000_steps=0.01),
                          evidence=Evidence(figures={}), recommendation="r")],
    )


def _write(folder: Path, content: str | bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "findings.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def _doc(**changes) -> str:
    doc = json.loads(_analysis().model_dump_json())
    doc.update(changes)
    return json.dumps(doc)


BAD = {
    "not-json": ("not json{", "not a findings.json: not JSON (Expecting value: line 1 column 1 (char 0))"),
    "not-utf8": (b"\xff\xfe{}", "not a findings.json: not UTF-8 text (invalid start byte at byte 0)"),
    "deep": ("[" * 100_000 + "]" * 100_000, "not a findings.json: JSON nested too deeply"),
    "array": ("[1, 2]", "not a findings.json: a JSON array, not an object with schema_version, job, features, "
                        "bottleneck, findings"),
    "a-trace": ('{"traceEvents": []}', "not a findings.json: none of schema_version, job, features, bottleneck, "
                                       "findings (top-level keys: traceEvents)"),
    "missing": ('{"schema_version": "1.0", "findings": []}',
                "not a findings.json: tool_version: Field required; 4 more problems"),
    "wrong-type": (_doc(findings={"a": 1}), "not a findings.json: findings: Input should be a valid list"),
    "deep-field": (_doc(findings=[{"pattern": "x"}]),
                   "not a findings.json: findings.0.title: Field required; 5 more problems"),
    "version-number": (_doc(schema_version=2), "not a findings.json: schema_version 2 is not a version string"),
    "newer": (_doc(schema_version="2.0"), "findings.json schema_version '2.0' is not one this zoomer-ar reads (1.x): "
                                          "analyse the trace again with this version"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_compare_a_findings_json_that_is_not_one_is_one_line_exit_2(tmp_path, capsys, kind):
    good = _write(tmp_path / "good", _analysis().model_dump_json())
    bad = _write(tmp_path / "bad", BAD[kind][0])
    for args in ([good, bad], [bad, good], [good, bad.parent]):
        assert main(["compare", *map(str, args)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"zoomer-ar: error: {bad}: {BAD[kind][1]}\n"


@pytest.mark.parametrize("kind", ["missing", "newer"])
def test_record_checks_every_file_before_recording_any(tmp_path, capsys, kind):
    good = _write(tmp_path / "good", _analysis().model_dump_json())
    bad = _write(tmp_path / "bad", BAD[kind][0])
    db = tmp_path / "store.db"
    assert main(["record", str(good), str(bad), "--db", str(db)]) == 2
    assert capsys.readouterr().err == f"zoomer-ar: error: {bad}: {BAD[kind][1]}\n"
    if db.exists():  # nothing recorded (the good file came first: it was recorded before the bad one was read)
        import sqlite3

        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM analyses").fetchone() == (0,)


def test_compatible_findings_json_still_compare(tmp_path, capsys):
    before = _write(tmp_path / "a", _analysis(pct=10.0).model_dump_json())
    doc = json.loads(_analysis(pct=4.0).model_dump_json())
    doc["schema_version"] = "1.7"  # a later minor version, with a field this version does not know
    doc["something_new"] = {"x": 1}
    after = _write(tmp_path / "b", json.dumps(doc))
    old = json.loads(_analysis(pct=4.0).model_dump_json())
    del old["schema_version"]  # none: read as this version
    older = _write(tmp_path / "c", json.dumps(old))
    for b in (after, older):
        assert main(["compare", str(before), str(b), "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["reduced"] == ["sync-point"]
