"""optimize.ipynb is written without nbformat (zoomer_ar/notebook.py): nbformat checks it here.

Every variant (with and without a patch and a relaunch spec) must be a valid nbformat 4.5
notebook, byte for byte what `nbformat.writes` writes for the same cells, and the same on every
run (cell ids are positions, not random)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from zoomer_ar.analyze import analyze_path
from zoomer_ar.notebook import build_notebook, notebook_json

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "traces" / "dataloader_bound"


@pytest.fixture(scope="module")
def analysis():
    a = analyze_path(EXAMPLE)
    assert a.findings  # the table cell lists them
    return a


@pytest.mark.parametrize("has_patch", [True, False])
@pytest.mark.parametrize("has_spec", [True, False])
def test_valid_and_as_nbformat_writes_it(analysis, has_patch, has_spec):
    text = notebook_json(analysis, has_patch=has_patch, has_spec=has_spec)
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    # the same cells built with nbformat's own constructors (ids set to ours) and written by it
    ours = build_notebook(analysis, has_patch=has_patch, has_spec=has_spec)
    cells = []
    for c in ours["cells"]:
        make = new_code_cell if c["cell_type"] == "code" else new_markdown_cell
        cells.append(make(c["source"], id=c["id"]))
    ref = new_notebook(cells=cells, metadata=ours["metadata"])
    assert text == nbformat.writes(ref)
    assert text == nbformat.writes(nb)  # a read-write round trip changes nothing
    kinds = [c.cell_type for c in nb.cells]
    assert kinds.count("code") == 2 + has_patch + has_spec
    assert any("patch.diff" in c.source for c in nb.cells) == has_patch
    assert any("relaunch.yaml" in c.source for c in nb.cells) == has_spec


def test_deterministic_and_unicode(analysis):
    renamed = analysis.model_copy(update={"job": analysis.job.model_copy(update={"name": "jöb-µs"})})
    a = notebook_json(renamed, has_patch=True)
    assert a == notebook_json(renamed, has_patch=True)
    assert "jöb-µs" in a  # not escaped, as nbformat writes it
    ids = [c["id"] for c in json.loads(a)["cells"]]
    assert ids == [f"cell-{i}" for i in range(1, len(ids) + 1)]


def test_analyze_does_not_import_nbformat(fresh_analyze):
    """Writing the notebook must not pull in nbformat (about a second of imports per run)."""
    imported, out = fresh_analyze(("nbformat", "jsonschema"))
    assert imported == []
    nbformat.validate(nbformat.read(str(out / "optimize.ipynb"), as_version=4))


def test_header_figures_as_report_md_writes_them(analysis):
    """The first cell's bottleneck line and findings table write each figure as report.md does: it
    used to print the classifier's raw sentence after the type ("**host-bound** - host-bound: ...
    (12854.02 ms per profiled step)"), impacts as "1940.04 ms", a job name with a backtick inside a
    broken code span, and a "| none | | | |" row when nothing was found."""
    from zoomer_ar.render.report import render_markdown

    big = analysis.model_copy(deep=True)
    big.job.name = "run`1"
    big.bottleneck.type = "host-bound"
    big.bottleneck.summary = "host-bound: 96% of the accounted GPU time (13250.65 ms per profiled step)"
    big.findings[0].impact.ms_per_step = 1940.041
    header = build_notebook(big, has_patch=False)["cells"][0]["source"]
    md = render_markdown(big)
    assert header.startswith("# Optimise ``run`1`` with Zoomer AR\n")
    assert "Bottleneck: **host-bound**: 96% of the accounted GPU time (13,250.65 ms per profiled step)\n" in header
    assert "| **host-bound**: 96% of the accounted GPU time (13,250.65 ms per profiled step) |" in md
    first = big.findings[0]
    assert f"| `{first.pattern}` | {first.severity} | 1,940.04 ms |" in header
    assert "| 1,940.04 ms |" in md
    empty = analysis.model_copy(update={"findings": []})
    assert build_notebook(empty, has_patch=False)["cells"][0]["source"].endswith("\n\nNo anti-pattern found.")


def test_a_trace_without_gpu_events_is_not_promised_a_gpu_timeline():
    """A CPU-only (or MTIA) trace has no GPU timeline: the Evidence cell used to announce "GPU
    utilisation over the trace" all the same."""
    cpu = build_notebook(analyze_path(EXAMPLE), has_patch=False)
    gpu = build_notebook(analyze_path(REPO / "examples" / "gpu" / "dataloader_bound"), has_patch=False)
    evidence = [c["source"] for c in cpu["cells"] if c["source"].startswith("## Evidence")]
    assert evidence and "GPU utilisation over" not in evidence[0] and "no GPU events" in evidence[0]
    assert any(c["source"].startswith("## Evidence") and "GPU utilisation over the trace" in c["source"] for c in gpu["cells"])


def test_header_says_when_its_table_is_the_top_five(analysis):
    """The first cell's table showed the first five findings without saying there were more."""
    many = analysis.model_copy(update={"findings": [analysis.findings[0]] * 7})
    header = build_notebook(many, has_patch=False)["cells"][0]["source"]
    assert header.count("| `dataloader-bound` |") == 5
    assert header.endswith("\n\nThe top 5 of 7 findings; the next cell lists all 7 (2 more in findings.json and report.md).")
    five = analysis.model_copy(update={"findings": [analysis.findings[0]] * 5})
    assert "The top" not in build_notebook(five, has_patch=False)["cells"][0]["source"]
