"""A folder is one job only when its traces are ranks of one run: they name distinct ranks
(distributedInfo, or rank-N in the file names), or they were recorded at the same time. Traces of
separate runs (different models, a before and an after, two cycles of one rank's profiler schedule)
are refused with exit 2 instead of being compared as ranks (a made-up sharding imbalance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.errors import InputError
from zoomer_ar.load import load_job
from zoomer_ar.load.folder import SAME_JOB_GAP_S

EPOCH_US = 1_700_000_000_000_000  # epoch microseconds, as Kineto writes them


def trace(shift_us: float = 0.0, rank: int | None = None, world: int = 2) -> dict:
    """Three steps of a tiny GPU program starting at EPOCH_US + shift_us."""
    t = EPOCH_US + shift_us
    events = []
    for s in range(3):
        b = t + s * 1000.0
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": b, "dur": 900},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": b + 10, "dur": 5,
             "args": {"correlation": 7 + s}},
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": b + 20, "dur": 300,
             "args": {"correlation": 7 + s, "stream": 7, "device": 0}},
        ]
    doc: dict = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": world}
    return doc


def folder(tmp_path: Path, files: dict[str, dict]) -> Path:
    d = tmp_path / "job"
    d.mkdir()
    for name, doc in files.items():
        (d / name).write_text(json.dumps(doc))
    return d


def refused(d: Path, stream: bool) -> InputError:
    with pytest.raises(InputError) as exc:
        if stream:
            from zoomer_ar.stream import load_job_streaming
            load_job_streaming(d)
        else:
            load_job(d)
    return exc.value


@pytest.mark.parametrize("stream", [False, True])
def test_traces_of_separate_runs_are_not_one_job(tmp_path, stream):
    d = folder(tmp_path, {"before.json": trace(), "after.json": trace(shift_us=90e6)})  # 90 s later
    err = refused(d, stream)
    assert err.path == str(d)
    assert "not one job" in err.reason and "recorded at different times" in err.reason
    assert "before.json ends 90 s before after.json starts" in err.reason
    assert "zoomer-ar batch" in err.reason and "zoomer-ar compare" in err.reason


@pytest.mark.parametrize("stream", [False, True])
def test_ranks_recorded_together_are_one_job_without_rank_names(tmp_path, stream):
    # no distributedInfo, no rank in the names (an old profiler, files named by host): the windows overlap
    d = folder(tmp_path, {"host-a.json": trace(), "host-b.json": trace(shift_us=300.0)})
    if stream:
        from zoomer_ar.stream import load_job_streaming
        job = load_job_streaming(d)
    else:
        job = load_job(d)
    assert len(job.ranks) == 2 and job.info.world_size == 2


@pytest.mark.parametrize("gap_s, one_job", [(SAME_JOB_GAP_S * 0.5, True), (SAME_JOB_GAP_S * 3, False)])
def test_clock_skew_tolerance(tmp_path, gap_s, one_job):
    # a window lasts 2,900 us (the last step's annotation ends it); a second host whose clock runs ahead
    # leaves a gap between the two windows
    d = folder(tmp_path, {"host-a.json": trace(), "host-b.json": trace(shift_us=2900.0 + gap_s * 1e6)})
    if one_job:
        assert len(load_job(d).ranks) == 2
    else:
        assert "not one job" in refused(d, stream=False).reason


@pytest.mark.parametrize("names", [("rank-0.json", "rank-1.json"), ("worker0.json", "worker1.json")])
def test_distinct_rank_names_are_trusted(tmp_path, names):
    d = folder(tmp_path, {names[0]: trace(), names[1]: trace(shift_us=90e6)})
    job = load_job(d)
    assert [r.rank for r in job.ranks] == [0, 1]
    assert [i.rank_source for i in job.info.ranks] == ["file name", "file name"]


def test_distinct_distributed_ranks_are_trusted(tmp_path):
    # hosts whose clocks disagree by seconds: the job's own metadata says these are its ranks
    d = folder(tmp_path, {"a.json": trace(rank=0), "b.json": trace(shift_us=5e6, rank=1)})
    job = load_job(d)
    assert [i.rank_source for i in job.info.ranks] == ["distributedInfo", "distributedInfo"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_log_folder_of_several_runs_analyses_the_latest(tmp_path, stream):
    # torch.profiler.tensorboard_trace_handler writes host_pid.<ms>.pt.trace.json for every rank of every run
    # (and every profiling cycle) into one folder: the latest run's ranks are the job, earlier runs are skipped
    files = {}
    for run, (t, pid) in enumerate(((0.0, 100), (60e6, 200), (75e6, 300))):
        for r in range(2):
            files[f"host_{pid + r}.{1700000000000 + run}.pt.trace.json"] = trace(shift_us=t + r * 50.0, rank=r)
    d = folder(tmp_path, files)
    if stream:
        from zoomer_ar.stream import load_job_streaming
        job = load_job_streaming(d)
    else:
        job = load_job(d)
    assert [Path(i.path).name for i in job.info.ranks] == ["host_300.1700000000002.pt.trace.json",
                                                            "host_301.1700000000002.pt.trace.json"]
    assert [i.rank for i in job.info.ranks] == [0, 1] and job.info.world_size == 2
    assert len(job.info.skipped) == 4
    reasons = {Path(s.path).name: s.reason for s in job.info.skipped}
    assert reasons["host_100.1700000000000.pt.trace.json"].startswith("an earlier run: its run ends 75 s before the latest one")
    assert reasons["host_200.1700000000001.pt.trace.json"].startswith("an earlier run: its run ends 15 s before the latest one")
    assert all(r.endswith("whose 2 rank files are analysed") for r in reasons.values())


def test_two_cycles_of_one_rank_analyse_the_latest(tmp_path):
    # a profiler schedule with repeat=2 writes a file per cycle, both rank 0 of a one-rank job
    d = folder(tmp_path, {"w0_step_12.json": trace(rank=0, world=1), "w0_step_24.json": trace(shift_us=4e6, rank=0, world=1)})
    job = load_job(d)
    assert [Path(i.path).name for i in job.info.ranks] == ["w0_step_24.json"]
    assert [Path(s.path).name for s in job.info.skipped] == ["w0_step_12.json"]


def test_ranks_repeated_within_the_latest_run_are_refused(tmp_path):
    # two files of rank 0 recorded together (not a later run): no run to choose, not two ranks
    d = folder(tmp_path, {"a.json": trace(rank=0), "b.json": trace(shift_us=500.0, rank=0), "c.json": trace(rank=1)})
    err = refused(d, stream=False)
    assert "a.json and b.json are both rank 0 (distributedInfo)" in err.reason


def test_distinct_ranks_with_skewed_clocks_are_not_runs(tmp_path):
    # rank 1's host clock runs 30 s behind: distinct distributedInfo ranks are one job whatever their times
    d = folder(tmp_path, {"a.json": trace(rank=0), "b.json": trace(shift_us=-30e6, rank=1)})
    job = load_job(d)
    assert [i.rank for i in job.info.ranks] == [0, 1] and not job.info.skipped


@pytest.mark.parametrize("stream", [False, True])
def test_a_split_trace_folder_is_not_a_job_of_ranks(tmp_path, shared_traces, stream):
    # `trace split` writes one file per step of one rank: worker0...steps_5-5, steps_6-6, ... all rank 0
    out = tmp_path / "steps"
    src = next((shared_traces / "kineto" / "resnet50_num_workers_0").glob("*.json.gz"))
    assert main(["trace", "split", str(src), str(out)]) == 0
    assert len(list(out.iterdir())) >= 2
    err = refused(out, stream)
    assert "are both rank 0 (file name)" in err.reason and "trace split" in err.reason


def test_same_rank_in_distributed_info_with_distinct_rank_names_is_a_job(tmp_path):
    # a generator's ranks may all say distributedInfo rank 0: their rank-N names tell them apart
    d = folder(tmp_path, {f"rank-{r}.json": trace(shift_us=r * 10.0, rank=0) for r in range(3)})
    job = load_job(d)
    assert [i.rank for i in job.info.ranks] == [0, 1, 2]
    assert {i.rank_source for i in job.info.ranks} == {"file name"}


def test_gap_is_told_in_a_readable_unit(tmp_path):
    d = folder(tmp_path, {"monday.json": trace(), "friday.json": trace(shift_us=4 * 86400e6)})
    assert "ends 4.0 days before friday.json starts" in refused(d, stream=False).reason


def test_cli_exit_2_one_line(tmp_path, capsys):
    d = folder(tmp_path, {"before.json": trace(), "after.json": trace(shift_us=3600e6)})
    assert main(["analyze", str(d), "--no-files"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not one job" in err and str(d) in err and "60.0 minutes" in err


def test_real_folder_of_different_models_is_refused(shared_traces, capsys):
    # five single-GPU inference traces of five models (LABELS.yaml labels each on its own)
    d = shared_traces / "tracelens" / "h100"
    assert main(["analyze", str(d), "--no-files"]) == 2
    err = capsys.readouterr().err
    assert "not one job" in err and "minutes before" in err


def test_real_before_and_after_traces_are_refused(shared_traces, capsys):
    d = shared_traces / "kineto" / "sync_event_order"
    assert main(["analyze", str(d), "--no-files"]) == 2
    assert "before_fix_trace.json ends" in capsys.readouterr().err


def test_real_rank_folder_is_one_job(shared_traces):
    job = load_job(shared_traces / "param" / "dlrm_8ranks")
    assert [r.rank for r in job.ranks] == list(range(8))


@pytest.mark.parametrize("stream", [False, True])
def test_a_copy_of_a_trace_is_skipped_not_a_rank(tmp_path, stream):
    import gzip
    doc = trace(rank=0, world=1)
    d = folder(tmp_path, {"w0.json": doc, "w0 (1).json": doc})
    (d / "w0.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))  # beside its decompressed copy
    if stream:
        from zoomer_ar.stream import load_job_streaming
        job = load_job_streaming(d)
    else:
        job = load_job(d)
    assert len(job.ranks) == 1 and job.info.world_size == 1
    kept = Path(job.info.ranks[0].path).name
    assert sorted(Path(s.path).name for s in job.info.skipped) == sorted({"w0.json", "w0 (1).json", "w0.json.gz"} - {kept})
    assert all(s.reason == f"the same trace as {kept}" for s in job.info.skipped)


def test_a_near_copy_is_a_rank(tmp_path):
    # the same program on two ranks at the same time, one kernel 1 us longer: two ranks, not a copy
    a, b = trace(), trace()
    b["traceEvents"][2]["dur"] += 1
    job = load_job(folder(tmp_path, {"host-a.json": a, "host-b.json": b}))
    assert len(job.ranks) == 2 and not job.info.skipped


def test_copies_are_reported_by_analyze(tmp_path, capsys):
    doc = trace(rank=0, world=1)
    d = folder(tmp_path, {"a.json": doc, "b.json": doc})
    assert main(["analyze", str(d), "--no-files", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["job"]["ranks"]) == 1
    assert any("b.json" in n and "the same trace as a.json" in n for n in out["notes"])


def test_files_naming_different_ranks_stay_ranks_even_with_the_same_events(tmp_path):
    # a test fixture's ranks (or a generator's) may hold the same events: their names say they are ranks
    doc = trace()
    job = load_job(folder(tmp_path, {"rank-0.json": doc, "rank-1.json": doc, "copy.json": doc}))
    assert [r.rank for r in job.ranks] == [0, 1]
    assert [Path(s.path).name for s in job.info.skipped] == ["copy.json"]


def test_windows_are_read_in_chunks(tmp_path, monkeypatch):
    # a streamed rank of millions of rows is read a chunk at a time: the same window and verdicts with tiny chunks
    import zoomer_ar.load.folder as J
    monkeypatch.setattr(J, "WINDOW_ROWS", 2)
    d = folder(tmp_path, {"before.json": trace(), "after.json": trace(shift_us=90e6)})
    assert "before.json ends 90 s before after.json starts" in refused(d, stream=False).reason
    (tmp_path / "x").mkdir()
    job = load_job(folder(tmp_path / "x", {"a.json": trace(), "b.json": trace(shift_us=300.0)}))
    assert [J._window(r) for r in job.ranks] == [(0.0, 2900.0), (0.0, 2900.0)]  # each in its rank's base
    (a0, a1), (b0, b1) = (J._Windows()(r) for r in job.ranks)  # absolute: the 300 us between them
    assert (b0 - a0, b1 - a1, a1 - a0) == (300.0, 300.0, 2900.0)


def test_earlier_runs_are_one_note(tmp_path, capsys):
    files = {f"host_{100 * run + r}.{run}.pt.trace.json": trace(shift_us=run * 60e6 + r * 50.0, rank=r)
             for run in range(4) for r in range(2)}
    d = folder(tmp_path, files)
    assert main(["analyze", str(d), "--no-files", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["job"]["skipped"]) == 6  # findings.json lists every skipped file
    notes = [n for n in out["notes"] if n.startswith("Skipped")]
    assert notes == ["Skipped 6 files of earlier runs (host_0.0.pt.trace.json, host_1.0.pt.trace.json, "
                     "host_100.1.pt.trace.json and 3 more): the folder holds several runs; the latest one's 2 rank "
                     "files are analysed. Move a run's files to a folder of its own to analyse it."]


@pytest.mark.parametrize("stream", [False, True])
def test_a_folder_of_run_subfolders_names_them(tmp_path, stream):
    # TensorBoard's layout: log/<run>/<rank files>; the folder itself holds none
    log = tmp_path / "log"
    for run, n in (("run_b", 2), ("run_a", 1)):
        (log / run).mkdir(parents=True)
        for r in range(n):
            (log / run / f"rank-{r}.json").write_text(json.dumps(trace(rank=r)))
    (log / "notes").mkdir()  # a subfolder without traces is not named
    err = refused(log, stream)
    assert err.reason == ("folder holds no trace files (*.json, *.json.gz); its subfolders do "
                          "(run_a: 1 file, run_b: 2 files): analyse one of them")


def test_a_folder_without_traces_anywhere_says_so(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert refused(tmp_path / "empty", stream=False).reason == "folder holds no trace files (*.json, *.json.gz)"


def test_a_rank_alone_says_the_cross_rank_figures_need_the_others(shared_traces):
    from zoomer_ar.analyze import analyze_path

    one = analyze_path(next((shared_traces / "param" / "dlrm_8ranks").glob("worker3_*")))
    assert "Rank 3 alone of the job's 8 ranks: stragglers and imbalance need the other ranks' traces" \
        " (analyse the folder of every rank's trace)." in one.notes
    whole = analyze_path(shared_traces / "param" / "dlrm_8ranks")
    assert not any("of the job's" in n for n in whole.notes)


def test_a_sample_of_ranks_says_which(tmp_path, shared_traces):
    out = tmp_path / "sample"
    assert main(["trace", "sample", str(shared_traces / "param" / "dlrm_8ranks"), str(out), "--ranks", "0,1,5"]) == 0
    from zoomer_ar.analyze import analyze_path

    notes = analyze_path(out).notes
    assert "3 of the job's 8 ranks analysed (0, 1, 5): stragglers and imbalance compare these 3 only (analyse the " \
           "folder of every rank's trace for the whole job)." in notes


def test_a_job_without_a_world_size_gets_no_such_note(tmp_path):
    from zoomer_ar.analyze import analyze_path

    d = folder(tmp_path, {"host-a.json": trace(), "host-b.json": trace(shift_us=300.0)})
    assert not any("of the job's" in n or "alone" in n for n in analyze_path(d).notes)


def test_profiling_cycles_of_one_process_analyse_the_latest(tmp_path):
    # a single-GPU script under schedule(..., repeat=2) with tensorboard_trace_handler: one file a cycle,
    # <host>_<pid>.<ms>.pt.trace.json, no distributedInfo
    d = folder(tmp_path, {"gpu-box_4242.1700000000000.pt.trace.json": trace(),
                          "gpu-box_4242.1700000030000.pt.trace.json": trace(shift_us=30e6)})
    job = load_job(d)
    assert [Path(i.path).name for i in job.info.ranks] == ["gpu-box_4242.1700000030000.pt.trace.json"]
    assert [Path(s.path).name for s in job.info.skipped] == ["gpu-box_4242.1700000000000.pt.trace.json"]
    assert job.info.skipped[0].reason.startswith("an earlier run: its run ends 30 s before the latest one")


def test_traces_named_otherwise_are_not_taken_for_cycles(tmp_path):
    # the same two traces under other names (a before and an after): refused, not "the latest"
    d = folder(tmp_path, {"before.json": trace(), "after.json": trace(shift_us=30e6)})
    assert "not one job" in refused(d, stream=False).reason
