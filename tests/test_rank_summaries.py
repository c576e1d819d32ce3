"""A streamed job's ranks are summarised where they are read (load/stub.py, features.extract.RankSummary):
the main process gets each rank's features, not its rows, so a job's memory does not grow with its
number of ranks. The analysis must equal the in-memory one whatever the folder holds: ranks numbered
after reading (by file order), copies skipped, earlier runs skipped, merged traces, refusals."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
from pathlib import Path

import pytest

from conftest import SHARED_TRACES
from zoomer_ar.analyze import analyze_job, analyze_path
from zoomer_ar.errors import InputError
from zoomer_ar.features.extract import summarise_rank
from zoomer_ar.load import load_job
from zoomer_ar.load.stub import RankStub, events_digest
from zoomer_ar.stream import load_job_streaming

from huge.test_huge_stream import assert_same  # noqa: E402
from test_job_folder import folder, trace  # noqa: E402

DLRM = SHARED_TRACES / "param/dlrm_8ranks"


def _three(path: Path, workers: int = 2):
    """(in memory, streamed with every rank's rows sent back, streamed with summaries), each an Analysis
    or the InputError that refused it."""
    out = []
    for load in (lambda: load_job(path), lambda: load_job_streaming(path, workers=workers),
                 lambda: load_job_streaming(path, workers=workers, summarise=True)):
        try:
            out.append(analyze_job(load()))
        except InputError as exc:
            out.append(exc)
    return out


def _same(path: Path, workers: int = 2) -> None:
    ref, rows, summaries = _three(path, workers)
    if isinstance(ref, InputError):
        assert isinstance(rows, InputError) and isinstance(summaries, InputError)
        assert ref.reason == rows.reason == summaries.reason
        return
    assert_same(ref, rows, f"{path}: rows")
    assert_same(ref, summaries, f"{path}: summaries")
    assert ref.timeline == rows.timeline == summaries.timeline, f"{path}: the report's timeline differs"


@pytest.mark.parametrize("workers", [1, 2])
def test_a_rank_folder_streamed_as_summaries_is_the_in_memory_analysis(shared_traces, workers):
    job = load_job_streaming(DLRM, workers=workers, summarise=True)
    assert len(job.ranks) == 8 and all(isinstance(r, RankStub) and r.digest for r in job.ranks)
    assert all(r.summary.features._timeline_of is None for r in job.ranks)  # no per-event arrays kept, either way
    assert [r.rank for r in job.ranks] == list(range(8))
    _same(DLRM, workers)


def test_ranks_numbered_after_reading_carry_their_numbers_into_the_evidence(tmp_path):
    # no distributedInfo, no rank names: numbered by file order once all are read, after their summaries
    d = folder(tmp_path, {"host-b.json": trace(shift_us=300.0), "host-a.json": trace()})
    ref, _, got = _three(d)
    assert [i.rank for i in got.job.ranks] == [0, 1]
    evidence_ranks = {e.rank for f in got.findings for e in f.evidence.events}
    assert evidence_ranks <= {0, 1}
    assert_same(ref, got, "numbered by order")


@pytest.mark.parametrize("layout", ["copy", "earlier-runs", "separate-runs", "one-rank-twice"])
def test_folder_decisions_are_the_same_on_summaries(tmp_path, layout):
    if layout == "copy":  # a trace beside its decompressed twin is read once
        d = folder(tmp_path, {"rank-0.json": trace(rank=0), "rank-1.json": trace(shift_us=50.0, rank=1)})
        (d / "rank-1.json.gz").write_bytes(gzip.compress((d / "rank-1.json").read_bytes()))
        (d / "rank-1.json").rename(d / "copy.json")
    elif layout == "earlier-runs":
        files = {f"host_{pid + r}.{1700000000000 + run}.pt.trace.json": trace(shift_us=t + r * 50.0, rank=r)
                 for run, (t, pid) in enumerate(((0.0, 100), (60e6, 200))) for r in range(2)}
        d = folder(tmp_path, files)
    elif layout == "separate-runs":  # refused: not one job
        d = folder(tmp_path, {"before.json": trace(), "after.json": trace(shift_us=90e6)})
    else:  # two files claiming rank 0 and nothing else: refused
        d = folder(tmp_path, {"a.json": trace(rank=0), "b.json": trace(shift_us=10.0, rank=0)})
    _same(d)
    if layout == "copy":
        got = analyze_job(load_job_streaming(d, workers=2, summarise=True))
        assert [Path(s.path).name for s in got.job.skipped] in (["copy.json"], ["rank-1.json.gz"])


def test_a_merged_trace_is_summarised_per_rank(shared_traces, tmp_path):
    from zoomer_ar.surgery.ops import merge_job

    job = tmp_path / "job"
    job.mkdir()
    for f in sorted(DLRM.iterdir())[:3]:
        shutil.copy(f, job / f.name)
    merged = tmp_path / "merged.json"
    merge_job(job, merged)
    stubs = load_job_streaming(merged, workers=1, summarise=True).ranks
    assert len(stubs) == 3 and all(isinstance(r, RankStub) for r in stubs)
    assert all(r.digest is None for r in stubs)  # one file's ranks are never compared as copies: no digest
    _same(merged, workers=1)


def test_analyze_streams_a_folder_as_summaries(shared_traces):
    streamed = analyze_path(DLRM, stream=True)
    assert_same(analyze_path(DLRM, stream=False), streamed, "analyze_path")


def test_a_summary_pickles_without_the_rows_and_keeps_the_evidence_order(shared_traces):
    trace = load_job(SHARED_TRACES / "hta/trace_diff/test").ranks[0]
    s = summarise_rank(trace)
    assert s.features.evidence_keys, "this trace has evidence chosen by something other than its duration"
    back = pickle.loads(pickle.dumps(s))
    for kind, evs in s.features.evidence.items():
        for a, b in zip(evs, back.features.evidence[kind], strict=True):
            assert a == b
            assert s.features.evidence_keys.get(id(a)) == back.features.evidence_keys.get(id(b))
    assert back.features.timeline() == s.features.timeline() and back.features.timeline()
    assert back.features._timeline_of is None  # the busy union (it grows with the trace) stays behind
    stub = RankStub.of(trace, s)
    assert len(pickle.dumps(stub)) * 20 < len(pickle.dumps(trace))  # the rows stay in the reading process


def test_the_events_digest_is_the_same_events_test(shared_traces):
    a = load_job(SHARED_TRACES / "hta/ns_resolution_trace").ranks[0]
    b = load_job(SHARED_TRACES / "hta/ns_resolution_trace").ranks[0]
    assert events_digest(a) == events_digest(b)
    b.dur = b.dur.copy()
    b.dur[len(b) // 2] += 0.001
    assert events_digest(a) != events_digest(b)


def test_a_rank_folder_with_a_bad_rank_is_summarised_without_it(tmp_path, shared_traces):
    d = tmp_path / "job"
    d.mkdir()
    for f in sorted(DLRM.iterdir())[:2]:
        shutil.copy(f, d / f.name)
    (d / "rank-9.json").write_text(json.dumps({"not": "a trace"}))
    _same(d)
