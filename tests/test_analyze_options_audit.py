"""`analyze` options alone and combined: refused up front when they make no sense, and never leave an
output folder or a partial set of outputs behind when the command does not finish."""

from __future__ import annotations

from pathlib import Path

import pytest

import zoomer_ar.analyze_cli as analyze_cli
from zoomer_ar.cli import main

REPO = Path(__file__).resolve().parents[1]
SYNC = REPO / "examples" / "traces" / "sync_point"


def _no_analysis(monkeypatch):
    def analysed(*a, **k):
        raise AssertionError("the trace was analysed before the options were checked")

    monkeypatch.setattr(analyze_cli, "analyze_path", analysed)


@pytest.mark.parametrize("option", [["--team", "x"], ["--owner", "o"], ["--week", "2026-W10"], ["--db", "s.db"],
                                    ["--job", "j"], ["--gpu-type", "H100"], ["--recorded-at", "2026-03-01T00:00:00"]])
def test_a_store_option_without_record_is_refused_before_any_work(tmp_path, monkeypatch, capsys, option):
    """--team (--week, --db...) without --record was refused only after the whole analysis (minutes on a
    large trace), and left the empty zoomer-out/<job> folder it had made."""
    monkeypatch.chdir(tmp_path)
    _no_analysis(monkeypatch)
    assert main(["analyze", str(SYNC), "--no-progress", *option]) == 2
    assert f"{option[0]} needs --record" in capsys.readouterr().err
    assert not (tmp_path / "zoomer-out").exists()


def test_a_failed_record_leaves_no_empty_output_folder(tmp_path, monkeypatch, capsys):
    """--record into a store that cannot be used failed after the analysis and left the output folder
    the command had made, empty; it is removed as when the analysis itself fails."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "sync"
    assert main(["analyze", str(SYNC), "--no-progress", "--out", str(out), "--record", "--db", "foo://x"]) == 2
    assert "not a usable store URL" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("options, words", [
    (["--no-files", "--out", "OUT"], "--out names the folder for the report files, and --no-files writes none"),
    (["--fix-select", "sync-point"], "--fix-select chooses the fixers of patch.diff, which needs --source"),
    (["--fix-select", "sync-point", "--source", str(REPO / "training_data" / "scenarios"), "--no-files"],
     "--fix-select chooses the fixers of patch.diff, and --no-files writes no patch.diff"),
])
def test_options_that_would_be_ignored_are_usage_errors(tmp_path, monkeypatch, capsys, options, words):
    """--out with --no-files, --fix-select without --source or with --no-files did nothing, silently (no
    folder, no patch.diff, exit 0): the user believed the option had taken effect."""
    monkeypatch.chdir(tmp_path)
    _no_analysis(monkeypatch)
    assert main(["analyze", str(SYNC), "--no-progress", *options]) == 2
    assert words in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("earlier", [False, True])
def test_ctrl_c_while_the_outputs_are_written_leaves_the_folder_as_it_was(tmp_path, monkeypatch, capsys, earlier):
    """Ctrl-C after findings.json was written and before the other outputs left a findings.json with no
    reports (in a folder the command made, kept), or the new findings.json beside an earlier run's
    reports, patch and spec; the outputs are now rendered apart and moved into place at the end."""
    out = tmp_path / "out"
    if earlier:
        assert main(["analyze", str(REPO / "examples" / "traces" / "clean"), "--out", str(out), "--no-progress"]) == 0
        before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = analyze_cli.write_fix_outputs

    def interrupted(*a, **k):
        real(*a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(analyze_cli, "write_fix_outputs", interrupted)
    assert main(["analyze", str(SYNC), "--out", str(out), "--no-progress"]) == 130
    if earlier:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert not out.exists()


def test_a_models_dir_that_is_not_there_is_noted(tmp_path, monkeypatch, capsys):
    """ZOOMER_MODELS_DIR naming a folder that does not exist (a typo) gave the rules' findings alone
    with no word of it, as if no model had been promoted."""
    import json

    monkeypatch.setenv("ZOOMER_MODELS_DIR", str(tmp_path / "nope"))
    assert main(["analyze", str(SYNC), "--no-files", "--format", "json", "--no-progress"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(f"ZOOMER_MODELS_DIR names {tmp_path / 'nope'}, which is not a folder" in n for n in notes), notes


def test_compare_reads_analyze_format_json_saved_under_any_name(tmp_path, capsys):
    """`analyze --format json > before.json` then `compare before.json AFTER` was refused: a findings
    document not named findings.json was read as a trace ("not a Kineto trace: no 'traceEvents'")."""
    import json

    assert main(["analyze", str(SYNC), "--no-files", "--format", "json", "--no-progress"]) == 0
    saved = tmp_path / "before.json"
    saved.write_text(capsys.readouterr().out)
    assert main(["compare", str(saved), str(SYNC), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["speedup"] == 1.0 and out["resolved"] == [] and out["new"] == []
    doc = json.loads(saved.read_text())
    doc["schema_version"] = "9.0"  # and one of another major version says so, as under its own name
    saved.write_text(json.dumps(doc))
    assert main(["compare", str(saved), str(SYNC)]) == 2
    assert "schema_version '9.0' is not one this zoomer-ar reads" in capsys.readouterr().err


@pytest.mark.parametrize("inside", ["", "reports", "a/b"])
def test_an_out_folder_in_the_input_job_folder_is_refused(tmp_path, monkeypatch, capsys, inside):
    """--out RANKDIR wrote findings.json and the reports among the rank files (exit 0), and every later
    analysis of the folder skipped findings.json with a note; --out RANKDIR/sub put them below it."""
    job = tmp_path / "job"
    job.mkdir()
    for f in SYNC.iterdir():
        (job / f.name).write_bytes(f.read_bytes())
    before = sorted(p.name for p in job.iterdir())
    _no_analysis(monkeypatch)
    out = job / inside if inside else job
    assert main(["analyze", str(job), "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out is" in err and "input job folder" in err, err
    assert sorted(p.name for p in job.iterdir()) == before


def test_an_out_folder_beside_the_job_folder_is_written(tmp_path, monkeypatch, capsys):
    job = tmp_path / "job"
    job.mkdir()
    for f in SYNC.iterdir():
        (job / f.name).write_bytes(f.read_bytes())
    assert main(["analyze", str(job), "--no-progress", "--out", str(tmp_path / "job-out")]) == 0
    assert (tmp_path / "job-out" / "findings.json").is_file()


@pytest.mark.parametrize("name, folder", [("../escaped", ".._escaped"), ("team/run 5", "team_run 5"), ("..", "_..")])
def test_a_job_name_with_path_separators_stays_one_folder_in_zoomer_out(tmp_path, monkeypatch, capsys, name, folder):
    """--name ../escaped wrote the reports to ./escaped, outside zoomer-out/ (../../x: two levels up),
    and --name team/run into a folder below zoomer-out/team/."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["analyze", str(SYNC), "--no-progress", "--name", name]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert sorted(p.name for p in work.iterdir()) == ["zoomer-out"]
    assert [p.name for p in (work / "zoomer-out").iterdir()] == [folder]
    assert (work / "zoomer-out" / folder / "findings.json").is_file()


@pytest.mark.parametrize("name", ["a\nb", "x\x1b[31m", "", " padded"])
def test_a_name_with_control_characters_is_refused_before_any_work(tmp_path, monkeypatch, capsys, name):
    """--name with a newline or an escape sequence was taken into every report's title and the output folder's
    name, and refused only by --record after the whole analysis; it is refused as --job is, before any work."""
    monkeypatch.chdir(tmp_path)
    _no_analysis(monkeypatch)
    assert main(["analyze", str(SYNC), "--name", name, "--no-progress"]) == 2
    assert "--name" in capsys.readouterr().err
    assert not (tmp_path / "zoomer-out").exists()
