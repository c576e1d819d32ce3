"""The directory engine: walking, diffs that `git apply` accepts, in-place application."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.fix import engine

GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git not installed")

TRAIN = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=8)  # the loader
opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
if __name__ == "__main__":  # spawned loader workers import the script: the loop must not run then
    for i, (x, y) in enumerate(loader):
        x = x.to("cuda")
        loss = model(x).sum()
        loss.backward()
        opt.zero_grad(set_to_none=False)
        torch.cuda.empty_cache()
        print(loss.item())
"""

MODEL = """\
import torch.nn as nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3),
            nn.BatchNorm2d(8),
        )
"""

BROKEN = "def broken(:\n    pass\n"


def _git(cwd: Path, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GIT, "-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "core.autocrlf=false", *args],
        cwd=cwd,
        input=input,
        capture_output=True,
        check=check,
    )


def _make_project(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    (root / "pkg" / "model.py").write_text(MODEL)
    (root / "broken.py").write_text(BROKEN)
    # CRLF line endings
    (root / "pkg" / "crlf.py").write_bytes(b"import torch\r\nfor b in loader:\r\n    torch.cuda.synchronize()\r\n    step(b)\r\n")
    # latin-1 with a coding cookie and a non-ASCII comment
    (root / "pkg" / "latin.py").write_bytes(
        "# -*- coding: latin-1 -*-\nimport torch\n# caf\xe9\nfor b in loader:\n    torch.cuda.empty_cache()  # \xe9t\xe9\n    step(b)\n".encode("latin-1")
    )
    # UTF-8 BOM
    (root / "bom.py").write_bytes("\ufeffimport torch\nfor b in loader:\n    torch.cuda.empty_cache()\n    step(b)\n".encode("utf-8"))
    # no newline at end of file
    (root / "nonl.py").write_text("import torch\nopt = torch.optim.Adam(params, foreach=False)")
    # a file name with a space
    (root / "pkg" / "my model.py").write_text("import torch\nopt = torch.optim.AdamW(p, foreach=False)\n")
    # an executable script keeps its mode
    script = root / "run.py"
    script.write_text("#!/usr/bin/env python\nimport torch\nopt = torch.optim.RMSprop(p, foreach=False)\n")
    script.chmod(0o755)
    # things that must not be touched
    for skipped in (".hidden", ".venv/lib/python3.11/site-packages/torchy", "node_modules", "env2"):
        d = root / skipped
        d.mkdir(parents=True)
        (d / "bad.py").write_text("import torch\nopt = torch.optim.Adam(params, foreach=False)\n")
    (root / "env2" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "README.txt").write_text("not python\n")


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    _make_project(root)
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_a_package_named_env_is_the_programs_code_not_a_virtualenv(tmp_path: Path):
    """`env/` and `venv/` were skipped by name alone: a reinforcement-learning program's `env`
    package (env/__init__.py, env/cartpole.py) was never read, silently. A folder of those names
    is still skipped when it is not a package (a virtualenv has no __init__.py)."""
    src = "import torch\nfor x in range(3):\n    torch.cuda.empty_cache()\n"
    for rel in ("env/__init__.py", "env/cartpole.py", "venv/lib/m.py", "envs/venv/x.py", "train.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("" if rel.endswith("__init__.py") else src)
    files = [p.relative_to(tmp_path).as_posix() for p in engine.iter_source_files(tmp_path)]
    assert files == ["train.py", "env/__init__.py", "env/cartpole.py"]


def test_setuptools_build_output_is_not_the_programs_code(tmp_path: Path):
    """`build/lib/pkg/train.py` (setuptools' copy of the program) was read and fixed beside `pkg/train.py`:
    the patch changed both. A `build` folder holding lib/lib.*/bdist.* is skipped; a package or a
    folder of scripts named build is read."""
    src = "import torch\nfor x in range(3):\n    torch.cuda.empty_cache()\n"
    for rel in ("pkg/__init__.py", "pkg/train.py", "build/lib/pkg/train.py", "build/bdist.linux-x86_64/x.py",
                "tools/build/make_data.py", "app/build/__init__.py", "app/build/lib/k.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("" if rel.endswith("__init__.py") else src)
    files = [p.relative_to(tmp_path).as_posix() for p in engine.iter_source_files(tmp_path)]
    assert files == ["app/build/__init__.py", "app/build/lib/k.py", "pkg/__init__.py", "pkg/train.py",
                     "tools/build/make_data.py"]


def test_walk_skips_hidden_venv_and_links(project: Path, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("import torch\nopt = torch.optim.Adam(params, foreach=False)\n")
    (project / "link_dir").symlink_to(outside, target_is_directory=True)
    (project / "link.py").symlink_to(outside / "victim.py")
    files = [p.relative_to(project).as_posix() for p in engine.iter_python_files(project)]
    assert set(files) == {"bom.py", "broken.py", "nonl.py", "run.py", "train.py", "pkg/crlf.py", "pkg/latin.py", "pkg/model.py", "pkg/my model.py"}
    before = (outside / "victim.py").read_bytes()
    engine.apply(engine.run(project, fix=True))
    assert (outside / "victim.py").read_bytes() == before
    assert (project / ".hidden" / "bad.py").read_text().endswith("torch.optim.Adam(params, foreach=False)\n")


def test_broken_file_is_reported_not_fatal(project: Path):
    result = engine.run(project, fix=True)
    assert result.errors == ["broken.py:1:12: cannot parse: invalid syntax"]
    assert {f.path for f in result.changed} >= {"train.py", "pkg/model.py", "pkg/crlf.py", "pkg/latin.py", "bom.py", "nonl.py"}


def test_encodings_and_line_endings_are_kept(project: Path):
    engine.apply(engine.run(project, fix=True))
    crlf = (project / "pkg" / "crlf.py").read_bytes()
    assert crlf == b"import torch\r\nfor b in loader:\r\n    step(b)\r\n"
    latin = (project / "pkg" / "latin.py").read_bytes()
    assert latin.decode("latin-1") == "# -*- coding: latin-1 -*-\nimport torch\n# caf\xe9\nfor b in loader:\n    # \xe9t\xe9\n    step(b)\n"
    bom = (project / "bom.py").read_bytes()
    assert bom.startswith(b"\xef\xbb\xbfimport torch\n") and b"empty_cache" not in bom
    assert (project / "nonl.py").read_text() == "import torch\nopt = torch.optim.Adam(params, foreach=True)"
    assert stat.S_IMODE((project / "run.py").stat().st_mode) == 0o755


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file to another user needs root")
def test_apply_as_root_keeps_the_owner_and_group(project: Path):
    """root fixing a user's tree (a container, sudo) used to leave root-owned files: a file of
    mode 0640 was then unreadable to the user who owned it."""
    target = project / "train.py"
    os.chown(target, 65534, 65534)
    target.chmod(0o640)
    engine.apply(engine.run(project, fix=True))
    st = target.stat()
    assert "empty_cache" not in target.read_text()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o640)


def test_apply_rewrites_a_file_whose_name_is_near_the_length_limit(tmp_path: Path, capsys):
    """The temp file's name held the whole file name: a 250-character name made it too long to
    create (exit 1, 'cannot write: File name too long')."""
    for name in ("a" * 247 + ".py", "\u00e9" * 123 + ".py"):  # 250 and 249 bytes
        (tmp_path / name).write_text("import torch\nfor x in range(3):\n    torch.cuda.empty_cache()\n")
    assert main(["fix", str(tmp_path), "--apply"]) == 0
    assert "cannot write" not in capsys.readouterr().err
    assert sorted(p.read_text().splitlines()[-1] for p in tmp_path.iterdir()) == ["    pass", "    pass"]


def test_apply_leaves_a_read_only_file_alone(project: Path, capsys):
    """A file marked read-only (chmod a-w; a Perforce checkout before `p4 edit`) was rewritten
    anyway: the atomic replacement goes through the folder, which stays writable. It is now left
    unchanged and named (exit 1: a file could not be written); the others are fixed."""
    target = project / "train.py"
    target.chmod(0o444)
    before = target.read_bytes()
    rc = main(["fix", str(project), "--apply"])
    err = capsys.readouterr().err
    assert rc == 1
    assert target.read_bytes() == before and stat.S_IMODE(target.stat().st_mode) == 0o444
    assert f"zoomer-ar: skipped {project / 'train.py'}: cannot write: a read-only file; left unchanged" in err.splitlines()
    assert "empty_cache" not in (project / "bom.py").read_text()


@needs_git
def test_diff_passes_git_apply_and_equals_apply(project: Path, tmp_path: Path):
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "init")
    original = _snapshot(project)

    result = engine.run(project, fix=True)
    patch = result.diff_bytes()
    assert patch.startswith(b"--- a/")
    check = _git(project, "apply", "--check", "-v", "-", input=patch, check=False)
    assert check.returncode == 0, check.stderr.decode()

    # the CLI prints the same patch
    cli_patch = subprocess.run(
        [sys.executable, "-m", "zoomer_ar.cli", "fix", str(project), "--diff"], capture_output=True, check=True
    ).stdout
    assert cli_patch == patch

    _git(project, "apply", "-", input=patch)
    patched = _snapshot(project)
    _git(project, "checkout", "--", ".")
    assert _snapshot(project) == original

    assert main(["fix", str(project), "--apply"]) == 0
    applied = _snapshot(project)
    assert applied == patched
    assert applied != original

    # --apply twice changes nothing the second time; --diff is then empty
    assert main(["fix", str(project), "--apply"]) == 0
    assert _snapshot(project) == applied
    assert engine.run(project, fix=True).diff_bytes() == b""


@needs_git
def test_patch_applies_with_patch_p1_layout(project: Path):
    """Paths are relative to DIR with a/ and b/ prefixes (git apply from inside DIR)."""
    result = engine.run(project, fix=True)
    text = result.diff()
    headers = [ln for ln in text.splitlines() if ln.startswith(("--- ", "+++ "))]
    assert "--- a/pkg/model.py" in headers and "+++ b/pkg/model.py" in headers
    assert all(h[4:6] in ("a/", "b/") for h in headers)
    assert not any(str(project) in h for h in headers)


def test_apply_never_truncates_on_error(project: Path, monkeypatch: pytest.MonkeyPatch):
    target = project / "train.py"
    before = target.read_bytes()
    result = engine.run(project, fix=True)

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    engine.apply(result)
    assert target.read_bytes() == before
    assert any("cannot write" in e for e in result.errors)
    assert not [p for p in project.rglob("*.zoomer-tmp")]


def test_file_changed_while_fixing_is_left_alone(project: Path):
    target = project / "train.py"
    result = engine.run(project, fix=True)
    target.write_text(TRAIN + "# edited meanwhile\n")
    engine.apply(result)
    assert target.read_text().endswith("# edited meanwhile\n")
    assert any("changed while fixing" in e for e in result.errors)


def test_single_file_path(project: Path):
    result = engine.run(project / "pkg" / "model.py", fix=True)
    assert [f.path for f in result.files] == ["model.py"]
    assert "bias=False" in result.diff()


def test_combined_fix_pins_loader_and_adds_non_blocking(project: Path):
    engine.apply(engine.run(project, fix=True))
    text = (project / "train.py").read_text()
    assert "pin_memory=True" in text
    assert 'x = x.to("cuda", non_blocking=True)' in text
    assert "        if i % 100 == 0:\n            print(loss.item())\n" in text
    assert "empty_cache" not in text
    assert "set_to_none=True" in text
    assert "# the loader" in text
    # only pinned when dataloader-workers runs too
    (project / "train.py").write_text(TRAIN)
    engine.apply(engine.run(project, fix=True, select="non-blocking-h2d"))
    assert (project / "train.py").read_text() == TRAIN


def test_unified_diff_no_newline_marker():
    d = engine.unified_diff("x.py", "a = 1\nb = 2", "a = 1\nb = 3")
    assert d.endswith("-b = 2\n\\ No newline at end of file\n+b = 3\n\\ No newline at end of file\n")


def test_non_blocking_is_not_added_for_a_loader_the_workers_fixer_leaves_unpinned(tmp_path: Path):
    """dataloader-workers refuses an IterableDataset loader (workers would replay the stream), so it stays
    unpinned: non-blocking-h2d must not add non_blocking=True nor claim the loader pins memory."""
    src = (
        "import torch\n"
        "from torch.utils.data import DataLoader, IterableDataset\n\n\n"
        "class Stream(IterableDataset):\n"
        "    def __iter__(self):\n"
        "        yield torch.zeros(4)\n\n\n"
        "loader = DataLoader(Stream(), batch_size=None)\n"
        "for x in loader:\n"
        "    x = x.to('cuda')\n"
    )
    (tmp_path / "train.py").write_text(src)
    result = engine.run(tmp_path, fix=True, select="dataloader-workers,non-blocking-h2d")
    assert "non_blocking" not in result.diff() and "pin_memory" not in result.diff()
    messages = [f"{m.fixer}: {m.message}" for f in result.files for m in f.findings]
    assert any("non-blocking-h2d" in m and "pin the loader's memory" in m for m in messages), messages
    assert not any("the loader pins memory" in m for m in messages), messages
    # a map-style loader in the same run is pinned and gets non_blocking=True, as before
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "loader = DataLoader(TensorDataset(torch.zeros(8, 4)), batch_size=2)\n"
        "if __name__ == '__main__':\n    for (x,) in loader:\n        x = x.to('cuda')\n"
    )
    both = engine.run(tmp_path, fix=True, select="dataloader-workers,non-blocking-h2d")
    diff = both.diff()
    assert "pin_memory=True" in diff and "non_blocking=True" in diff
    said = [m.message for f in both.files for m in f.findings if m.fixer == "non-blocking-h2d"]
    assert said and all("in the same fix (dataloader-workers)" in m for m in said), said  # not yet pinned


@pytest.mark.parametrize(("name", "source"), [
    # a test module: dataloader-workers reports its loaders (workers would change what the test exercises)
    ("test_loader_speed.py",
     "from torch.utils.data import DataLoader\n\n\ndef test_epoch(ds, model):\n"
     "    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    for x, y in loader:\n"
     "        model(x.to('cuda'))\n"),
    # a script that trains as it is imported: spawned workers would import it and rerun the loop
    ("train.py",
     "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
     "loader = DataLoader(TensorDataset(torch.zeros(8, 4)), batch_size=2)\n"
     "for (x,) in loader:\n    x = x.to('cuda')\n"),
])
def test_non_blocking_waits_for_a_pin_the_workers_fixer_does_not_make(tmp_path: Path, name: str, source: str):
    """non-blocking-h2d added non_blocking=True, saying "the loader gets pin_memory=True in the same fix
    (dataloader-workers)", where dataloader-workers reports the loader and leaves it unpinned."""
    (tmp_path / name).write_text(source)
    result = engine.run(tmp_path, fix=True, select="dataloader-workers,non-blocking-h2d")
    assert result.diff() == ""
    said = {m.fixer: m for f in result.files for m in f.findings}
    assert not said["dataloader-workers"].fixable and "not changed" in said["dataloader-workers"].message
    assert not said["non-blocking-h2d"].fixable
    assert "same fix" not in said["non-blocking-h2d"].message
