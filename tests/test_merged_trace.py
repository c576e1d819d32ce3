"""A `zoomer-ar trace merge` output is analysed as the ranks it merges (zoomer_ar/load/merged.py):
the same per-rank features, findings and job as the rank files give, whichever ranks were merged and
whatever their pids; the streaming pass, which keeps a subset of each rank's events, routes them
by pid to a builder per rank and so splits such a file while it reads it, to the same ranks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.cli import main
from zoomer_ar.load import load_job
from zoomer_ar.load.merged import PID_STRIDE, merged_ranks, rank_of_pid

from conftest import REPO, SHARED_TRACES

EPOCH_US = 1_700_000_000_000_000
NS_FILE = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # steps 101..105


def rank_trace(rank: int, slow: float, lag_us: float = 7.0) -> dict:
    """Four steps of a small GPU program on rank `rank`; its kernels last `slow` x 300 us. The host
    thread's pid is a string on rank 5 (Kineto writes "Spans"-like string pids too)."""
    host = "host-proc" if rank == 5 else 4242
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": host, "tid": 0, "args": {"name": "python3"}}]
    for s in range(4):
        b = EPOCH_US + s * 2000.0 + rank * lag_us
        c = 100 + s
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": host, "tid": 1, "ts": b, "dur": 1900},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": host, "tid": 1, "ts": b + 10, "dur": 8,
             "args": {"correlation": c, "External id": c}},
            {"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": b + 30,
             "dur": 300 * slow, "args": {"correlation": c, "External id": c, "stream": 7, "device": 0}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": host, "tid": 1, "ts": b + 40,
             "dur": 300 * slow, "args": {"correlation": c + 1000}},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": c, "pid": host, "tid": 1, "ts": b + 10},
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": c, "pid": 0, "tid": 7, "ts": b + 30, "bp": "e"},
        ]
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 8, "backend": "nccl"},
            "traceEvents": events}


@pytest.fixture
def job(tmp_path) -> tuple[Path, Path]:
    """A job folder of ranks 0, 1 and 5 (rank 5 slow), and its `trace merge` output."""
    folder = tmp_path / "job"
    folder.mkdir()
    for r, slow in ((0, 1.0), (1, 1.0), (5, 2.5)):
        (folder / f"rank-{r}.json").write_text(json.dumps(rank_trace(r, slow)))
    merged = tmp_path / "merged.json"
    assert main(["trace", "merge", str(folder), str(merged)]) == 0
    return folder, merged


def test_merged_trace_is_its_ranks(job):
    folder, merged = job
    a, b = analyze_path(merged), analyze_path(folder)
    assert [r.rank for r in a.job.ranks] == [0, 1, 5]
    assert a.features == b.features and a.findings == b.findings and a.bottleneck == b.bottleneck
    assert a.features["per_rank"] == b.features["per_rank"]
    assert [r.n_events for r in a.job.ranks] == [r.n_events for r in b.job.ranks]
    assert a.features["profiler_steps"] == 4  # not 12: the ranks' steps are not pooled
    assert a.job.world_size == b.job.world_size == 8  # distributedInfo.merged_world_size (its world_size is 1)


def test_a_merged_trace_without_its_world_size_counts_its_ranks(job, tmp_path):
    # merged before `trace merge` recorded merged_world_size: the world is the ranks it holds
    _, merged = job
    doc = json.loads(merged.read_text())
    assert doc["distributedInfo"]["world_size"] == 1 and doc["distributedInfo"]["merged_world_size"] == 8
    del doc["distributedInfo"]["merged_world_size"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    job_ = load_job(old)
    assert [r.rank for r in job_.ranks] == [0, 1, 5] and job_.info.world_size == 3


def test_the_slow_rank_is_named_as_in_the_folder(job):
    folder, merged = job
    a = analyze_path(merged)
    assert a.features["slowest_rank"] == analyze_path(folder).features["slowest_rank"] == 5


def test_summary_says_ranks_in_one_file(job, capsys):
    _, merged = job
    assert main(["analyze", str(merged), "--no-files"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("merged - 3 ranks in 1 file, world size 8")


def _same(a, b, where: str) -> None:
    """Two analyses agree on everything the loaders decide: features, findings with their evidence (and
    its frames), bottleneck, the job and each rank's info."""
    diff = {k: (a.features[k], b.features.get(k)) for k in a.features if a.features[k] != b.features.get(k)}
    assert not diff, f"{where}: features differ: {dict(list(diff.items())[:4])}"
    assert [f.model_dump() for f in a.findings] == [f.model_dump() for f in b.findings], f"{where}: findings differ"
    assert a.bottleneck == b.bottleneck, where
    assert a.job.model_dump() == b.job.model_dump(), f"{where}: job info differs"


def _streamed(path: Path, **kw):
    from zoomer_ar.analyze import analyze_job
    from zoomer_ar.stream import load_job_streaming

    return analyze_job(load_job_streaming(path, workers=1, **kw))


@pytest.mark.parametrize("fast", [True, False], ids=["compiled-reader", "msgspec-reader"])
@pytest.mark.parametrize("slice_bytes, chunk", [(1 << 20, None), (512, 256)], ids=["whole", "tiny-slices"])
def test_the_streaming_pass_splits_a_merged_trace(job, fast, slice_bytes, chunk):
    # each event goes to its rank's builder by pid (stream/split.py): the ranks equal the in-memory split's,
    # which equal the rank files' (it used to refuse the file, exit 2)
    folder, merged = job
    got = _streamed(merged, fast=fast, slice_bytes=slice_bytes, chunk=chunk, prune_rows=0)
    _same(analyze_path(merged), got, "merged, in memory vs streamed")
    assert [r.rank for r in got.job.ranks] == [0, 1, 5]
    assert [r.n_events for r in got.job.ranks] == [r.n_events for r in analyze_path(folder).job.ranks] == [25] * 3
    assert got.features["profiler_steps"] == 4 and got.features["slowest_rank"] == 5 and got.job.world_size == 8


def test_a_merged_trace_naming_its_ranks_after_its_events_is_read_again_split(job, tmp_path):
    # distributedInfo after traceEvents (a tool that rewrote the file): the first pass learns the ranks at
    # the end, and the file is read again with a builder per rank
    _, merged = job
    doc = json.loads(merged.read_text())
    late = tmp_path / "late.json"
    late.write_text(json.dumps({"traceEvents": doc["traceEvents"], **{k: v for k, v in doc.items() if k != "traceEvents"}}))
    assert late.read_text().index('"traceEvents"') < late.read_text().index('"merged_ranks"')
    got = _streamed(late, prune_rows=0)
    _same(analyze_path(late), got, "late distributedInfo")
    assert [r.rank for r in got.job.ranks] == [0, 1, 5]


def test_one_rank_needing_a_second_pass_is_read_again_with_its_own_hints(tmp_path):
    # rank 1's optimizer step is written after the per-parameter ops it holds (the first pass dropped
    # them): the second pass keeps them for rank 1, and rank 0 reads as it did
    folder = tmp_path / "job"
    folder.mkdir()
    for r in (0, 1):
        doc = rank_trace(r, 1.0)
        b = EPOCH_US + 3 * 2000.0 + 1500
        ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::sqrt", "pid": 4242, "tid": 1, "ts": b + 5 * k, "dur": 3}
               for k in range(6)]
        window = {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 4242, "tid": 1,
                  "ts": b - 1, "dur": 60}
        doc["traceEvents"] += ops + [window] if r == 1 else [window] + ops
        (folder / f"rank-{r}.json").write_text(json.dumps(doc))
    merged = tmp_path / "merged.json"
    assert main(["trace", "merge", str(folder), str(merged)]) == 0
    from zoomer_ar.stream import load_job_streaming

    job_ = load_job_streaming(merged, workers=1, prune_rows=0, slice_bytes=512, chunk=256)  # the window in a later slice
    assert [t.metadata["streamed"]["passes"] for t in job_.ranks] == [2, 2]  # one file: read twice
    got = _streamed(merged, prune_rows=0, slice_bytes=512, chunk=256)
    _same(analyze_path(merged), got, "second pass")
    assert got.features == analyze_path(folder).features
    assert got.features["per_rank"][1]["optimizer_per_param_ops"] == 6


def test_a_merged_trace_with_stacks_gets_each_ranks_evidence_frames(tmp_path):
    # one more pass adds the Python frames around each rank's evidence events, counting each rank's
    # events apart (their ordinals are the rank's own): the in-memory frames, rank by rank
    src = json.loads(gzip.decompress((REPO / "examples/gpu/sync_point/rank-0.pt.trace.json.gz").read_bytes()))
    folder = tmp_path / "job"
    folder.mkdir()
    for r in (0, 1):
        doc = dict(src, distributedInfo={"rank": r, "world_size": 2, "backend": "nccl"})
        if r:
            doc["traceEvents"] = [dict(e, ts=e["ts"] + 37) if "ts" in e else e for e in src["traceEvents"]]
        (folder / f"rank-{r}.json").write_text(json.dumps(doc))
    merged = tmp_path / "merged.json"
    assert main(["trace", "merge", str(folder), str(merged)]) == 0
    got = _streamed(merged, slice_bytes=64 << 10)
    _same(analyze_path(merged), got, "stacks")
    frames = [(e.rank, fr) for fnd in got.findings for e in fnd.evidence.events for fr in e.frames]
    assert {r for r, _ in frames} == {0, 1}  # both ranks' evidence has frames
    added = [t.metadata["streamed"]["frames_added"] for t in load_job_streaming_ranks(merged)]
    assert all(n > 0 for n in added)


def load_job_streaming_ranks(path: Path):
    from zoomer_ar.stream import load_job_streaming

    return load_job_streaming(path, workers=1, slice_bytes=64 << 10).ranks


def test_an_annotated_merged_trace_streams_as_the_job(job, tmp_path):
    # the markers of `--annotate` belong to no rank on the streaming path too
    folder, merged = job
    out = tmp_path / "annotated.json"
    assert main(["analyze", str(merged), "--no-files", "--annotate", str(out)]) == 0
    got = _streamed(out, prune_rows=0)
    _same(analyze_path(out), got, "annotated")
    ref = analyze_path(folder)
    assert got.features == ref.features and got.findings == ref.findings


def test_a_merged_trace_listing_a_million_ranks_reads_the_ranks_it_holds(job, tmp_path):
    # merged_ranks may list up to 2^20 ranks: builders and row groups are made for the ranks whose
    # events the file holds (one per listed rank used to be made and scanned for)
    from zoomer_ar.stream.split import RankSink

    _, merged = job
    doc = json.loads(merged.read_text())
    doc["distributedInfo"]["merged_ranks"] = list(range(1 << 20))
    many = tmp_path / "many.json"
    many.write_text(json.dumps(doc))
    ref = analyze_path(merged)
    for got in (analyze_path(many), _streamed(many, prune_rows=0)):
        assert [r.rank for r in got.job.ranks] == [0, 1, 5]
        assert got.features["per_rank"] == ref.features["per_rank"]
    sink = RankSink(str(many))
    sink.on_head(SimpleNamespace(top={"distributedInfo": doc["distributedInfo"]}))  # scan.py's ScanResult
    sink.add(json.dumps(doc["traceEvents"]).encode())
    assert sorted(sink.builders) == [0, 1, 5] and [k for k, _ in sink.items()] == [0, 1, 5]


@pytest.mark.parametrize("fast", [True, False], ids=["compiled-reader", "msgspec-reader"])
def test_file_wide_choices_count_every_event_as_the_in_memory_loader(tmp_path, fast):
    # the in-memory loader decides nanoseconds on the whole file (median start above 1e17), markers of no
    # rank included, before it splits; the streaming split decides the same from all builders' counts
    ev = lambda pid, ts: {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": 1, "ts": ts, "dur": 5}  # noqa: E731
    events = [ev(4242, 9e16 + k) for k in range(3)] + [ev(PID_STRIDE + 4242, 9e16 + k) for k in range(2)]
    events += [ev("zoomer", 2e17 + k) for k in range(6)]  # no rank's events, later in time
    doc = {"distributedInfo": {"merged_ranks": [0, 1], "world_size": 1}, "traceEvents": events}
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(doc))
    from zoomer_ar.stream import load_job_streaming

    ref, got = load_job(path), load_job_streaming(path, workers=1, fast=fast)
    assert [r.rank for r in got.ranks] == [r.rank for r in ref.ranks] == [0, 1]
    assert [r.time_unit_note for r in got.ranks] == [r.time_unit_note for r in ref.ranks]
    assert "nanoseconds" in ref.ranks[0].time_unit_note  # the markers tipped the median: the test bites
    assert [list(r.ts) for r in got.ranks] == [list(r.ts) for r in ref.ranks]


def test_cli_stream_analyses_a_merged_trace(job, capsys):
    _, merged = job
    assert main(["analyze", str(merged), "--stream", "--no-files"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("merged - 3 ranks in 1 file, world size 8")
    assert "streaming pass" in out


@pytest.mark.parametrize("value, expected", [
    ([0, 1, 5], [0, 1, 5]),
    ([0], None),  # one rank: nothing to split
    ([0, 0], None),
    ([0, "1"], None),
    ([0, True], None),
    ([0, -1], None),
    ("0,1", None),
    (None, None),
])
def test_merged_ranks_must_be_distinct_rank_numbers(value, expected):
    assert merged_ranks({"distributedInfo": {"merged_ranks": value}}) == expected


def test_pids_map_back_to_their_ranks():
    ranks = [0, 1, 5]
    assert rank_of_pid(4242, ranks) == 0
    assert rank_of_pid(PID_STRIDE + 4242, ranks) == 1
    assert rank_of_pid(5 * PID_STRIDE, ranks) == 5
    assert rank_of_pid(3 * PID_STRIDE + 1, ranks) is None  # rank 3 was not merged
    assert rank_of_pid("rank5:host-proc", ranks) == 5
    assert rank_of_pid("host-proc", ranks) is None
    assert rank_of_pid(None, ranks) is None


def test_a_trace_that_is_not_merged_is_one_rank(tmp_path):
    p = tmp_path / "rank-1.json"
    p.write_text(json.dumps(rank_trace(1, 1.0)))
    assert [r.rank for r in load_job(p).ranks] == [1]


def test_annotating_a_merged_trace_marks_each_rank_once(job, tmp_path):
    # the file is copied once, with each rank's markers bound to that rank's events: the same events as
    # annotating the rank folder into one merged trace
    folder, merged = job
    assert main(["analyze", str(merged), "--no-files", "--annotate", str(tmp_path / "a.json")]) == 0
    assert main(["analyze", str(folder), "--no-files", "--annotate", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    key = lambda doc: sorted(json.dumps(e, sort_keys=True) for e in doc["traceEvents"])  # noqa: E731
    assert key(a) == key(b)
    src = json.loads(merged.read_text())["traceEvents"]
    assert len(a["traceEvents"]) > len(src)  # the original events once, then the markers
    assert [e for e in a["traceEvents"][:len(src)]] == src
    bound = {str(e["pid"]) for e in a["traceEvents"] if e.get("cat") == "zoomer" and e.get("ph") == "f"}
    assert str(5 * PID_STRIDE) in bound  # rank 5's markers bound to rank 5's events (its GPU, pid 0 merged)


def test_a_job_mixing_a_merged_trace_with_rank_files_is_annotated_file_by_file(job, tmp_path, capsys):
    # to a folder: each file copied with its ranks' markers (the merged one's routed by pid); into one
    # file it would need merging a merged trace again: refused, naming the way out
    folder, merged = job
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "merged.json").write_text(merged.read_text())
    (mixed / "rank-7.json").write_text(json.dumps(rank_trace(7, 1.0)))
    assert main(["analyze", str(mixed), "--no-files", "--annotate", str(tmp_path / "m.json")]) == 2
    assert "mixes a merged trace with other rank files into one file: give a folder" in capsys.readouterr().err
    out = tmp_path / "annotated"
    assert main(["analyze", str(mixed), "--no-files", "--annotate", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["merged.json", "rank-7.json"]
    mark = lambda p: [e for e in json.loads(p.read_text())["traceEvents"] if e.get("cat") == "zoomer"]  # noqa: E731
    copied = mark(out / "merged.json")
    assert copied and {e["pid"] for e in copied if e["ph"] == "f"} <= {e["pid"] for e in json.loads(merged.read_text())["traceEvents"]}
    assert mark(out / "rank-7.json")
    ref = analyze_path(mixed)
    again = tmp_path / "again"
    again.mkdir()
    for p in out.iterdir():
        (again / p.name).write_text(p.read_text())
    assert analyze_path(again).features == ref.features  # the markers change no feature


def test_an_annotated_job_analyses_as_the_job(tmp_path):
    # `--annotate` of a rank folder writes one merged trace plus markers on a "zoomer" track that spans the
    # ranks' windows: read back, the markers belong to no rank (with rank 0 they widened its window to
    # rank 5's, which starts 1.5 ms later here)
    folder = tmp_path / "job"
    folder.mkdir()
    for r, slow in ((0, 1.0), (5, 2.5)):
        (folder / f"rank-{r}.json").write_text(json.dumps(rank_trace(r, slow, lag_us=300.0)))
    out = tmp_path / "annotated.json"
    assert main(["analyze", str(folder), "--no-files", "--annotate", str(out)]) == 0
    assert any(e.get("pid") == "zoomer" and e.get("ph") == "X" for e in json.loads(out.read_text())["traceEvents"])
    a, b = analyze_path(out), analyze_path(folder)
    assert a.features == b.features and a.findings == b.findings and a.bottleneck == b.bottleneck


def test_annotating_an_annotated_merged_trace_keeps_markers_out_of_the_ranks(tmp_path):
    # the markers already in the file belong to no rank: the second annotation places the same markers
    # (given to rank 0, the first listed, the markers of ranks 1 and 5 - which start 0.3 and 1.5 ms before
    # rank 0 here - moved rank 0's window and so its markers)
    folder = tmp_path / "job"
    folder.mkdir()
    for r, slow in ((0, 1.0), (1, 1.0), (5, 2.5)):
        (folder / f"rank-{r}.json").write_text(json.dumps(rank_trace(r, slow, lag_us=-300.0)))
    merged = tmp_path / "merged.json"
    assert main(["trace", "merge", str(folder), str(merged)]) == 0
    once, twice = tmp_path / "once.json", tmp_path / "twice.json"
    assert main(["analyze", str(merged), "--no-files", "--annotate", str(once)]) == 0
    assert main(["analyze", str(once), "--no-files", "--annotate", str(twice)]) == 0
    marks = lambda p: sorted(json.dumps(e, sort_keys=True) for e in json.loads(p.read_text())["traceEvents"]  # noqa: E731
                             if e.get("cat") == "zoomer" and e.get("ph") != "M")
    assert marks(twice) == sorted(marks(once) * 2)  # the first markers copied, the same ones placed again


@pytest.mark.parametrize("command", [
    ["merge", "{job}", "{out}.json"],
    ["merge", "{merged}", "{out}.json"],
    ["sample", "{job}", "{out}", "-k", "1"],
    ["filter", "{job}", "{out}", "--ranks", "0"],
])
def test_surgery_does_not_take_a_merged_trace_for_one_rank(job, tmp_path, capsys, command):
    # merge numbered a merged trace as one more rank (dlrm_8ranks merged + one rank file: "ranks [0, 1]", the 8
    # ranks pooled into one); sample and filter --ranks pick rank files the same way
    folder, merged = job
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "merged.json").write_text(merged.read_text())
    (mixed / "rank-7.json").write_text(json.dumps(rank_trace(7, 1.0)))
    args = [a.format(job=mixed, merged=merged, out=tmp_path / "out") for a in command]
    assert main(["trace", *args]) == 2
    assert "a trace merging 3 ranks (zoomer-ar trace merge), not one rank's" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.json").exists()
    assert main(["trace", "filter", str(mixed), str(tmp_path / "cats"), "--cat", "kernel"]) == 0  # per file: fine


@pytest.mark.parametrize("command", [
    ["merge", "{split}", "{out}.json.gz"],
    ["merge", "{first}", "{second}", "{out}.json.gz"],
    ["sample", "{split}", "{out}", "-k", "2"],
    ["filter", "{split}", "{out}", "--ranks", "0"],
])
def test_surgery_does_not_number_pieces_of_one_rank_as_ranks(shared_traces, tmp_path, capsys, command):
    """`trace split`'s per-step files all claim rank 0 (distributedInfo): merge numbered them by their
    order, a merged trace of 5 "ranks" that `analyze` then read as a 5-rank job (world size 5, a straggler
    among the steps) where it refuses the folder itself; sample and filter --ranks chose among them as
    ranks. They are refused the same way (exit 2, one line, nothing written)."""
    split = tmp_path / "split"
    assert main(["trace", "split", str(NS_FILE), str(split), "--steps-per-file", "2"]) == 0
    first, second = sorted(split.iterdir())[:2]
    capsys.readouterr()
    args = [a.format(split=split, first=first, second=second, out=tmp_path / "out") for a in command]
    assert main(["trace", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "are both rank 0 (distributedInfo)" in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.json.gz").exists()
    assert main(["trace", "filter", str(split), str(tmp_path / "cats"), "--cat", "kernel"]) == 0  # per file: fine
    capsys.readouterr()
    assert main(["analyze", str(split), "--no-files"]) == 2  # as analyze refuses the folder
    assert "are both rank 0 (distributedInfo)" in capsys.readouterr().err
