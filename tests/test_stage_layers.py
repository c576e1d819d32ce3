"""The pipeline's stages import only earlier ones (DEVELOPERS.md: "no stage imports a later one"):
load -> features -> detect -> fix -> render -> store. Checked on the source (imports under `if
TYPE_CHECKING:` are annotations only: the digest's renderer names the store's Digest type) and at
run time (importing a stage loads no later stage)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ORDER = ["load", "features", "detect", "fix", "render", "store"]


def _stage_imports(path: Path) -> list[tuple[int, str]]:
    """(line, zoomer_ar subpackage) of every import in the file, outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    pkg_depth = len(path.relative_to(REPO / "zoomer_ar").parts) - 1  # 1 for zoomer_ar/<stage>/x.py
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names if a.name.startswith("zoomer_ar.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("zoomer_ar."):
                    out.append((node.lineno, node.module.split(".")[1]))
            elif node.level == pkg_depth + 1:  # relative to zoomer_ar itself
                out += [(node.lineno, node.module.split(".")[0])] if node.module else \
                       [(node.lineno, a.name) for a in node.names]
    return out


def test_no_stage_imports_a_later_one_in_its_source():
    bad = []
    for i, stage in enumerate(ORDER):
        for f in sorted((REPO / "zoomer_ar" / stage).rglob("*.py")):
            for line, mod in _stage_imports(f):
                if mod in ORDER and ORDER.index(mod) > i:
                    bad.append(f"{f.relative_to(REPO)}:{line}: {stage} imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_source_check_sees_a_later_import(tmp_path, monkeypatch):
    found = {mod for _, mod in _stage_imports(REPO / "zoomer_ar" / "features" / "context.py")}
    assert {"load", "models"} <= found, found  # `from ..load.columns import ...`, `from ..models import ...`
    probe = tmp_path / "zoomer_ar" / "load" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from typing import TYPE_CHECKING\nfrom ..render import report\nif TYPE_CHECKING:\n"
                     "    from ..store import digest\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert _stage_imports(probe) == [(2, "render")]


@pytest.mark.parametrize("stage", ORDER[:-1])
def test_importing_a_stage_loads_no_later_stage(stage):
    later = ORDER[ORDER.index(stage) + 1:]
    code = (f"import sys, zoomer_ar.{stage}\n"
            f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[:2] in "
            f"[['zoomer_ar', s] for s in {later!r}])))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"importing zoomer_ar.{stage} loaded {out.stdout.strip()}"
