"""`compare` gave a speedup from the mean of a few profiled steps without a word when those steps were
uneven (a busy machine: a before-run at cv 49% made a 5.5x "speedup" of a fix worth 1.4x by its
prediction). It now says which side's steps vary, how (median, p95, steps) and what the medians give."""

from __future__ import annotations

import json
from pathlib import Path

from zoomer_ar.cli import main
from zoomer_ar.compare import UNEVEN_STEP_CV, _load, compare

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "examples" / "gpu"


def test_a_side_with_uneven_steps_is_named_with_its_spread_and_the_median_speedup():
    before, after = _load(GPU / "dataloader_bound"), _load(GPU / "dataloader_bound_clean")
    assert after.features["step_ms_cv"] >= UNEVEN_STEP_CV > before.features["step_ms_cv"]  # the case at hand
    (note,) = [n for n in compare(before, after)["notes"] if n.startswith("uneven step times")]
    assert "after varies 55% around its mean (median 6.00 ms, p95 15.30 ms, 5 steps)" in note
    assert "before varies" not in note
    medians = before.features["step_ms_p50"] / after.features["step_ms_p50"]
    assert f"the medians give {medians:.2f}x" in note


def test_steady_runs_get_no_such_note(capsys):
    traces = REPO / "examples" / "traces"
    assert main(["compare", str(traces / "sync_point"), str(traces / "sync_point_clean"), "--format", "json"]) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("uneven")]


def test_a_findings_document_with_a_bad_spread_is_refused(tmp_path, capsys):
    saved = tmp_path / "run"
    assert main(["analyze", str(GPU / "dataloader_bound_clean"), "--out", str(saved), "--no-progress"]) == 0
    doc = json.loads((saved / "findings.json").read_text())
    doc["features"]["step_ms_cv"] = "0.5"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["compare", str(bad), str(saved / "findings.json")]) == 2
    err = capsys.readouterr().err
    assert "features.step_ms_cv: '0.5' is not a finite number" in err and len(err.strip().splitlines()) == 1
