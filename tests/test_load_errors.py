"""Bad input: one-line error naming the file, exit 2, never a traceback; rank folders skip bad files."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.errors import InputError
from zoomer_ar.load import load_job

MINI = {
    "schemaVersion": 1,
    "distributedInfo": {"rank": 3, "world_size": 4},
    "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 20, "dur": 30,
         "args": {"correlation": 7, "stream": 7, "device": 0}},
    ],
}


def _archive(kind: str) -> bytes:
    """A rank folder of two MINI traces packed as users send them (a tar.gz, a plain tar, a zip)."""
    doc = json.dumps(MINI).encode()
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w") as zf:
            for r in range(2):
                zf.writestr(f"job/rank-{r}.json", doc)
        return buf.getvalue()
    with tarfile.open(fileobj=buf, mode="w:gz" if kind == "tar.gz" else "w") as tf:
        for r in range(2):
            info = tarfile.TarInfo(f"job/rank-{r}.json")
            info.size = len(doc)
            tf.addfile(info, io.BytesIO(doc))
    return buf.getvalue()


def write(path: Path, payload: bytes) -> Path:
    path.write_bytes(payload)
    return path


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    rc = main(args)
    return rc, capsys.readouterr().err


CASES = {
    "empty.json": (b"", "empty file"),
    "truncated.json.gz": (gzip.compress(json.dumps(MINI).encode())[:-20], "truncated gzip"),
    "notjson.json": (b"this is not json", "not valid JSON"),
    "list.json": (b"[[1, 2], [3, 4]]", "not a Kineto trace"),
    "other.json": (json.dumps({"hello": 1}).encode(), "not a Kineto trace"),
    "wrongtype.json": (
        json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}).encode(), "malformed trace"
    ),
    "truncatedjson.json": (json.dumps(MINI).encode()[:-15], "JSON"),
    "noevents.json": (json.dumps({"traceEvents": []}).encode(), "no events"),
    "garbage.gz": (b"\x1f\x8b" + b"\x00" * 40, "gzip"),
    "events_null.json": (b'{"traceEvents": null}', "'traceEvents' is null"),
    "bom.json": (b"\xef\xbb\xbf" + json.dumps(MINI).encode(), "byte-order mark"),
    "utf16.json": (json.dumps(MINI).encode("utf-16-le"), "UTF-16"),
    # nesting beyond msgspec's depth (RecursionError): at the top, in an event, in its args
    "deep_array.json": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "deep_event.json": (b'{"traceEvents":[' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"]}", "nested too deeply"),
    # archives and compressions the reader does not inflate: what the file is and what to do
    "job.tar.gz": (_archive("tar.gz"), "a tar archive, not a trace: extract it (tar xf) and analyse the folder"),
    "job.tar": (_archive("tar"), "a tar archive, not a trace"),
    "job.zip": (_archive("zip"), "a zip archive, not a trace: extract it (unzip)"),
    "trace.json.bz2": (bz2.compress(json.dumps(MINI).encode()), "bzip2-compressed, not a trace: decompress"),
    "trace.json.xz": (lzma.compress(json.dumps(MINI).encode()), "xz-compressed, not a trace: decompress"),
    "deep_args.json": (b'{"traceEvents":[{"name":"x","ph":"X","pid":1,"tid":1,"ts":1,"dur":2,"args":'
                       + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}]}", "nested too deeply"),
}


@pytest.mark.parametrize("stream", ["--no-stream", "--stream"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_file_exit_2_one_line(name, stream, tmp_path, capsys):
    payload, needle = CASES[name]
    p = write(tmp_path / name, payload)
    rc, err = run_cli(["analyze", str(p), "--no-files", "--no-progress", stream], capsys)
    assert rc == 2
    assert err.count("\n") == 1, err
    assert needle in err and name in err
    assert "Traceback" not in err


def test_a_named_pipe_is_refused_not_waited_on(tmp_path):
    """Opening a FIFO blocks until a writer comes: no reader may open one (analyze hung for ever)."""
    import os

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    out = subprocess.run([sys.executable, "-m", "zoomer_ar", "analyze", str(fifo), "--no-files"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not a regular file" in out.stderr and out.stderr.count("\n") == 1


def test_a_big_file_that_is_no_trace_gets_the_streaming_reason(tmp_path):
    """Above the in-memory limit only the streaming reader reads the file: its reason is the one
    given, not the in-memory size limit (which said nothing about a file of zeros)."""
    import os

    p = tmp_path / "zeros.json"
    p.write_bytes(b"\0" * 300_000)
    env = dict(os.environ, ZOOMER_MAX_TRACE_BYTES="100000", ZOOMER_STREAM="1")
    out = subprocess.run([sys.executable, "-m", "zoomer_ar", "analyze", str(p), "--no-files"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "not a readable trace" in out.stderr and "in-memory limit" not in out.stderr


def test_missing_path(tmp_path, capsys):
    rc, err = run_cli(["analyze", str(tmp_path / "nope.json"), "--no-files"], capsys)
    assert rc == 2 and "no such file" in err
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    rc, err = run_cli(["analyze", str(tmp_path / "a.json"), "--no-files"], capsys)
    assert rc == 2 and "symbolic link that leads nowhere" in err


def test_size_limit_refuses_large_and_bomb(tmp_path, monkeypatch):
    big = tmp_path / "big.json"
    big.write_bytes(json.dumps(MINI).encode() + b" " * 5000)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(json.dumps(MINI).encode() + b" " * 5_000_000))
    with pytest.raises(InputError, match="in-memory limit"):
        load_job(big, max_bytes=2000)
    with pytest.raises(InputError, match="in-memory limit"):
        load_job(bomb, max_bytes=100_000)


def test_rank_folder_skips_bad_files(tmp_path, capsys):
    d = tmp_path / "ranks"
    d.mkdir()
    for r in range(3):
        doc = json.loads(json.dumps(MINI))
        doc["distributedInfo"]["rank"] = r
        (d / f"rank-{r}.json").write_text(json.dumps(doc))
    (d / "rank-3.json.gz").write_bytes(gzip.compress(b"{}")[:-5])
    job = load_job(d)
    assert [r.rank for r in job.ranks] == [0, 1, 2]
    assert len(job.info.skipped) == 1 and "truncated" in job.info.skipped[0].reason
    rc = main(["analyze", str(d), "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "o" / "findings.json").read_text())
    assert any("rank-3.json.gz" in n for n in doc["notes"])


def test_rank_detection_order(tmp_path):
    doc = json.loads(json.dumps(MINI))
    del doc["distributedInfo"]
    (tmp_path / "worker5.json").write_text(json.dumps(doc))
    job = load_job(tmp_path / "worker5.json")
    assert job.ranks[0].rank == 5 and job.info.ranks[0].rank_source == "file name"
    (tmp_path / "plain.json").write_text(json.dumps(doc))
    job = load_job(tmp_path / "plain.json")
    assert job.ranks[0].rank == 0 and job.info.ranks[0].rank_source == "default"
    (tmp_path / "d.json").write_text(json.dumps(MINI))
    assert load_job(tmp_path / "d.json").ranks[0].rank == 3


def test_nanosecond_timestamps_are_converted(tmp_path):
    doc = json.loads(json.dumps(MINI))
    for e in doc["traceEvents"]:
        e["ts"] = e["ts"] * 1000 + 1_700_000_000_000_000_000
        e["dur"] = e["dur"] * 1000
    p = tmp_path / "ns.json"
    p.write_text(json.dumps(doc))
    job = load_job(p)
    assert job.ranks[0].dur.max() == pytest.approx(100.0)


def test_chrome_array_format_and_string_ids(tmp_path):
    events = [dict(e, pid="Spans", tid="") for e in MINI["traceEvents"]]
    p = tmp_path / "arr.json"
    p.write_text(json.dumps(events))
    job = load_job(p)
    assert len(job.ranks[0]) == 3


def test_cli_subprocess_has_no_traceback(tmp_path):
    p = write(tmp_path / "t.json.gz", gzip.compress(b'{"traceEvents": [')[:-3])
    proc = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", "analyze", str(p), "--no-files"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip().startswith("zoomer-ar: error:")


@pytest.mark.parametrize("stream", [False, True])
def test_an_impossible_timestamp_is_reported(tmp_path, stream):
    """One event at ts -1e300 (or a missing ts, read as 0, in an epoch-microsecond trace) stretches
    the profiled window over ages and silently changes GPU busy and idle: the analysis says so."""
    from zoomer_ar.analyze import analyze_path

    doc = json.loads(json.dumps(MINI))
    for e in doc["traceEvents"]:
        e["ts"] += 1_700_000_000_000_000
    good = write(tmp_path / "good.json", json.dumps(doc).encode())
    doc["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGetDevice", "pid": 1, "tid": 1,
                               "ts": -1e300, "dur": 1})
    bad = write(tmp_path / "bad.json", json.dumps(doc).encode())
    assert not any("impossible" in n for n in analyze_path(good, stream=stream).notes)
    assert any("impossible timestamps" in n for n in analyze_path(bad, stream=stream).notes)
