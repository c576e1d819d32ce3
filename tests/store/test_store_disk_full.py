"""`zoomer-ar record` and `analyze --record` on a full disk, with a SQLite store: one line saying the disk is full,
a non-zero exit, and the store as it was (`PRAGMA integrity_check`, nothing half-recorded).

The command runs as a real subprocess under a file-size limit (RLIMIT_FSIZE, set in the child before it starts):
SQLite's writes past it fail with EFBIG, which it reports as "disk I/O error" (a short write, or ENOSPC on a full
disk, as "database or disk is full"; both measured on a small tmpfs, see docs/store.md). No mocks.
"""

from __future__ import annotations

import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "traces"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE as Linux applies it")


def _zoomer(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))

    return subprocess.run([sys.executable, "-m", "zoomer_ar", *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO, preexec_fn=limit)


def _state(db: Path) -> tuple[str, int, int]:
    con = sqlite3.connect(db)
    try:
        return (con.execute("PRAGMA integrity_check").fetchone()[0], con.execute("SELECT count(*) FROM analyses").fetchone()[0],
                con.execute("SELECT count(*) FROM findings").fetchone()[0])
    finally:
        con.close()


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for name in ("dataloader_bound", "fp32_matmul"):
        folder = tmp_path_factory.mktemp(name)
        r = _zoomer("analyze", str(EXAMPLES / name), "--out", str(folder))
        assert r.returncode == 0, r.stderr
        out[name] = folder / "findings.json"
    return out


@pytest.fixture
def store(tmp_path, findings) -> Path:
    db = tmp_path / "store.db"
    r = _zoomer("record", str(findings["dataloader_bound"]), "--db", str(db), "--team", "t")
    assert r.returncode == 0, r.stderr
    assert not Path(f"{db}-wal").exists()  # the store is closed whole: a later run starts its WAL from nothing
    return db


def _assert_disk_full_line(r: subprocess.CompletedProcess) -> None:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("zoomer-ar: error: cannot "), lines
    assert "(its disk, or its storage limit, is full): nothing was recorded; " in lines[0], lines
    assert "RLIMIT_FSIZE" in lines[0], lines
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("fsize", [1000, 40_000], ids=["at-open", "mid-record"])
def test_record_on_a_full_disk_says_so_and_keeps_the_store(store, findings, fsize):
    # 1000 bytes: the -shm file of the WAL store cannot even grow to its 32 KiB; 40 kB: the store opens and the
    # recording's pages (about 74 kB of WAL) pass the limit mid-transaction
    before = _state(store)
    r = _zoomer("record", str(findings["fp32_matmul"]), "--db", str(store), "--team", "t", fsize=fsize)
    _assert_disk_full_line(r)
    assert ("cannot open the store" if fsize == 1000 else "cannot record into the store") in r.stderr
    assert _state(store) == before and before[0] == "ok"
    again = _zoomer("record", str(findings["fp32_matmul"]), "--db", str(store), "--team", "t")  # space again
    assert again.returncode == 0, again.stderr
    assert _state(store)[:2] == ("ok", before[1] + 1)


def test_analyze_record_on_a_full_disk_says_so_and_keeps_the_store(store, tmp_path):
    before = _state(store)
    out = tmp_path / "out"
    r = _zoomer("analyze", str(EXAMPLES / "fp32_matmul"), "--record", "--db", str(store), "--team", "t",
                "--out", str(out), fsize=40_000)
    _assert_disk_full_line(r)
    assert _state(store) == before
    shutil.rmtree(out, ignore_errors=True)
