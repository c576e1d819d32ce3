"""`zoomer-ar fix --diff` patches that `git apply` accepts whatever the lines hold (form feeds,
U+2028 in strings, old-Mac CR-only endings, lines starting with "--"), the shared line splitting,
and the paths a diff names for `fix FILE --diff`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.fix import engine
from zoomer_ar.fix.lines import LineMap, has_lone_cr, split_git_lines, split_lines

GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git not installed")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
}

# the audit's repro files (t2/ff.py, t2/ff2.py, t3/mac.py)
FORM_FEED = b"import torch\n\x0c\nopt = torch.optim.Adam(params, lr=1e-3, foreach=False)\nx = 1\n"
LINE_SEP = 'import torch\nopt = torch.optim.Adam(params, lr=1e-3, foreach=False)\ns = "a\u2028b"  # ls\ny = 2\n'.encode()
MAC = (b"import torch\rfrom torch.utils.data import DataLoader\rloader = DataLoader(ds, batch_size=32)\r"
       b"model = Net().cuda()\ropt = torch.optim.SGD(model.parameters(), lr=0.1,  # c\r                      momentum=0.9)\r"
       b"for step, (x, y) in enumerate(loader):\r    torch.cuda.synchronize()\r    loss = model(x).sum()\r"
       b"    loss.backward()\r    print(loss.item())\r")
TRAIN = b"import torch\nopt = torch.optim.Adam(params, lr=1e-3, foreach=False)\n"


def _git(cwd: Path, *args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([GIT or "git", *args], cwd=cwd, input=input, capture_output=True, check=check,
                          env={**os.environ, **GIT_ENV})


def _repo(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    for rel, data in files.items():
        p = path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    _git(path, "add", "-A")
    _git(path, "-c", "commit.gpgsign=false", "commit", "-q", "-m", "init")
    return path


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zoomer_ar.cli", "fix", *args], cwd=cwd, capture_output=True)


# --------------------------------------------------------------------------------------------
# Splitting
# --------------------------------------------------------------------------------------------


def test_split_lines_python_and_git_ways():
    text = "a\x0cb\n\x0c\nc\u2028d\x85e\x1c\r\nf\rg"
    assert split_lines(text) == ["a\x0cb\n", "\x0c\n", "c\u2028d\x85e\x1c\r\n", "f\r", "g"]
    assert split_git_lines(text) == ["a\x0cb\n", "\x0c\n", "c\u2028d\x85e\x1c\r\n", "f\rg"]
    for s in (text, "", "x", "x\n", "\r", "\r\n\r", "a\n\n"):
        assert "".join(split_lines(s)) == s and "".join(split_git_lines(s)) == s
    assert split_lines("") == [] and split_git_lines("x\n") == ["x\n"]
    assert not has_lone_cr("a\r\nb\n") and has_lone_cr("a\rb") and has_lone_cr("a\r")


def test_review_suggest_shares_the_implementation():
    from zoomer_ar.review import suggest

    assert suggest.split_lines is split_lines


def test_line_map_between_git_and_python_lines():
    lm = LineMap("a\rb\rc\nd\ne\rf")  # git: "a\rb\rc\n", "d\n", "e\rf"; Python: a b c d e f
    assert not lm.identity
    assert [(lm.first(g), lm.last(g)) for g in (1, 2, 3)] == [(1, 3), (4, 4), (5, 6)]
    assert [lm.git_line(n) for n in range(1, 7)] == [1, 1, 1, 2, 3, 3]
    assert lm.first(0) == 0 and lm.last(0) == 0
    plain = LineMap("a\r\nb\n")
    assert plain.identity and plain.git_line(2) == 2 and plain.first(2) == 2


# --------------------------------------------------------------------------------------------
# Diffs git accepts
# --------------------------------------------------------------------------------------------


@needs_git
@pytest.mark.parametrize("name,data", [("ff.py", FORM_FEED), ("ff2.py", LINE_SEP), ("mac.py", MAC)])
def test_fix_diff_applies_with_odd_line_breaks(tmp_path: Path, name: str, data: bytes):
    repo = _repo(tmp_path / "r", {name: data})
    proc = _cli(repo, ".", "--diff")
    assert proc.returncode == 0, proc.stderr
    patch = proc.stdout
    # git sees a CR-only file as one line without a newline; the others end with theirs
    assert patch.count(b"\\ No newline at end of file") == (2 if name == "mac.py" else 0)
    check = _git(repo, "apply", "--check", "-", input=patch, check=False)
    assert check.returncode == 0, check.stderr.decode()
    _git(repo, "apply", "-", input=patch)
    # the patch does exactly what --apply does
    applied = (repo / name).read_bytes()
    (repo / name).write_bytes(data)
    assert engine.apply(engine.run(repo, fix=True))
    assert (repo / name).read_bytes() == applied != data


@needs_git
def test_removed_and_added_lines_that_look_like_headers_keep_their_crlf(tmp_path: Path):
    before = "--x\r\ny = 1\r\n"
    after = "++x\r\ny = 1\r\n"
    repo = _repo(tmp_path / "r", {"m.py": before.encode()})
    patch = engine.unified_diff("m.py", before, after)
    assert "---x\r\n" in patch and "+++x\r\n" in patch
    _git(repo, "apply", "-", input=patch.encode())
    assert (repo / "m.py").read_bytes() == after.encode()


@needs_git
def test_odd_file_names_are_quoted_as_git_quotes_them(tmp_path: Path):
    """A file name holding a newline split its ---/+++ header line: git apply refused the whole
    patch ('patch fragment without header'), every other file's fix with it. Names with a
    newline, tab, quote or backslash are now quoted the way git writes them."""
    src = b"import torch\nfor x in range(3):\n    torch.cuda.empty_cache()\n"
    names = ["new\nline.py", "tab\tname.py", 'quo"te.py', "back\\slash.py", "plain.py", "\u00fc.py"]
    repo = _repo(tmp_path / "r", {n: src for n in names})
    proc = _cli(repo, ".", "--diff")
    assert proc.returncode == 0, proc.stderr
    assert b'--- "a/new\\nline.py"\n+++ "b/new\\nline.py"\n' in proc.stdout
    assert b"--- a/plain.py\n" in proc.stdout and "--- a/\u00fc.py\n".encode() in proc.stdout
    _git(repo, "apply", "-", input=proc.stdout)
    assert all((repo / n).read_bytes().endswith(b"    pass\n") for n in names)


def test_no_newline_marker_only_at_the_end():
    d = engine.unified_diff("x.py", "a\x0c= 1\nb\u2028= 2", "a\x0c= 1\nb\u2028= 3")
    assert d.count("\\ No newline at end of file") == 2 and d.endswith("+b\u2028= 3\n\\ No newline at end of file\n")
    mac = engine.unified_diff("m.py", "a = 1\rb = 2\r", "a = 1\rb = 3\r")
    assert mac == "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a = 1\rb = 2\r\n\\ No newline at end of file\n+a = 1\rb = 3\r\n\\ No newline at end of file\n"


# --------------------------------------------------------------------------------------------
# Paths in `fix FILE --diff`
# --------------------------------------------------------------------------------------------


@needs_git
def test_fix_file_diff_patches_that_file_from_the_current_directory(tmp_path: Path):
    """r4: identical src/train.py and train.py; the patch for src/train.py must not touch ./train.py."""
    repo = _repo(tmp_path / "r", {"src/train.py": TRAIN, "train.py": TRAIN})
    proc = _cli(repo, "src/train.py", "--diff")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(b"--- a/src/train.py\n+++ b/src/train.py\n")
    _git(repo, "apply", "-", input=proc.stdout)
    assert (repo / "train.py").read_bytes() == TRAIN
    assert b"foreach=True" in (repo / "src" / "train.py").read_bytes()


@needs_git
def test_fix_file_diff_from_a_subfolder_and_from_outside(tmp_path: Path):
    repo = _repo(tmp_path / "r", {"src/train.py": TRAIN, "train.py": TRAIN})
    inside = _cli(repo / "src", "train.py", "--diff")
    assert inside.stdout.startswith(b"--- a/train.py\n")
    _git(repo / "src", "apply", "-", input=inside.stdout)
    assert b"foreach=True" in (repo / "src" / "train.py").read_bytes() and (repo / "train.py").read_bytes() == TRAIN
    _git(repo, "checkout", "-q", "--", ".")
    # a file outside the current directory: named from the top of its git work tree
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = _cli(elsewhere, str(repo / "src" / "train.py"), "--diff")
    assert outside.stdout.startswith(b"--- a/src/train.py\n")
    _git(repo, "apply", "-", input=outside.stdout)
    assert b"foreach=True" in (repo / "src" / "train.py").read_bytes() and (repo / "train.py").read_bytes() == TRAIN


def test_folder_diffs_stay_relative_to_the_folder(tmp_path: Path):
    """A folder root (and so analyze --source's patch.diff) names files relative to it."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_bytes(TRAIN)
    assert engine.run(tmp_path / "src", fix=True).diff().startswith("--- a/train.py\n")
    proc = _cli(tmp_path, "src", "--diff")
    assert proc.stdout.startswith(b"--- a/train.py\n")
    # findings keep naming the file as before
    res = engine.run(tmp_path / "src" / "train.py", fix=True)
    assert res.files[0].path == "train.py"


def test_indent_at_counts_lines_as_libcst_does():
    """A form feed on a line of its own is no line break for Python: the indentation of a node
    after it is read from its own line (str.splitlines would shift every later line by one)."""
    import libcst as cst

    from zoomer_ar.fix.base import Context

    source = "def f():\n    a = 1\n\x0c\n    if a:\n        b = 2\n"
    ctx = Context(source, "ff.py")
    stmt = next(n for n in ctx.module.body[0].body.body if isinstance(n, cst.If)).body.body[0]
    assert ctx.indent_at(stmt) == "        "
