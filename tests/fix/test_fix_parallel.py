"""`zoomer-ar fix` reads large trees in worker processes (`--jobs`, default the CPU count): the
findings, the diff, the errors and the exit status are those of one process, file for file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.fix import engine
from zoomer_ar.fix.registry import load_registry

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """Every fixer's INVALID and VALID examples as files of their own, the scenario programs, a
    file that does not parse, a notebook and a file in another encoding: more than
    PARALLEL_MIN_FILES files."""
    root = tmp_path_factory.mktemp("tree")
    k = 0
    for cls in load_registry().fixers:
        for ex in cls.INVALID:
            (root / f"bad_{k:03d}.py").write_text(ex.before)
            k += 1
        for src in cls.VALID:
            (root / "ok").mkdir(exist_ok=True)
            (root / "ok" / f"ok_{k:03d}.py").write_text(src)
            k += 1
    shutil.copytree(REPO / "training_data" / "scenarios", root / "scenarios", ignore=shutil.ignore_patterns("*.yaml", "*.md"))
    (root / "broken.py").write_text("def f(:\n    pass\n")
    (root / "latin.py").write_bytes("# -*- coding: latin-1 -*-\nimport torch\nname = 'caf\xe9'\nfor b in loader:\n"
                                    "    torch.cuda.empty_cache()\n".encode("latin-1"))
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "source": ["import torch\n", "for b in loader:\n",
                                                                       "    torch.cuda.synchronize()\n"],
                     "outputs": [], "execution_count": None}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (root / "nb.ipynb").write_text(json.dumps(nb))
    assert sum(1 for _ in root.rglob("*.py")) >= engine.PARALLEL_MIN_FILES
    return root


def _summary(result: engine.RunResult) -> list:
    return [(f.path, f.error, f.before, f.after, [m.model_dump() for m in f.findings]) for f in result.files]


def test_workers_give_the_same_result_file_for_file(tree):
    one = engine.run(tree, fix=True)
    two = engine.run(tree, fix=True, jobs=2)
    assert _summary(two) == _summary(one)
    assert two.diff_bytes() == one.diff_bytes() and one.diff_bytes()
    assert any(f.error for f in one.files)  # the broken file is reported by both
    tasks = [(tree, q, True, None) for q in engine.iter_source_files(tree)]
    pooled = engine._run_parallel(tasks, 2, ([], [], None))  # the pool itself ran (no fallback)
    assert pooled is not None and [f.after for f in pooled] == [f.after for f in one.files]
    picked = engine.run(tree, fix=True, jobs=2, select="sync-point", ignore="loop-item-sync")
    assert _summary(picked) == _summary(engine.run(tree, fix=True, select="sync-point", ignore="loop-item-sync"))
    assert {m.pattern for m in picked.findings} <= {"sync-point"}


def test_the_cli_output_does_not_depend_on_jobs(tree, capsysbinary):  # the diff holds latin-1 bytes
    outs = []
    for jobs in ("1", "2"):
        rc = main(["fix", str(tree), "--diff", "--jobs", jobs])
        outs.append((rc, *capsysbinary.readouterr()))
    assert outs[0] == outs[1]
    assert outs[0][0] == 0 and b"+++ b/latin.py" in outs[0][1]
    assert main(["fix", str(tree), "--jobs", "0"]) == 2  # a count below 1 is refused like other bad options


@pytest.mark.parametrize("jobs", [1, 2])
def test_progress_is_called_once_per_file_in_order(tree, jobs):
    seen: list[tuple[int, int]] = []
    result = engine.run(tree, fix=False, jobs=jobs, progress=lambda done, total: seen.append((done, total)))
    n = len(result.files)
    assert seen == [(k, n) for k in range(1, n + 1)]


def test_the_bar_draws_on_a_terminal_only(tree, monkeypatch):
    from zoomer_ar.fix import cli as fix_cli

    with fix_cli._progress_bar() as progress:  # pytest's stderr is not a terminal
        assert progress is None
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda self: True))
    with fix_cli._progress_bar() as progress:
        assert progress is not None
        progress(1, fix_cli.PROGRESS_MIN_FILES - 1)  # a small tree: no bar is started
        progress(1, 200)
        progress(200, 200)
