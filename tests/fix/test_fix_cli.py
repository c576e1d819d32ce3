"""`zoomer-ar fix`: exit codes, one-line errors, --select/--ignore, suppression, formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.cli import main

SOURCE = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=8)
opt = torch.optim.Adam(model.parameters(), foreach=False)
if __name__ == "__main__":  # unguarded, spawned workers would rerun the loop: the loader keeps no workers
    for x in loader:
        torch.cuda.empty_cache()
"""


@pytest.fixture()
def proj(tmp_path: Path) -> Path:
    root = tmp_path / "p"
    root.mkdir()
    (root / "train.py").write_text(SOURCE)
    return root


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["fix", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_lists_findings(proj, capsys):
    rc, out, err = run(capsys, str(proj))
    assert rc == 0
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"{proj / 'train.py'}:4:10: dataloader-bound ")
    assert "[dataloader-workers, fixable]" in lines[0]
    assert any(" single-tensor-optimizer " in ln for ln in lines)
    assert any(" allocator-churn " in ln for ln in lines)
    assert err.strip() == "3 findings (3 fixable) in 1 file"
    assert (proj / "train.py").read_text() == SOURCE  # listing never writes


def test_missing_dir_exit_2_one_line(tmp_path, capsys):
    rc, out, err = run(capsys, str(tmp_path / "nope"))
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("zoomer-ar: error: ") and "no such file or directory" in err


def test_missing_argument_and_exclusive_modes(proj, capsys):
    assert run(capsys, "--diff", "--apply", str(proj))[0] == 2
    rc, _, err = run(capsys)
    assert rc == 2 and "missing PATH" in err


def test_empty_path_is_bad_input_not_the_current_folder(proj, capsys, monkeypatch):
    """`zoomer-ar fix "$SRC" --apply` with SRC unset ran on (and rewrote) the current folder."""
    monkeypatch.chdir(proj)
    before = {p: p.read_bytes() for p in proj.rglob("*.py")}
    rc, out, err = run(capsys, "", "--apply")
    assert rc == 2 and out == "" and err == "zoomer-ar: error: PATH is empty: name the folder (or file) to analyse ('.' for the current one)\n"
    assert {p: p.read_bytes() for p in proj.rglob("*.py")} == before


@pytest.mark.parametrize("args", [["--select", "nope"], ["--ignore", "nope"], ["-o", "bad"], ["-o", "dataloader-bound.nope=1"], ["-o", "dataloader-bound.num_workers=many"]])
def test_bad_ids_and_options_exit_2(proj, capsys, args):
    rc, out, err = run(capsys, str(proj), *args)
    assert rc == 2, err
    assert err.startswith("zoomer-ar: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("option", ["dataloader-bound.num_workers=-3", "align-gemm-dims.multiple=0", "loop-item-sync.log_every=0",
                                    "align-gemm-dims.multiple=true", "align-gemm-dims.max_growth=-1", "align-gemm-dims.max_growth=NaN",
                                    "ddp-bucket-view.bucket_cap_mb=abc", "ddp-bucket-view.bucket_cap_mb=-5"])
def test_option_values_out_of_range_exit_2(proj, capsys, option):
    """Values out of range were taken: a count of 0 or less clamped to 1 (multiple=0 silently
    turned align-gemm-dims off), a negative or NaN growth, and bucket_cap_mb (no default to type
    it) written into the DDP call as given: bucket_cap_mb='abc'."""
    rc, out, err = run(capsys, str(proj), "--select", "all", "-o", option, "--diff")
    assert rc == 2 and out == "", err
    assert err.startswith("zoomer-ar: error: fixer ") and err.count("\n") == 1


def test_select_and_ignore(proj, capsys):
    rc, out, _ = run(capsys, str(proj), "--select", "dataloader-bound,allocator-churn")
    assert rc == 0 and {ln.split()[1] for ln in out.splitlines()} == {"dataloader-bound", "allocator-churn"}
    rc, out, _ = run(capsys, str(proj), "--select", "optimizer-foreach")
    assert [ln.split()[1] for ln in out.splitlines()] == ["single-tensor-optimizer"]
    rc, out, _ = run(capsys, str(proj), "--ignore", "dataloader-bound, loop-empty-cache")
    assert [ln.split()[1] for ln in out.splitlines()] == ["single-tensor-optimizer"]


def test_diff_and_apply(proj, capsys):
    rc, out, err = run(capsys, str(proj), "--diff", "--select", "single-tensor-optimizer")
    assert rc == 0
    assert out.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+opt = torch.optim.Adam(model.parameters(), foreach=True)\n" in out
    assert (proj / "train.py").read_text() == SOURCE
    rc, out, err = run(capsys, str(proj), "--apply")
    assert rc == 0 and out.startswith("fixed ")
    text = (proj / "train.py").read_text()
    assert "foreach=True" in text and "num_workers=DATALOADER_WORKERS" in text and "empty_cache" not in text
    rc, out, err = run(capsys, str(proj), "--apply")
    assert rc == 0 and out == "" and "0 files rewritten" in err


def test_options(proj, capsys):
    rc, out, _ = run(capsys, str(proj), "--diff", "-o", "dataloader-bound.num_workers=12", "-o", "optimizer-foreach.fused=true")
    assert rc == 0
    assert "num_workers=12" in out and "fused=True" in out


def test_suppression_comments(tmp_path, capsys):
    root = tmp_path / "s"
    root.mkdir()
    (root / "a.py").write_text(
        "import torch\n"
        "opt = torch.optim.Adam(p, foreach=False)  # zoomer: ignore[single-tensor-optimizer]\n"
        "opt2 = torch.optim.SGD(p, foreach=False)  # zoomer: ignore[optimizer-foreach]\n"
        "opt3 = torch.optim.SGD(p, foreach=False)  # zoomer: ignore\n"
        "opt4 = torch.optim.SGD(p, foreach=False)  # zoomer: ignore[dataloader-bound]\n"
        "opt5 = torch.optim.SGD(  # zoomer: ignore\n"
        "    p, foreach=False,\n"
        ")\n"
        "s = '# zoomer: ignore'; opt6 = torch.optim.SGD(p, foreach=False)\n"
    )
    rc, out, _ = run(capsys, str(root))
    lines = out.splitlines()
    assert [int(ln.split(":")[1]) for ln in lines] == [5, 9]
    rc, out, _ = run(capsys, str(root), "--apply")
    text = (root / "a.py").read_text()
    assert text.count("foreach=True") == 2
    assert "opt = torch.optim.Adam(p, foreach=False)  # zoomer" in text


def test_file_level_suppression(tmp_path, capsys):
    root = tmp_path / "f"
    root.mkdir()
    (root / "a.py").write_text("# zoomer: ignore-file[allocator-churn]\nimport torch\nfor x in y:\n    torch.cuda.empty_cache()\n")
    assert run(capsys, str(root))[1] == ""


def test_opt_in_fixers_report_then_fix_when_selected(tmp_path, capsys):
    root = tmp_path / "o"
    root.mkdir()
    src = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model, device_ids=[0])\n"
    (root / "a.py").write_text(src)
    rc, out, _ = run(capsys, str(root))
    assert "extra-copy" in out and "ddp-bucket-view" in out and "opt-in" in out and "fixable" not in out
    rc, out, _ = run(capsys, str(root), "--apply")
    assert (root / "a.py").read_text() == src
    rc, out, _ = run(capsys, str(root), "--apply", "--select", "all")
    assert (root / "a.py").read_text() == src
    rc, out, _ = run(capsys, str(root), "--apply", "--select", "extra-copy", "-o", "ddp-bucket-view.bucket_cap_mb=50")
    assert (root / "a.py").read_text().endswith("DDP(model, device_ids=[0], gradient_as_bucket_view=True, bucket_cap_mb=50)\n")


def test_unparsable_file_one_line_exit_0(tmp_path, capsys):
    root = tmp_path / "b"
    root.mkdir()
    (root / "bad.py").write_text("def f(:\n    pass\n")
    (root / "bad2.py").write_bytes(b"# -*- coding: utf-8 -*-\nx = '\xff\xfe'\n")
    (root / "ok.py").write_text("import torch\nopt = torch.optim.SGD(p, foreach=False)\n")
    rc, out, err = run(capsys, str(root))
    assert rc == 0
    assert out.count("\n") == 1
    errs = [ln for ln in err.splitlines() if ln.startswith("zoomer-ar: skipped")]
    assert errs == [
        f"zoomer-ar: skipped {root / 'bad.py'}:1:7: cannot parse: invalid syntax",
        f"zoomer-ar: skipped {root / 'bad2.py'}: cannot decode: 'utf-8' codec can't decode byte 0xff in position 29: invalid start byte",
    ]


def test_skip_reasons_do_not_repeat_themselves(tmp_path, capsys, monkeypatch):
    """'skipped big.py: skipped: larger than 5 MiB' and 'cannot decode: cannot decode as utf-8'."""
    from zoomer_ar.fix import engine

    monkeypatch.setattr(engine, "MAX_FILE_BYTES", 1 << 20)
    (tmp_path / "big.py").write_text("x = 1\n" * 200_000)
    rc, out, err = run(capsys, str(tmp_path))
    assert rc == 0
    assert f"zoomer-ar: skipped {tmp_path / 'big.py'}: larger than 1 MiB, not read" in err.splitlines()


def test_a_file_name_with_a_newline_keeps_each_line_one_line(tmp_path, capsys):
    """`new\\nline.py:3:5: ...` printed the finding, the skip message and the 'fixed' line across two
    lines; the name is now quoted as git quotes it."""
    (tmp_path / "new\nline.py").write_text("import torch\nfor x in range(3):\n    torch.cuda.empty_cache()\n")
    (tmp_path / "bad\tname.py").write_text("def f(:\n")
    (tmp_path / 'quo"te.py').write_text("x = 1\n")
    rc, out, err = run(capsys, str(tmp_path))
    assert rc == 0
    assert out.startswith(f'"{tmp_path}/new\\nline.py":3:5: allocator-churn ') and out.count("\n") == 1
    assert f'zoomer-ar: skipped "{tmp_path}/bad\\tname.py":1:7: cannot parse' in err
    rc, out, err = run(capsys, str(tmp_path), "--apply")
    assert out == f'fixed "{tmp_path}/new\\nline.py" (1 finding)\n'


def test_json_format(proj, capsys):
    rc, out, err = run(capsys, str(proj), "--format", "json", "--diff")
    doc = json.loads(out)
    assert rc == 0 and err == ""
    assert doc["files"] == 1 and len(doc["findings"]) == 3 and doc["errors"] == []
    f = doc["findings"][0]
    assert {"path", "line", "column", "end_line", "end_column", "pattern", "message", "fixer", "fixable", "replacement", "edits"} <= set(f)
    assert f["path"] == "train.py" and f["line"] == 4
    assert doc["diff"].startswith("--- a/train.py")
    assert "torch-compile" in doc["fixers"] and "torch-compile" not in doc["fixing"]


def test_list_fixers(capsys):
    rc = main(["fix", "--list", "--format", "json"])
    fixers = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert {f["name"] for f in fixers if f["opt_in"]} == {"torch-compile", "ddp-bucket-view", "cpu-autocast"}


def test_entry_point_never_prints_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", "fix", str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_apply_write_failure_exit_1(proj, capsys, monkeypatch):
    import os

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    rc, out, err = run(capsys, str(proj), "--apply")
    assert rc == 1
    assert f"zoomer-ar: skipped {proj / 'train.py'}: cannot write: No space left on device" in err
    assert (proj / "train.py").read_text() == SOURCE


@pytest.mark.parametrize("header", ["# Generated by the protocol buffer compiler.  DO NOT EDIT!\n",
                                    '"""Tables for the kernels.\n\n@generated by tools/gen_tables.py\n"""\n'])
def test_generated_files_are_skipped_not_fixed(tmp_path, capsys, header):
    """A generated file (protoc's _pb2.py, an @generated module) was parsed and fixed like the user's code: its
    generator rewrites the fix away, and a 4.9 MB one took 68 s and 3.8 GB to parse."""
    body = "import torch\nfor x in range(3):\n    torch.cuda.synchronize()\n"
    gen = tmp_path / "tables_pb2.py"
    gen.write_text("# -*- coding: utf-8 -*-\n" + header + body)
    own = tmp_path / "train.py"
    own.write_text(body)
    assert main(["fix", str(tmp_path), "--apply"]) == 0
    err = capsys.readouterr().err
    assert f"skipped {gen}: a generated file (its header says" in err
    assert "1 file rewritten" in err
    assert gen.read_text() == "# -*- coding: utf-8 -*-\n" + header + body
    assert own.read_text() != body
    late = tmp_path / "late.py"  # a marker past the head is a word in the code, not a header
    late.write_text(body + "#" * 2100 + "\n# DO NOT EDIT below this line\n")
    assert main(["fix", str(late)]) == 0
    assert "generated" not in capsys.readouterr().err
