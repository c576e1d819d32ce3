"""`zoomer-ar compare BEFORE AFTER` with a side it cannot use: refused in one line (exit 2) before the
other side's trace is analysed, and a findings.json whose figures are not numbers is bad input, not an
internal error; a step time a findings.json does not record is unknown, not 0 ms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoomer_ar import compare as compare_mod
from zoomer_ar.cli import main

from conftest import one_error_line

REPO = Path(__file__).resolve().parents[1]
SYNC = REPO / "examples/traces/sync_point"
CLEAN = REPO / "examples/traces/sync_point_clean"


@pytest.fixture
def saved(tmp_path, capsys) -> dict:
    """sync_point's findings document (analyze --format json)."""
    assert main(["analyze", str(SYNC), "--no-files", "--format", "json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def analyses(monkeypatch) -> list[Path]:
    """The traces compare analyses (the real analysis, counted: compare analyses a trace through
    _analyse_trace, which keeps the names program_match reads)."""
    seen: list[Path] = []
    real = compare_mod._analyse_trace

    def counted(path, *args, **kwargs):
        seen.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(compare_mod, "_analyse_trace", counted)
    return seen


def test_a_missing_after_is_refused_before_the_before_trace_is_analysed(tmp_path, capsys, analyses):
    missing = tmp_path / "after_trace"
    assert main(["compare", str(SYNC), str(missing)]) == 2
    one_error_line(capsys, str(missing), "no such file or directory")
    assert analyses == []


def test_a_bad_findings_document_is_refused_before_the_other_trace_is_analysed(tmp_path, capsys, saved, analyses):
    saved["findings"] = "none"
    bad = tmp_path / "findings.json"
    bad.write_text(json.dumps(saved))
    assert main(["compare", str(SYNC), str(bad)]) == 2
    one_error_line(capsys, str(bad), "findings")
    assert analyses == []


@pytest.mark.parametrize("key,value", [("step_ms", "6.6"), ("gpu_busy_pct", "high"), ("step_ms_p50", -1.0),
                                       ("first_step_ms", float("nan")), ("profiler_steps", True)])
def test_a_feature_compare_reads_that_is_no_number_is_one_line(tmp_path, capsys, saved, key, value):
    saved["features"][key] = value
    doc = tmp_path / "before.json"
    doc.write_text(json.dumps(saved))
    assert main(["compare", str(doc), str(CLEAN)]) == 2
    one_error_line(capsys, str(doc), f"features.{key}")


def test_a_step_time_not_recorded_is_unknown_not_zero(tmp_path, capsys, saved):
    # taken for 0 ms, it made the measured gain minus the other run's whole step
    del saved["features"]["step_ms"]
    doc = tmp_path / "before.json"
    doc.write_text(json.dumps(saved))
    assert main(["compare", str(doc), str(CLEAN), "--format", "json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["step_ms"]["before"] is None and out["step_ms"]["after"] > 0
    assert out["speedup"] is None and out["measured_gain_ms"] is None
    assert main(["compare", str(doc), str(CLEAN)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("step time   - -> ") and "measured - per step" in text


def test_both_sides_good_still_compare(tmp_path, capsys, saved, analyses):
    doc = tmp_path / "before.json"
    doc.write_text(json.dumps(saved))
    assert main(["compare", str(doc), str(CLEAN), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["speedup"] == pytest.approx(out["step_ms"]["before"] / out["step_ms"]["after"])
    assert out["measured_gain_ms"] == pytest.approx(out["step_ms"]["before"] - out["step_ms"]["after"], abs=1e-4)
    assert analyses == [CLEAN]


def test_the_same_run_twice_reduces_nothing(capsys):
    # sync_point's sync-point finding has an impact of 0 ms: 0 <= half of 0 listed it as reduced
    assert main(["compare", str(SYNC), str(SYNC), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any(p["before_ms"] == 0 for p in out["persisting"])  # the case at hand
    assert out["speedup"] == 1.0 and out["resolved"] == out["reduced"] == out["new"] == []
    assert out["predicted_gain_ms"] == out["measured_gain_ms"] == 0
    assert main(["compare", str(SYNC), str(SYNC)]) == 0
    assert "reduced" not in capsys.readouterr().out


def test_analyses_of_another_feature_schema_are_said_to_measure_differently(tmp_path, capsys, saved):
    # feature schema 1.3.1 and 1.3.2 redefined the step (GPU side, then completion to completion): a
    # findings.json of 1.3.0 compared with a trace analysed now set two definitions of step_ms side by side
    saved["feature_schema_version"] = "1.3.0"
    doc = tmp_path / "before.json"
    doc.write_text(json.dumps(saved))
    assert main(["compare", str(doc), str(SYNC), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    from zoomer_ar.features import FEATURE_SCHEMA_VERSION

    assert out["feature_schema_version"] == {"before": "1.3.0", "after": FEATURE_SCHEMA_VERSION}
    said = [n for n in out["notes"] if "feature" in n]
    assert len(said) == 1 and "1.3.0" in said[0] and FEATURE_SCHEMA_VERSION in said[0]
    assert main(["compare", str(SYNC), str(SYNC), "--format", "json"]) == 0  # one version: nothing to say
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "feature" in n]
