"""Which loader `analyze` chooses for a damaged gzip file: its last four bytes are not a trailer."""

from __future__ import annotations

import gzip
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.stream import json_size_estimate, should_stream


def _trace(n: int) -> bytes:
    return json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i}", "cat": "cpu_op", "pid": 1, "tid": 1,
                                        "ts": i * 10, "dur": 5} for i in range(n)]}).encode()


def _truncated(path: Path, tail: int) -> Path:
    """A gzip file cut in its middle whose last four bytes read as ISIZE `tail` (an impossible size)."""
    data = gzip.compress(_trace(20_000), 6)
    path.write_bytes(data[: len(data) // 2 - 4] + struct.pack("<I", tail))
    return path


def test_a_truncated_gzip_does_not_pass_for_a_huge_trace(tmp_path, monkeypatch):
    monkeypatch.delenv("ZOOMER_STREAM", raising=False)
    monkeypatch.delenv("ZOOMER_STREAM_THRESHOLD", raising=False)
    bad = _truncated(tmp_path / "rank0.json.gz", 0xF000_0000)  # "3.75 GiB" from a file of a few kB
    assert json_size_estimate(bad) == bad.stat().st_size
    assert not should_stream(bad)


def test_a_valid_trailer_is_still_believed(tmp_path):
    good = tmp_path / "good.json.gz"
    data = _trace(20_000)
    good.write_bytes(gzip.compress(data, 6))
    assert json_size_estimate(good) == len(data)


def test_a_folder_with_a_truncated_rank_is_analysed_in_memory_and_the_rank_named(tmp_path, monkeypatch, shared_traces):
    monkeypatch.delenv("ZOOMER_STREAM", raising=False)
    monkeypatch.delenv("ZOOMER_STREAM_THRESHOLD", raising=False)
    job = tmp_path / "job"
    shutil.copytree(shared_traces / "param" / "dlrm_8ranks", job)
    victim = sorted(job.iterdir())[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2] + struct.pack("<I", 0xFFFF_FFF0))
    assert not should_stream(job)
    run = subprocess.run([sys.executable, "-m", "zoomer_ar", "analyze", str(job), "--out", str(tmp_path / "out"),
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert f"Skipped {victim}: " in said
    assert "streaming pass" not in said


# ---- ZOOMER_STREAM and ZOOMER_STREAM_THRESHOLD values that are neither choice nor size ----------


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "sync_point" / "rank-0.pt.trace.json.gz"


@pytest.mark.parametrize("var, value, accepted", [
    ("ZOOMER_STREAM", "maybe", "accepted: 1, true, yes, on to stream, 0, false, no, off not to"),
    ("ZOOMER_STREAM", "2", "accepted: 1, true"),
    ("ZOOMER_STREAM_THRESHOLD", "abc", "a whole number, 0 or more"),
    ("ZOOMER_STREAM_THRESHOLD", "-5", "a whole number, 0 or more"),
    ("ZOOMER_STREAM_THRESHOLD", "1e9", "a whole number, 0 or more"),
])
@pytest.mark.parametrize("options", [[], ["--stream"], ["--steps", "1..2"]])
def test_a_bad_stream_setting_is_refused_in_one_line(tmp_path, monkeypatch, capsys, var, value, accepted, options):
    """Such a value was ignored without a word: the default applied (a negative threshold streamed
    every trace). Refused before any work, whatever path --stream or --steps takes."""
    monkeypatch.delenv("ZOOMER_STREAM", raising=False)
    monkeypatch.delenv("ZOOMER_STREAM_THRESHOLD", raising=False)
    monkeypatch.setenv(var, value)
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", str(EXAMPLE), "--no-progress", *options]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error" not in err, err
    assert f"{var}={value!r}" in err and accepted in err, err
    assert not (tmp_path / "zoomer-out").exists()


@pytest.mark.parametrize("var, value", [("ZOOMER_STREAM", "Yes"), ("ZOOMER_STREAM", "off"), ("ZOOMER_STREAM", " "),
                                        ("ZOOMER_STREAM_THRESHOLD", "0"), ("ZOOMER_STREAM_THRESHOLD", " 1048576 ")])
def test_accepted_stream_settings_still_work(tmp_path, monkeypatch, var, value):
    monkeypatch.delenv("ZOOMER_STREAM", raising=False)
    monkeypatch.delenv("ZOOMER_STREAM_THRESHOLD", raising=False)
    monkeypatch.setenv(var, value)
    assert main(["analyze", str(EXAMPLE), "--no-progress", "--out", str(tmp_path / "o")]) == 0
