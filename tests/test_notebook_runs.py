"""optimize.ipynb run as a user runs it: every code cell in a real Jupyter kernel, in the folder
`analyze` wrote it to, with APPLY and RUN left False (nothing applied, nothing launched)."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

from zoomer_ar.cli import main

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "examples" / "traces" / "dataloader_bound"


def _run(notebook: Path) -> list[tuple[str, str, str]]:
    """(cell id, output type, text) of every output; errors are outputs, not exceptions."""
    nb = nbformat.read(str(notebook), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source)
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(notebook.parent)}})
    client.execute()
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            text = o.get("text") or (f"{o.get('ename')}: {o.get('evalue')}" if o.output_type == "error" else "")
            out.append((cell.id, o.output_type, text))
    return out


def _analyze(out: Path, *extra: str) -> Path:
    assert main(["analyze", str(TRACE), "--out", str(out), "--no-progress", *extra]) == 0
    return out / "optimize.ipynb"


def test_the_notebook_of_an_analysis_without_a_patch_runs(tmp_path, monkeypatch, capsys):
    """Without --source there is no patch cell, and the relaunch cell read SOURCE, which only the
    patch cell set: NameError, in every notebook of an analysis without a patch."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    notebook = _analyze(tmp_path / "out")
    capsys.readouterr()
    outputs = _run(notebook)
    assert [o for o in outputs if o[1] == "error"] == []
    text = "".join(t for _, _, t in outputs)
    assert "dataloader-bound" in text and "python dataloader_bound.py" in text  # the findings, the dry run


def test_the_relaunch_cell_runs_without_zoomer_ar_on_path(tmp_path, monkeypatch, capsys):
    """README runs `.venv/bin/zoomer-ar` without activating the venv, so a kernel often has no
    zoomer-ar on PATH: the relaunch cell failed with FileNotFoundError. It now runs the package
    with the kernel's Python; git missing from PATH is a printed line, not a traceback."""
    notebook = _analyze(tmp_path / "out", "--source", str(REPO / "training_data" / "scenarios"))
    capsys.readouterr()
    assert (notebook.parent / "patch.diff").is_file()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no zoomer-ar, no git
    outputs = _run(notebook)
    assert [o for o in outputs if o[1] == "error"] == []
    text = "".join(t for _, _, t in outputs)
    assert "git is not on this kernel's PATH" in text
    assert "python dataloader_bound.py" in text  # the dry run, by the zoomer_ar package
