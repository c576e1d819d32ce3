"""Where `analyze` writes and what it leaves there: distinct default folders, whole job names,
no stale files from an earlier run, the umask's file mode, and a bad --out refused up front."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from zoomer_ar.analyze_cli import OUTPUT_FILES, default_job_name
from zoomer_ar.cli import main
from zoomer_ar.relaunch import load_spec

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "examples" / "traces"


def copy_as(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def test_same_file_name_in_two_runs_gets_two_folders(tmp_path, monkeypatch, capsys):
    """D4: worker0 of two runs (here rank-0 of two examples) no longer share zoomer-out/<job>;
    analysing one of them again reuses its own folder."""
    monkeypatch.chdir(tmp_path)
    a = copy_as(TRACES / "clean" / "rank-0.pt.trace.json.gz", tmp_path / "run_a" / "rank-0.pt.trace.json.gz")
    b = copy_as(TRACES / "sync_point" / "rank-0.pt.trace.json.gz", tmp_path / "run_b" / "rank-0.pt.trace.json.gz")
    assert main(["analyze", str(a), "--no-progress"]) == 0
    assert main(["analyze", str(b), "--no-progress", "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "wrote zoomer-out/rank-0-2" in err
    first = json.loads((tmp_path / "zoomer-out" / "rank-0" / "findings.json").read_text())
    second = json.loads((tmp_path / "zoomer-out" / "rank-0-2" / "findings.json").read_text())
    assert Path(first["job"]["path"]).resolve() == a and Path(second["job"]["path"]).resolve() == b
    assert main(["analyze", str(a), "--no-progress"]) == 0
    assert "zoomer-out/rank-0/findings.json" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "zoomer-out").iterdir()) == ["rank-0", "rank-0-2"]


def test_job_name_keeps_dots_and_loses_only_trace_suffixes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace = copy_as(TRACES / "clean" / "rank-0.pt.trace.json.gz", tmp_path / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    assert main(["analyze", str(trace), "--no-progress"]) == 0
    capsys.readouterr()
    found = json.loads((tmp_path / "zoomer-out" / "Qwen_Qwen1.5-0.5B-Chat__1016005" / "findings.json").read_text())
    assert found["job"]["name"] == "Qwen_Qwen1.5-0.5B-Chat__1016005"


@pytest.mark.parametrize("name, job", [
    ("worker0.1623143089861.pt.trace.json.gz", "worker0.1623143089861"),
    ("rank-0.pt.trace.json", "rank-0"),
    ("a.b.trace.json.gz", "a.b"),
    ("run.v2.json", "run.v2"),
])
def test_default_job_name(tmp_path, name, job):
    assert default_job_name(tmp_path / name) == job


def test_reused_out_folder_keeps_no_stale_outputs(tmp_path, capsys):
    """D4: a second run into the same --out removes the first run's patch.diff (the new spec says
    patch: null), and only this tool's files: the user's own file stays."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "training_data" / "scenarios", src)
    subprocess.run(["git", "init", "-q"], cwd=src, check=True)
    out = tmp_path / "o"
    assert main(["analyze", str(TRACES / "dataloader_bound"), "--source", str(src), "--out", str(out), "--no-progress"]) == 0
    assert (out / "patch.diff").is_file()
    (out / "notes.txt").write_text("mine")
    assert main(["analyze", str(TRACES / "clean"), "--out", str(out), "--no-progress"]) == 0
    assert "removed from" in capsys.readouterr().out
    assert not (out / "patch.diff").exists() and (out / "notes.txt").read_text() == "mine"
    assert load_spec(out / "relaunch.yaml").patch is None
    assert json.loads((out / "findings.json").read_text())["job"]["name"] == "clean"


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_output_files_follow_the_umask(tmp_path, capsys, mask):
    """D6: every output file, reports and patch alike, gets 0666 & ~umask (mkstemp gave 0600)."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "training_data" / "scenarios", src)
    subprocess.run(["git", "init", "-q"], cwd=src, check=True)
    old = os.umask(mask)
    try:
        rc = main(["analyze", str(TRACES / "dataloader_bound"), "--source", str(src), "--out", str(tmp_path / "o"),
                   "--no-progress"])
    finally:
        os.umask(old)
    capsys.readouterr()
    assert rc == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "o").iterdir()}
    assert set(modes) == set(OUTPUT_FILES)
    assert set(modes.values()) == {0o666 & ~mask}


def test_out_is_an_existing_file(tmp_path, capsys):
    """D7: exit 2 with the path named, not an internal error after the analysis; the file stays."""
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert main(["analyze", str(TRACES / "clean"), "--out", str(afile), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(afile) in err and "internal error" not in err
    assert afile.read_text() == "keep"


def test_out_cannot_be_created(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = blocker / "sub"  # below a regular file: no folder can be made there, even as root
    assert main(["analyze", str(TRACES / "clean"), "--out", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(bad) in err and "internal error" not in err


def test_failed_analysis_leaves_no_empty_default_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", str(tmp_path / "missing.json.gz"), "--no-progress"]) == 2
    capsys.readouterr()
    assert not (tmp_path / "zoomer-out").exists()


def test_files_in_a_folder_that_held_no_analysis_are_left_alone(tmp_path, capsys):
    """Only a folder that held an analysis (its findings.json) loses stale outputs: a user's own
    patch.diff in the folder named by --out stays."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "patch.diff").write_text("the user's")
    assert main(["analyze", str(TRACES / "clean"), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert (out / "patch.diff").read_text() == "the user's"


def test_a_finding_whose_fixers_change_nothing_is_named(tmp_path, capsys):
    """pageable-memcpy on the GPU recording: its fixer (non-blocking-h2d) finds no DataLoader loop
    in the program, so patch.diff has nothing for it; the run says so instead of staying silent."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "training_data" / "scenarios", src)
    rc = main(["analyze", str(REPO / "examples" / "gpu" / "pageable_memcpy"), "--source", str(src),
               "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "no automatic fix for pageable-memcpy: non-blocking-h2d found nothing to change in pageable_memcpy.py" in err
    assert "no automatic fix for launch-bound" not in err  # its fixer is opt-in: named by the opt-in line


def _comm_fragment(path: Path, n_cpu_ops: int) -> Path:
    """One NCCL kernel of 50 us in a 0.2 ms window, plus n_cpu_ops host ops inside that window."""
    events = [{"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 0, "ts": 100, "dur": 50}]
    events += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 0, "tid": 1, "ts": 200 + i, "dur": 1}
               for i in range(n_cpu_ops)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 0, "tid": 1, "ts": 200, "dur": 100})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


@pytest.mark.parametrize("n_cpu_ops, capped", [(0, True), (17, True), (18, False), (40, False)])
def test_a_fragment_of_a_few_events_gets_no_severity_above_low(tmp_path, capsys, n_cpu_ops, capped):
    trace = _comm_fragment(tmp_path / "fragment.json", n_cpu_ops)  # n_cpu_ops + 2 events
    assert main(["analyze", str(trace), "--out", str(tmp_path / "out"), "--format", "json"]) == 0
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    comm = [f for f in doc["findings"] if f["pattern"] == "exposed-communication"]
    assert comm, doc["findings"]  # the pattern is still reported: a quarter of the window is exposed NCCL
    fragment_note = [n for n in doc["notes"] if "too few to stand for a training step" in n]
    if capped:
        assert comm[0]["severity"] == "low"
        assert all(f["severity"] in ("info", "low") for f in doc["findings"])
        assert fragment_note and f"only {n_cpu_ops + 2} events" in fragment_note[0]
    else:
        assert comm[0]["severity"] == "critical"  # 25% of the window: the rule's own band
        assert not fragment_note


def test_source_files_that_do_not_parse_are_named(tmp_path, capsys):
    """analyze --source skips a traced file the fixers cannot read (edited since the run, and now
    broken), and says so, as `zoomer-ar fix` does, instead of writing no patch without a word."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "training_data" / "scenarios", src)
    program = src / "dataloader_bound.py"
    program.write_text(program.read_text() + "\ndef broken(:\n    pass\n")
    out = tmp_path / "out"
    assert main(["analyze", str(TRACES / "dataloader_bound"), "--source", str(src), "--out", str(out),
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if line.startswith("note: source: not patched, ")]
    assert len(skipped) == 1 and "dataloader_bound.py:" in skipped[0] and "cannot parse" in skipped[0], err
    assert not (out / "patch.diff").exists()
    assert "found nothing to change" not in err  # the fixer did not look: the file did not parse


def test_a_full_disk_is_a_one_line_output_error(tmp_path, capsys, monkeypatch):
    """ENOSPC while writing the reports: exit 2, `cannot write <file>: No space left on device`,
    no temporary file left behind (was: internal error, exit 1)."""
    import errno

    from zoomer_ar.render import report

    real_replace = os.replace

    def full_disk(src, dst):
        if str(dst).endswith("report.md"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(src, dst)

    monkeypatch.setattr(report.os, "replace", full_disk)
    out = tmp_path / "out"
    rc = main(["analyze", str(TRACES / "dataloader_bound"), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1] == f"zoomer-ar: error: cannot write {out / 'report.md'}: No space left on device"
    assert not out.exists()  # no temporary file left behind, nor the folder the command made (empty)


def test_out_folder_that_cannot_be_created_is_an_output_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    from zoomer_ar.errors import OutputError
    from zoomer_ar.render.report import atomic_write

    with pytest.raises(OutputError, match=r"cannot write .*file/sub/a\.md: Not a directory"):
        atomic_write(blocker / "sub" / "a.md", "text")
