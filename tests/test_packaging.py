"""An installed wheel works outside the checkout: the data folders (rules/, fixers/, reports/,
models/) travel inside it (setup.py: zoomer_ar/_bundled/<name>) and zoomer_ar.paths finds them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group("packaging")


def _setuptools_ok() -> bool:
    try:
        return int(version("setuptools").split(".")[0]) >= 77
    except Exception:
        return False


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    # built from a copy: pip builds in the source tree (build/, *.egg-info), and a build of the
    # checkout itself meets whatever another build or an editable install left or is writing there
    tree = root / "src"
    shutil.copytree(REPO, tree, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".pytest_cache", "training_data",
        "examples", "node_modules", "zoomer-out"))
    cmd = [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "-q", "-w", str(root / "dist")]
    if _setuptools_ok():
        cmd.append("--no-build-isolation")  # no download needed
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip wheel failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    wheel = next((root / "dist").glob("zoomer_ar-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(root / "site")
    for must in ("zoomer_ar/_bundled/rules/misaligned-gemm.yaml", "zoomer_ar/_bundled/fixers/align_gemm_dims.py",
                 "zoomer_ar/_bundled/reports/report.html.j2", "zoomer_ar/_bundled/models/CURRENT",
                 "zoomer_ar/store/migrations/script.py.mako", "zoomer_ar/synth/params.json"):
        assert must in names, f"{must} missing from the wheel"
    assert not any("__pycache__" in n or n.startswith(("tests/", "training_data/")) for n in names)
    # the compiled event reader is built into the wheel (gcc and the Python headers are here and in CI)
    assert any(n.startswith("zoomer_ar/load/_fastjson.") and n.endswith(".so") for n in names), sorted(names)[:20]
    return root / "site"


def _run(site: Path, cwd: Path, *code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ZOOMER_AR_HOME"}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, *code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_installed_package_reads_its_bundled_data(site, tmp_path):
    r = _run(site, tmp_path, "-c", "import zoomer_ar.paths as p; print(p.DATA_DIR); print(p.RULES_DIR)")
    assert r.returncode == 0, r.stderr
    data_dir, rules_dir = r.stdout.split()
    assert Path(data_dir) == site / "zoomer_ar" / "_bundled" and Path(rules_dir).is_dir()
    r = _run(site, tmp_path, "-m", "zoomer_ar", "--version")
    assert r.returncode == 0 and "reader: compiled event reader" in r.stdout, r.stdout + r.stderr


def test_installed_package_analyses_and_patches_outside_the_checkout(site, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "training_data" / "scenarios", src)
    out = tmp_path / "out"
    main = "import sys; from zoomer_ar.cli import main; sys.exit(main(sys.argv[1:]))"
    r = _run(site, tmp_path, "-c", main, "rules", "list")
    assert r.returncode == 0 and "misaligned-gemm" in r.stdout, r.stderr
    r = _run(site, tmp_path, "-c", main, "analyze", str(REPO / "examples" / "traces" / "misaligned_gemm"),
             "--source", str(src), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "misaligned-gemm" in r.stdout
    assert "1008, 1000, 64" in (out / "patch.diff").read_text()
    assert (out / "report.html").read_text().count("<html") == 1
