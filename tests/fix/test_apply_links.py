"""`fix --apply` and hard links: the rename that replaced a file gave it a new inode, so a file
hard-linked elsewhere kept the old text under its other names (and the two silently parted). A
file with hard links is now rewritten in its own inode; if that write fails halfway (a real
EFBIG, from a file-size limit), the old text is put back and nothing is lost.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from zoomer_ar.cli import main

SOURCE = "import torch\nopt = torch.optim.Adam(params, foreach=False)\n"
FIXED = "import torch\nopt = torch.optim.Adam(params, foreach=True)\n"


def _project(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "proj"
    root.mkdir()
    train = root / "train.py"
    train.write_text(SOURCE)
    train.chmod(0o640)
    other = tmp_path / "elsewhere.py"
    os.link(train, other)
    return root, train, other


def test_a_hard_linked_file_keeps_its_inode_and_mode(tmp_path, capsys):
    root, train, other = _project(tmp_path)
    inode = train.stat().st_ino
    assert main(["fix", str(root), "--apply", "--select", "optimizer-foreach"]) == 0
    assert train.read_text() == FIXED and other.read_text() == FIXED
    st = train.stat()
    assert st.st_ino == inode and st.st_nlink == 2 and stat.S_IMODE(st.st_mode) == 0o640
    assert sorted(p.name for p in root.iterdir()) == ["train.py"]  # no backup or temp file left
    assert "fixed " in capsys.readouterr().out


def test_a_single_link_file_is_still_replaced_atomically(tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    (root / "train.py").write_text(SOURCE)
    assert main(["fix", str(root), "--apply", "--select", "optimizer-foreach"]) == 0
    assert (root / "train.py").read_text() == FIXED and sorted(p.name for p in root.iterdir()) == ["train.py"]


FAILING_WRITE = """
import resource, signal, sys
from pathlib import Path
from zoomer_ar.fix import engine

root = Path(sys.argv[1])
result = engine.run(root, select=["optimizer-foreach"], fix=True)
(changed,) = result.changed
changed.after = changed.after + "# " + "x" * 4000 + "\\n"  # grows past the limit below
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
assert engine.apply(result) == []
print(changed.error)
"""


def test_a_write_that_fails_halfway_loses_nothing(tmp_path):
    root, train, other = _project(tmp_path)
    proc = subprocess.run([sys.executable, "-c", FAILING_WRITE, str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("cannot write: File too large"), proc.stdout
    assert train.read_text() == SOURCE and other.read_text() == SOURCE
    assert train.stat().st_ino == other.stat().st_ino
    assert sorted(p.name for p in root.iterdir()) == ["train.py"]
