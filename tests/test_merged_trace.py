"""A `zoomer-ar trace merge` output is analysed as the ranks it merges (zoomer_ar/load/merged.py):
the same per-rank features, findings and job as the rank files give, whichever ranks were merged and
whatever their pids; the streaming pass, which keeps a subset chosen for the file as one rank,
refuses such a file instead of pooling its ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.cli import main
from zoomer_ar.errors import InputError
from zoomer_ar.load import load_job
from zoomer_ar.load.merged import PID_STRIDE, merged_ranks, rank_of_pid

EPOCH_US = 1_700_000_000_000_000


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


@pytest.mark.parametrize("workers", [1])
def test_the_streaming_pass_refuses_a_merged_trace(job, workers):
    from zoomer_ar.stream import load_job_streaming

    _, merged = job
    with pytest.raises(InputError) as exc:
        load_job_streaming(merged, workers=workers)
    assert "merging 3 ranks" in exc.value.reason and "--no-stream" in exc.value.reason


def test_cli_stream_exit_2(job, capsys):
    _, merged = job
    assert main(["analyze", str(merged), "--stream", "--no-files"]) == 2
    assert "merging 3 ranks (zoomer-ar trace merge)" in capsys.readouterr().err


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


def test_a_job_mixing_a_merged_trace_with_rank_files_is_not_annotated(job, tmp_path, capsys):
    folder, merged = job
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "merged.json").write_text(merged.read_text())
    doc = rank_trace(7, 1.0)
    (mixed / "rank-7.json").write_text(json.dumps(doc))
    assert main(["analyze", str(mixed), "--no-files", "--annotate", str(tmp_path / "m.json")]) == 2
    assert "mixes a merged trace with other rank files" in capsys.readouterr().err


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
