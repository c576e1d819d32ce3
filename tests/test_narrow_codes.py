"""Code and id columns in one byte where their values fit (load/narrow.py): a trace's categories,
threads, processes, streams and devices nearly always fit int8, its names int16. The loaders (the
compiled reader, msgspec) and the streaming path keep them so, and the features are the same as
with int64 columns, also where a table holds more than 127 codes (the streaming path's kept rows
then may still fit int8 while the features look up codes past 127)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from zoomer_ar.analyze import analyze_job
from zoomer_ar.features.extract import extract
from zoomer_ar.load import fastcols, load_job
from zoomer_ar.stream import load_job_streaming

from conftest import SHARED_TRACES

NS = SHARED_TRACES / "hta/ns_resolution_trace"
DLRM0 = SHARED_TRACES / "param/dlrm_8ranks/worker0_step_12.1694128201545.pt.trace.json.gz"
INTS = ("cat", "name", "pid", "tid", "correlation", "stream", "device", "external_id")


def _smallest(a: np.ndarray) -> np.dtype:
    lo, hi = int(a.min()), int(a.max())
    for dt in (np.int8, np.int16, np.int32):
        if np.iinfo(dt).min <= lo and hi <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.int64)


def _widened(job):
    for t in job.ranks:
        for f in INTS:
            setattr(t, f, np.array(getattr(t, f), dtype=np.int64))
        for f in ("nbytes", "total_allocated"):
            setattr(t, f, np.array(getattr(t, f), dtype=np.float64))
    return job


def _features(job) -> tuple[str, str, str]:
    jf = extract(job)
    return repr(jf.vector), repr(jf.evidence), repr(jf.per_rank)


def _streamed(path: Path):
    return load_job_streaming(path, workers=1, slice_bytes=16 << 10, prune_rows=0)


@pytest.mark.parametrize("fast", [True, False], ids=["compiled-reader", "msgspec-reader"])
def test_a_corpus_trace_keeps_codes_and_ids_in_one_byte(shared_traces, monkeypatch, fast):
    if fast and not fastcols.available():
        pytest.skip("the compiled event reader is not built in this installation")
    monkeypatch.setenv("ZOOMER_FAST_JSON", "1" if fast else "0")
    for how, job in (("in memory", load_job(NS)), ("streamed", _streamed(NS))):
        t = job.ranks[0]
        for f in ("cat", "pid", "tid", "stream", "device"):
            assert getattr(t, f).dtype == np.int8, (how, f, getattr(t, f).dtype)
        assert t.name.dtype == _smallest(t.name) and t.name.dtype.itemsize <= 2, (how, t.name.dtype)
        for f in INTS:  # every integer column in the smallest type that holds it
            a = getattr(t, f)
            assert a.dtype == _smallest(a), (how, f, a.dtype)


def _many_codes_trace(path: Path, junk_first: bool) -> None:
    """dlrm_8ranks' rank 0 with 200 extra events, each of its own category, name, pid and tid: the
    tables pass int8's 127; first in the file, they push the real codes past it; last, the rows the
    streaming path keeps (the real ones) still fit int8."""
    with gzip.open(DLRM0, "rt") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    x = [e for e in events if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in x)
    junk = [{"ph": "X", "cat": f"junk_cat_{i}", "name": f"junk_{i}", "pid": 10_000 + i, "tid": 20_000 + i,
             "ts": t0 + i, "dur": 0.5} for i in range(200)]
    doc["traceEvents"] = junk + events if junk_first else events + junk
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("junk_first", [True, False], ids=["codes-past-127", "kept-rows-under-128"])
def test_more_than_127_categories_pids_and_tids_give_the_same_features(shared_traces, tmp_path, junk_first):
    path = tmp_path / "rank0.json"
    _many_codes_trace(path, junk_first)
    ref = load_job(path)
    t = ref.ranks[0]
    assert len(t.cats) > 200 and len(t.pid_values) > 200 and len(t.tid_values) > 200
    for f in ("cat", "pid", "tid"):
        assert getattr(t, f).dtype == np.int16, f
    want = _features(ref)
    assert _features(_widened(load_job(path))) == want  # the types change nothing

    streamed = _streamed(path)
    s = streamed.ranks[0]
    assert len(s.cats) > 200
    if not junk_first:  # the junk rows are dropped: the kept rows' codes fit int8, the tables do not
        assert s.cat.dtype == np.int8 and int(s.cat.max()) < len(s.cats) - 127
    assert _features(streamed) == want
    assert _features(_widened(_streamed(path))) == want
    a, b = analyze_job(load_job(path)), analyze_job(_streamed(path))
    assert [(f.pattern, f.impact) for f in a.findings] == [(f.pattern, f.impact) for f in b.findings]


def test_streamed_parts_join_into_narrow_blocks():
    """The streaming path's kept rows come in parts of the readers' types (int32 codes, int16 or int64
    ids, float32 byte counts); joined into a block they are narrowed, and a column of one value in the
    block (NaN byte counts without copies, no stream on host rows) is a broadcast: the block costs the
    bytes its values need while the rest of the rank is read."""
    from zoomer_ar.stream.parts import ColumnParts

    block = ColumnParts(ordinals=False)
    for k in range(ColumnParts.CONSOLIDATE):
        n = 100
        block.append({
            "ts": np.arange(n, dtype=np.float64), "dur": np.ones(n), "ph": np.ones(n, dtype=np.uint8),
            "cat": np.full(n, k % 3, dtype=np.int32), "name": np.arange(n, dtype=np.int32) + 200 * k,
            "pid": np.zeros(n, dtype=np.int32), "tid": np.full(n, k, dtype=np.int32),
            "correlation": np.arange(n, dtype=np.int64) + 1000 * k, "stream": np.full(n, -1, dtype=np.int16),
            "device": np.full(n, -1, dtype=np.int64), "ext": np.arange(n, dtype=np.int16),
            "ext21": np.full(n, -1, dtype=np.int16), "nbytes": np.full(n, np.nan, dtype=np.float32),
            "total_allocated": np.full(n, np.nan),
        })
    assert len(block.blocks) == 1 and not block.parts
    b = block.blocks[0]
    for f, dt in (("cat", np.int8), ("pid", np.int8), ("tid", np.int8), ("name", np.int16), ("ext", np.int8),
                  ("correlation", np.int16)):
        assert b[f].dtype == dt, (f, b[f].dtype)
    for f in ("stream", "device", "ext21", "nbytes", "total_allocated"):
        assert b[f].strides == (0,), f
    assert b["stream"].dtype == np.int8 and (b["device"] == -1).all() and np.isnan(b["nbytes"]).all()
    assert int(b["name"].max()) == 200 * 31 + 99 and int(b["correlation"][-1]) == 1000 * 31 + 99


def test_a_trace_without_byte_counts_keeps_them_as_one_value(tmp_path):
    """nbytes of rows without a byte count (no memcpy, memset or [memory] event) is NaN on every row:
    a read-only broadcast on both paths, not 4-8 bytes a row."""
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i % 3}", "pid": 0, "tid": 7, "ts": 10.0 * i, "dur": 5.0,
               "args": {"correlation": i, "stream": 7, "device": 0}} for i in range(3000)]
    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10.0 * i - 2,
                "dur": 1.0, "args": {"correlation": i}} for i in range(3000)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    for how, job in (("in memory", load_job(path)), ("streamed", _streamed(path))):
        t = job.ranks[0]
        assert t.nbytes.strides == (0,) and np.isnan(t.nbytes).all(), how
