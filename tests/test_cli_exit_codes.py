"""The exit-code convention of the `zoomer-ar` CLI: 0 success, 2 bad or unusable user input
(unknown id or name, bad path), 1 internal error only. Commands found returning 1 for a user's
typo (`rules explain`, `history`), and `label` writing its default verdict file inside the tool's
own checkout instead of the folder it runs from. Each test failed on the code before the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.cli import main
from zoomer_ar.paths import PACKAGE_DIR
from zoomer_ar.store.db import dispose_engine
from zoomer_ar.store.record import RecordOptions, record_analysis

from conftest import EXAMPLES, REPO, SHARED_TRACES

CLEAN = EXAMPLES / "traces" / "clean"


# ---- rules ---------------------------------------------------------------------------------------


def test_rules_explain_unknown_id_is_bad_input(capsys):
    assert main(["rules", "explain", "nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "no rule with id 'nonexistent'" in err and "internal error" not in err


def test_rules_explain_and_list_still_succeed(capsys):
    assert main(["rules", "list"]) == 0
    assert main(["rules", "explain", "sync-point"]) == 0
    assert "## How to fix it" in capsys.readouterr().out


# ---- history -------------------------------------------------------------------------------------


@pytest.fixture
def store_with_alpha(tmp_path: Path):
    """A SQLite store holding one recorded run of the job `alpha`."""
    db = str(tmp_path / "store.db")
    record_analysis(analyze_path(CLEAN), RecordOptions(job="alpha"), db=db)
    yield db
    dispose_engine(db)


def test_history_of_an_unknown_job_is_bad_input(store_with_alpha, capsys):
    assert main(["history", "alpha", "--db", store_with_alpha]) == 0
    capsys.readouterr()
    assert main(["history", "nope", "--db", store_with_alpha]) == 2
    err = capsys.readouterr().err
    assert "no recorded job named 'nope'" in err and "alpha" in err  # names the jobs it does know


@pytest.mark.parametrize("command", [["history", "alpha"], ["digest"]])
def test_reading_a_missing_store_file_is_bad_input_and_creates_nothing(tmp_path, capsys, command):
    missing = tmp_path / "typo" / "store.db"
    assert main([*command, "--db", str(missing)]) == 2
    assert "no store at this path" in capsys.readouterr().err
    assert not missing.parent.exists()


# ---- label: the default verdict file follows the working directory ----------------------------------


def test_label_default_store_is_under_the_working_directory(tmp_path, monkeypatch, capsys):
    in_repo = REPO / "training_data" / "labels.jsonl"
    before = in_repo.stat().st_size if in_repo.exists() else None
    monkeypatch.chdir(tmp_path)
    assert main(["label", str(CLEAN), "--pattern", "sync-point", "--yes"]) == 0
    written = tmp_path / "training_data" / "labels.jsonl"
    assert written.is_file() and '"pattern": "sync-point"' in written.read_text()
    assert str(written.resolve()) in capsys.readouterr().out  # the absolute path written
    assert (in_repo.stat().st_size if in_repo.exists() else None) == before


def test_label_never_writes_inside_the_package(monkeypatch, capsys):
    monkeypatch.chdir(PACKAGE_DIR)
    assert main(["label", str(CLEAN), "--pattern", "sync-point", "--no"]) == 2
    assert "inside the installed zoomer_ar package" in capsys.readouterr().err
    assert not (PACKAGE_DIR / "training_data").exists()


def test_label_help_documents_the_default(capsys):
    assert main(["label", "--help"]) == 0
    assert "current folder" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", [["history", "alpha"], ["digest"]])
def test_reading_a_store_url_of_unknown_kind_is_bad_input(capsys, command):
    assert main([*command, "--db", "foo://nowhere"]) == 2
    err = capsys.readouterr().err
    assert "not a usable store URL" in err and "internal error" not in err


def test_promoting_an_unknown_model_version_is_bad_input(tmp_path, capsys):
    assert main(["models", "promote", "v9999", "--models", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no model version v9999" in err and "internal error" not in err


def test_ctrl_c_exits_130(monkeypatch, capsys, shared_traces):
    # click turns KeyboardInterrupt into Abort; the exit status is still the shell's for SIGINT (it was 1,
    # the internal-error status)
    import zoomer_ar.analyze_cli as analyze_cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(analyze_cli, "analyze_path", interrupted)
    assert main(["analyze", str(SHARED_TRACES / "param/dlrm_8ranks"), "--no-files"]) == 130
    assert "aborted" in capsys.readouterr().err


def test_sigterm_exits_143_and_removes_the_output_folder_it_made(tmp_path, shared_traces):
    """A job scheduler's SIGTERM mid-analysis unwinds like Ctrl-C: exit 143 and the output folder the
    command made is gone (the default action killed it and left the folder)."""
    import os
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "out" / "job"
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        import zoomer_ar.analyze_cli as analyze_cli

        def stopped(*a, **k):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)

        analyze_cli.analyze_path = stopped
        from zoomer_ar.cli import main
        sys.exit(main(["analyze", {str(SHARED_TRACES / "param/dlrm_8ranks")!r}, "--out", {str(out)!r}]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    assert not out.exists() and not out.parent.exists()


# ---- a reader that goes away ----------------------------------------------------------------------


def test_output_piped_into_a_reader_that_quits_exits_0(tmp_path):
    """`zoomer-ar fix DIR | head -1`: click turned the broken pipe into a silent exit 1 (the code of
    an internal error; a `set -o pipefail` script failed). Now exit 0, nothing on stderr."""
    import os
    import subprocess
    import sys

    src = "import torch\nfor x in range(3):\n    torch.cuda.empty_cache()\n"
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text(src)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        proc = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", "fix", str(tmp_path), "-j", "1"], stdout=write,
                              stderr=subprocess.PIPE, timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr and b"Exception ignored" not in proc.stderr


# ---- output that cannot be written ------------------------------------------------------------------


@pytest.mark.parametrize("args", [["rules", "list"], ["analyze", str(CLEAN), "--no-files", "--no-progress"]])
def test_an_output_stream_on_a_full_device_is_one_line_and_exit_2(args):
    """`zoomer-ar ... > /dev/full` (stdout on a full disk) was 'internal error: OSError: [Errno 28] ...', exit 1."""
    import subprocess
    import sys

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["zoomer-ar: error: cannot write the output: No space left on device"]


def test_an_oserror_naming_a_file_is_still_an_internal_error(monkeypatch, capsys):
    import errno

    import zoomer_ar.cli as cli_mod

    def boom(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", "/some/internal/file")

    monkeypatch.setattr(cli_mod.cli, "main", boom)
    assert main(["rules", "list"]) == 1
    assert "internal error: OSError" in capsys.readouterr().err
