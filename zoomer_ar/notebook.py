"""optimize.ipynb: a notebook that loads the findings, plots the evidence, shows and applies the
patch, and relaunches with the spec (nbformat 4.5).

Written as JSON here, laid out as `nbformat.writes` lays it out (indent 1, sorted keys, sources as
lists of lines), without importing nbformat: its import (jsonschema and format checkers) took about
a second, most of what `zoomer-ar analyze` spent on a small trace. The cell ids are the cells'
positions (`cell-1`, ...), so one analysis always writes the same notebook. tests/test_notebook.py
validates every variant against nbformat's schema and compares it with `nbformat.writes`.
"""

from __future__ import annotations

import json
from typing import Any

from .models import Analysis
from .render.filters import bottleneck_summary, fmt_ms, fmt_pct, md_code, md_text

NBFORMAT, NBFORMAT_MINOR = 4, 5  # cell ids need 4.5


def _markdown(source: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def _code(source: str) -> dict[str, Any]:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}


TOP = 5  # findings in the first cell's table


def _header(analysis: Analysis) -> str:
    """The title, the bottleneck line and the top findings, written as report.md writes them (the same
    filters: figures with thousands separators, the bottleneck sentence said once, names escaped)."""
    kind = analysis.bottleneck.type
    summary = bottleneck_summary(analysis.bottleneck.summary, analysis.features)
    rest = summary[len(kind):] if summary.startswith(kind + ":") else ": " + summary
    lines = [f"# Optimise {md_code(analysis.job.name, cell=False)} with Zoomer AR", "",
             f"Bottleneck: **{md_text(kind)}**{md_text(rest)}", ""]
    if not analysis.findings:
        return "\n".join(lines + ["No anti-pattern found."])
    lines += ["| pattern | severity | impact / step | % of step |", "|---|---|---|---|"]
    lines += [f"| {md_code(f.pattern)} | {f.severity} | {fmt_ms(f.impact.ms_per_step)} | {fmt_pct(f.impact.pct_of_step)} |"
              for f in analysis.findings[:TOP]]
    if len(analysis.findings) > TOP:
        more = len(analysis.findings) - TOP
        lines += ["", f"The top {TOP} of {len(analysis.findings)} findings; the next cell lists all {len(analysis.findings)} "
                  f"({more} more in findings.json and report.md)."]
    return "\n".join(lines)


def build_notebook(analysis: Analysis, *, has_patch: bool, has_spec: bool = True) -> dict[str, Any]:
    cells = [
        _markdown(_header(analysis)),
        _code(
            "import importlib.util, json, pathlib, shutil, subprocess, sys\n"
            "HERE = pathlib.Path('.').resolve()\n"
            "findings = json.loads((HERE / 'findings.json').read_text())\n"
            "for f in findings['findings']:\n"
            "    print(f\"{f['pattern']:<26} {f['severity']:<9} {f['impact']['ms_per_step']:>9.2f} ms/step \"\n"
            "          f\"{f['impact']['pct_of_step']:>6.1f}%  conf {f['confidence']:.2f}\")"
        ),
        _markdown("## Evidence\n\n" + ("GPU utilisation over the trace, and each finding's impact." if analysis.timeline
                                         else "Each finding's evidence figures (the trace has no GPU events: no GPU utilisation timeline).")),
        _code(
            "try:\n"
            "    import matplotlib.pyplot as plt\n"
            "except ImportError:  # no matplotlib: print the figures instead\n"
            "    plt = None\n"
            "tl = findings.get('timeline', [])\n"
            "if plt and tl:\n"
            "    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6))\n"
            "    a.fill_between([x['t_ms'] for x in tl], [x['busy_pct'] for x in tl], step='post')\n"
            "    a.set_ylabel('GPU busy %'); a.set_xlabel('ms')\n"
            "    fs = findings['findings']\n"
            "    b.barh([f['pattern'] for f in fs], [f['impact']['ms_per_step'] for f in fs])\n"
            "    b.set_xlabel('avoidable ms per step'); plt.tight_layout(); plt.show()\n"
            "else:\n"
            "    for f in findings['findings']:\n"
            "        print(f['pattern'], f['evidence']['figures'])"
        ),
    ]
    if has_patch:
        cells += [
            _markdown("## The patch\n\nSet `SOURCE` to your checkout, review the diff, then set `APPLY = True`."),
            _code(
                "SOURCE = pathlib.Path('.')  # the folder the patch paths are relative to\n"
                "APPLY = False\n"
                "patch = (HERE / 'patch.diff').read_text()\n"
                "print(patch)\n"
                "if shutil.which('git') is None:\n"
                "    print('git is not on this kernel\\'s PATH: in a shell, in SOURCE, run  git apply ' + str(HERE / 'patch.diff'))\n"
                "else:\n"
                "    check = subprocess.run(['git', 'apply', '--check', str(HERE / 'patch.diff')], cwd=SOURCE,\n"
                "                           capture_output=True, text=True)\n"
                "    print('applies cleanly' if check.returncode == 0 else check.stderr)\n"
                "    if APPLY and check.returncode == 0:\n"
                "        subprocess.run(['git', 'apply', str(HERE / 'patch.diff')], cwd=SOURCE, check=True)"
            ),
        ]
    if has_spec:
        cells += [
            _markdown("## Relaunch\n\nThe relaunch spec lists the environment and overrides; the dry run prints the command."),
            _code(
                ("" if has_patch else "SOURCE = pathlib.Path('.')  # the job's source tree: the relaunched command runs there\n")
                + "RUN = False\n"
                "# in the source tree the patch was applied to (--cwd: not the folder the trace was recorded in)\n"
                "# zoomer-ar from PATH, else the zoomer_ar package of this kernel's Python\n"
                "ZOOMER = ([shutil.which('zoomer-ar')] if shutil.which('zoomer-ar') else\n"
                "          [sys.executable, '-m', 'zoomer_ar'] if importlib.util.find_spec('zoomer_ar') else None)\n"
                "if ZOOMER is None:\n"
                "    print('zoomer-ar is not installed where this kernel runs: in a shell, run  zoomer-ar relaunch '\n"
                "          + str(HERE / 'relaunch.yaml') + ' --cwd ' + str(SOURCE) + ' --dry-run')\n"
                "else:\n"
                "    dry = subprocess.run([*ZOOMER, 'relaunch', str(HERE / 'relaunch.yaml'), '--cwd', str(SOURCE), '--dry-run'],\n"
                "                         capture_output=True, text=True)\n"
                "    print(dry.stderr + dry.stdout)\n"
                "    if RUN:\n"
                "        subprocess.run([*ZOOMER, 'relaunch', str(HERE / 'relaunch.yaml'), '--cwd', str(SOURCE)], cwd=SOURCE, check=True)"
            ),
            _markdown("Record the relaunched job (`zoomer_ar.capture`) and compare: `zoomer-ar compare BEFORE AFTER`."),
        ]
    for i, cell in enumerate(cells, 1):
        cell["id"] = f"cell-{i}"
    return {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": NBFORMAT,
        "nbformat_minor": NBFORMAT_MINOR,
    }


def notebook_json(analysis: Analysis, *, has_patch: bool, has_spec: bool = True) -> str:
    """The notebook as `nbformat.writes` writes it: sources split into lines, indent 1, sorted keys."""
    nb = build_notebook(analysis, has_patch=has_patch, has_spec=has_spec)
    for cell in nb["cells"]:
        cell["source"] = cell["source"].splitlines(True)
    return json.dumps(nb, indent=1, sort_keys=True, separators=(",", ": "), ensure_ascii=False)
