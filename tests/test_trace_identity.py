"""A trace's identity (RankInfo.sha256: the store's content hash, provenance, relaunch specs) is
the sha256 of the file as stored, compressed or not: what `sha256sum FILE` prints, on every path
that reads a trace (load/reader.py)."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from zoomer_ar.load import load_job
from zoomer_ar.load.job import load_trace, stream_trace
from zoomer_ar.stream import load_job_streaming
from zoomer_ar.stream.load import stream_rank

EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1000, "dur": 50, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1010, "dur": 30, "pid": 0, "tid": 7,
     "args": {"correlation": 1, "stream": 7, "device": 0}},
]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_reader_hashes_the_file_as_stored(tmp_path):
    text = json.dumps({"traceEvents": EVENTS, "schemaVersion": 1}).encode()
    plain = tmp_path / "plain.json"
    plain.write_bytes(text)
    gz = tmp_path / "packed.json.gz"
    gz.write_bytes(gzip.compress(text, mtime=0))
    for path in (plain, gz):
        want = _sha(path)
        assert stream_trace(path) is not None  # the in-memory loader's streaming reader
        assert load_trace(path)[1].sha256 == want
        assert stream_rank(path)[1].sha256 == want  # the huge-trace path
        assert load_job(path).info.ranks[0].sha256 == want
        assert load_job_streaming(path).info.ranks[0].sha256 == want
    # the same JSON compressed is another file: another identity
    assert load_trace(gz)[1].sha256 != load_trace(plain)[1].sha256


def test_the_whole_document_path_hashes_the_file_too(tmp_path):
    # a bare event array is not streamed: the whole-document reader takes it
    path = tmp_path / "bare.json.gz"
    path.write_bytes(gzip.compress(json.dumps(EVENTS).encode(), mtime=0))
    assert stream_trace(path) is None
    assert load_trace(path)[1].sha256 == _sha(path)


def test_a_real_compressed_trace(shared_traces):
    path = shared_traces / "hta" / "ns_resolution_trace"
    job = load_job(path)
    (info,) = job.info.ranks
    assert info.sha256 == _sha(Path(info.path))
    assert load_job_streaming(path).info.ranks[0].sha256 == info.sha256
