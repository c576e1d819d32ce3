"""`zoomer-ar relaunch` refuses a spec it cannot read as written: another major schema_version, a
version that is not one, or a torchrun layout below one process or one node."""

from __future__ import annotations

import pytest
import yaml

from zoomer_ar.cli import main
from zoomer_ar.relaunch import RelaunchSpec, load_spec, render_spec
from zoomer_ar.relaunch.spec import RELAUNCH_SCHEMA_VERSION, Command


def _spec_file(tmp_path, **edits) -> str:  # noqa: ANN001, ANN003
    """A torchrun spec as analyze writes it, with `edits` (top-level keys, or command.KEY) applied to its YAML."""
    spec = RelaunchSpec(job="j", command=Command(launcher="torchrun", script="train.py", nproc_per_node=8, nnodes=2))
    doc = yaml.safe_load(render_spec(spec))
    for key, value in edits.items():
        where, _, leaf = key.rpartition("__")
        (doc[where] if where else doc)[leaf] = value
    path = tmp_path / "relaunch.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize("version,says", [
    ("2.0", "'2.0' is not one this zoomer-ar reads (1.x; major version 2"),
    ("10.1", "major version 10"),
    ("banana", "'banana' is not a version"),
    ("1.2.3", "'1.2.3' is not a version"),
    ("", "'' is not a version"),
])
def test_a_spec_of_another_major_version_is_refused(tmp_path, capsys, version, says):
    """A spec saying schema_version 2.0 (or 'banana') was run as if it were this version's: its fields may mean
    something else to the zoomer-ar that wrote it. Now one line naming the file and the version, exit 2."""
    path = _spec_file(tmp_path, schema_version=version)
    assert main(["relaunch", path, "--dry-run"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and "schema_version" in err[0] and says in err[0], err
    assert captured.out == ""


@pytest.mark.parametrize("version", ["1.0", "1.1", RELAUNCH_SCHEMA_VERSION, "1.9"])
def test_specs_of_this_major_version_still_load(tmp_path, version):
    assert load_spec(_spec_file(tmp_path, schema_version=version)).schema_version == version


@pytest.mark.parametrize("key,value", [("nproc_per_node", 0), ("nproc_per_node", -4), ("nnodes", 0),
                                       ("nnodes", -1), ("nproc_per_node", True), ("nnodes", "2")])
def test_a_layout_below_one_is_refused(tmp_path, capsys, key, value):
    """command.nproc_per_node -4 became `torchrun --nproc_per_node=-4` and 0 silently dropped the option (torchrun's
    default then), `true` was read as 1; now one line naming the field, exit 2, nothing printed or run."""
    path = _spec_file(tmp_path, **{f"command__{key}": value})
    assert main(["relaunch", path, "--dry-run"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and f"command.{key}" in err[0] and "internal error" not in err[0], err
    assert captured.out == ""


def test_a_valid_layout_is_on_the_command_line(tmp_path, capsys):
    path = _spec_file(tmp_path, command__nproc_per_node=4, command__nnodes=1)
    assert main(["relaunch", path, "--dry-run"]) == 0
    assert "torchrun --nnodes=1 --nproc_per_node=4 train.py" in capsys.readouterr().out


@pytest.mark.parametrize("text,kind", [("- a\n- b\n", "list"), ("just text\n", "str"), ("42\n", "int")])
def test_a_spec_that_is_not_a_mapping_says_so(tmp_path, capsys, text, kind):
    """A relaunch.yaml holding a YAML list was refused with Python's own words: 'RelaunchSpec() argument
    after ** must be a mapping, not list'; now the line says what the file holds and what a spec is."""
    path = tmp_path / "relaunch.yaml"
    path.write_text(text)
    assert main(["relaunch", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"a YAML {kind}, not a mapping" in err[0] and "argument after" not in err[0], err


def test_a_cwd_that_does_not_exist_is_a_usage_error(tmp_path, capsys):
    """`relaunch SPEC --cwd /no/such/folder` was an internal error ('FileNotFoundError: ... No such file or
    directory: PosixPath(...)') when it came to run; now a usage error naming --cwd, exit 2, nothing run."""
    path = _spec_file(tmp_path)
    assert main(["relaunch", path, "--cwd", str(tmp_path / "no" / "such")]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--cwd'" in err and "internal error" not in err, err


def test_a_patch_that_is_not_there_is_named(tmp_path, capsys):
    """A spec whose patch file is missing was refused as 'patch does not apply in DIR: error: can't open patch';
    now the line says the spec's patch is not there and where it was looked for."""
    path = _spec_file(tmp_path, patch="patch.diff")
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    assert main(["relaunch", path, "--cwd", str(workdir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "patch patch.diff is not there" in err[0] and str(tmp_path / "patch.diff") in err[0], err


def test_a_spec_that_is_a_fifo_or_huge_is_refused_at_once(tmp_path):
    """`relaunch PIPE` (a FIFO) waited for ever for a writer, and a 300 MB YAML file took a minute and a GB
    before any answer; now each is one line, exit 2, at once."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.yaml"
    with open(huge, "w") as fh:
        fh.write("job: j\nnotes:\n")
        fh.writelines(f"  - {'x' * 1000}\n" for _ in range(2000))
    for path, says in ((fifo, "not a regular file"), (huge, "not a relaunch spec")):
        out = subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(path), "--dry-run"],
                             capture_output=True, text=True, timeout=120)
        err = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(err) == 1 and says in err[0], out.stderr
