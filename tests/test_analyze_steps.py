"""`zoomer-ar analyze --steps N..M`: a window of profiler steps, cut out of each rank by the streaming
`trace slice` into a temporary folder and analysed (zoomer_ar/step_window.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zoomer_ar.cli import main

from conftest import SHARED_TRACES

NS = SHARED_TRACES / "hta" / "ns_resolution_trace"  # one rank, ProfilerStep#101..#105
DLRM_RANK = SHARED_TRACES / "param" / "dlrm_8ranks" / "worker0_step_12.1694128201545.pt.trace.json.gz"  # step 10

# what a cut to every step leaves out: the events before the first step and after the last (profiler
# start-up and stop), so the profiled wall time and the idle share of the phases, which span them
WINDOW_ONLY = {"wall_ms", "per_rank", "cost_attribution"} | {f"phase_{p}_pct" for p in
                                                              ("dataloader", "forward", "backward", "optimizer",
                                                               "communication", "idle")}


def _analyze(args: list[str], capsys) -> tuple[int, dict | None, str]:
    code = main(["analyze", *args, "--no-files", "--format", "json", "--no-progress"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_every_step_gives_the_whole_traces_step_and_device_figures(shared_traces, capsys, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the cuts go (TMPDIR is read once a process)
    seen = []
    real = tempfile.TemporaryDirectory

    def watched(*a, **kw):
        d = real(*a, **kw)
        seen.append(Path(d.name))
        return d

    monkeypatch.setattr(tempfile, "TemporaryDirectory", watched)
    code, full, _ = _analyze([str(NS)], capsys)
    assert code == 0
    code, win, err = _analyze([str(NS), "--steps", "101..105"], capsys)
    assert code == 0, err
    differ = {k for k in full["features"] if full["features"][k] != win["features"].get(k)}
    assert differ <= WINDOW_ONLY, differ
    assert full["features"]["gpu_busy_pct"] == win["features"]["gpu_busy_pct"]
    assert [(f["pattern"], f["impact"]) for f in full["findings"]] == [(f["pattern"], f["impact"]) for f in win["findings"]]
    # told as the original trace's steps, with the window's hashes
    assert win["job"]["path"] == str(NS)
    assert [r["path"] for r in win["job"]["ranks"]] == [r["path"] for r in full["job"]["ranks"]]
    assert win["job"]["ranks"][0]["sha256"] != full["job"]["ranks"][0]["sha256"]
    assert win["notes"][0].startswith("Analysed ProfilerStep#101..#105 only (--steps)")
    assert len(seen) == 1 and seen[0].parent == tmp_path and seen[0].name.startswith("zoomer-steps-")
    assert not seen[0].exists(), "the temporary folder of the cuts stays behind"


def test_a_window_of_two_steps(shared_traces, capsys):
    code, win, err = _analyze([str(NS), "--steps", "102..103"], capsys)
    assert code == 0, err
    f = win["features"]
    assert f["profiler_steps"] == 2 and f["first_profiled_step"] == 102
    assert "fp32-matmul" in {x["pattern"] for x in win["findings"]}
    # a range beyond the trace's steps keeps those it has, and says so
    code, win, err = _analyze([str(NS), "--steps", "104..120"], capsys)
    assert code == 0, err
    assert win["features"]["profiler_steps"] == 2
    assert any("kept steps 104..105" in n for n in win["notes"]), win["notes"]


def test_a_rank_without_the_steps_is_skipped_with_its_reason(shared_traces, capsys, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(next(NS.glob("*.json.gz")), job / "rank-0.pt.trace.json.gz")
    shutil.copy(DLRM_RANK, job / "rank-1.pt.trace.json.gz")
    code, win, err = _analyze([str(job), "--steps", "102..103"], capsys)
    assert code == 0, err
    assert [Path(r["path"]).name for r in win["job"]["ranks"]] == ["rank-0.pt.trace.json.gz"]
    (skipped,) = win["job"]["skipped"]
    assert skipped["path"] == str(job / "rank-1.pt.trace.json.gz")
    assert "no ProfilerStep#102..103" in skipped["reason"] and "steps present: 10" in skipped["reason"]
    # and the notes say so, as they do without --steps
    assert f"Skipped {job / 'rank-1.pt.trace.json.gz'}: {skipped['reason']}" in win["notes"], win["notes"]


def test_skipped_files_are_noted_under_their_own_paths(shared_traces, capsys, tmp_path):
    """--steps: a rank file skipped while cut (truncated) gets its `Skipped FILE: reason` note, as it does
    without --steps, and one the analysis of the cuts skipped (a decompressed twin) is noted under its
    own path and names its twin's, never a temporary cut's (both used to: no note, a /tmp path)."""
    import gzip

    job = tmp_path / "job"
    job.mkdir()
    src = next(NS.glob("*.json.gz"))
    shutil.copy(src, job / "rank-0.pt.trace.json.gz")
    (job / "rank-0.pt.trace.json").write_bytes(gzip.decompress(src.read_bytes()))
    (job / "rank-1.pt.trace.json.gz").write_bytes(DLRM_RANK.read_bytes()[:20000])  # truncated
    code, win, err = _analyze([str(job), "--steps", "102..103"], capsys)
    assert code == 0, err
    skipped = [n for n in win["notes"] if n.startswith("Skipped ")]
    assert len(skipped) == 2, win["notes"]
    assert all(n.startswith(f"Skipped {job}{'/'}") for n in skipped), skipped
    assert any(n.startswith(f"Skipped {job / 'rank-1.pt.trace.json.gz'}: ") for n in skipped), skipped
    (twin,) = [n for n in skipped if "the same trace as" in n]
    pair = {f"Skipped {job / 'rank-0.pt.trace.json'}: the same trace as rank-0.pt.trace.json.gz",
            f"Skipped {job / 'rank-0.pt.trace.json.gz'}: the same trace as rank-0.pt.trace.json"}
    assert twin in pair, twin  # which of the twins is read is the loader's choice


@pytest.mark.parametrize("steps, words", [
    ("5..3", "--steps 5..3 is reversed"),
    ("abc", "--steps 'abc': expected N..M"),
    ("900..901", "no ProfilerStep#900..901 in this trace (steps present: 101..105)"),
])
def test_bad_steps_are_one_line_and_exit_2(shared_traces, capsys, steps, words):
    code, _, err = _analyze([str(NS), "--steps", steps], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_steps_with_annotate_or_a_missing_path_are_refused_before_any_work(shared_traces, capsys, tmp_path):
    out = tmp_path / "marked.json.gz"
    code = main(["analyze", str(NS), "--steps", "101..102", "--annotate", str(out), "--no-files"])
    err = capsys.readouterr().err
    assert code == 2 and "--annotate marks the whole trace" in err and not out.exists()
    code, _, err = _analyze([str(tmp_path / "nope.json"), "--steps", "1..2"], capsys)
    assert code == 2 and "nope.json" in err


def test_the_memory_budget_message_names_analyze_steps():
    from zoomer_ar.stream.guard import MemoryGuard
    from zoomer_ar.errors import InputError

    with pytest.raises(InputError) as exc:
        MemoryGuard(Path("big.json"), 0.001).check(10)
    assert "zoomer-ar analyze --steps N..M" in str(exc.value)


DLRM = SHARED_TRACES / "param" / "dlrm_8ranks"  # 8 ranks, ProfilerStep#10 each


def test_ranks_cut_in_parallel_give_what_one_process_gives(shared_traces, capsys, monkeypatch):
    """The ranks of a folder are cut in worker processes (ZOOMER_STREAM_WORKERS, default the CPU
    count), as the streaming reader reads them: the analysis is the one of cuts made one by one."""
    results = {}
    for workers in ("1", "3"):
        monkeypatch.setenv("ZOOMER_STREAM_WORKERS", workers)
        code, win, err = _analyze([str(DLRM), "--steps", "10..10"], capsys)
        assert code == 0, err
        results[workers] = win
    one, three = results["1"], results["3"]
    assert len(three["job"]["ranks"]) == 8
    assert [r["path"] for r in three["job"]["ranks"]] == sorted(str(p) for p in DLRM.iterdir())
    for key in ("features", "findings", "bottleneck", "notes"):
        assert one[key] == three[key], key
    assert [r["sha256"] for r in one["job"]["ranks"]] == [r["sha256"] for r in three["job"]["ranks"]]


def test_two_rank_files_with_one_cut_name_do_not_overwrite_each_other(shared_traces, capsys, tmp_path, monkeypatch):
    """x.json beside x.json.gz (a trace and its decompressed copy) cut to the same plain name: each
    cut gets its own file, and the folder's check skips the copy as it does without --steps."""
    import gzip

    job = tmp_path / "job"
    job.mkdir()
    src = next(NS.glob("*.json.gz"))
    shutil.copy(src, job / "rank-0.pt.trace.json.gz")
    (job / "rank-0.pt.trace.json").write_bytes(gzip.decompress(src.read_bytes()))
    monkeypatch.setenv("ZOOMER_STREAM_WORKERS", "2")
    code, win, err = _analyze([str(job), "--steps", "102..103"], capsys)
    assert code == 0, err
    assert len(win["job"]["ranks"]) == 1 and win["features"]["profiler_steps"] == 2
    (skipped,) = win["job"]["skipped"]
    names = {Path(win["job"]["ranks"][0]["path"]).name, Path(skipped["path"]).name}
    assert names == {"rank-0.pt.trace.json.gz", "rank-0.pt.trace.json"}
    assert skipped["reason"].startswith("the same trace as ")


def test_the_workers_cuts_report_their_reads_to_the_bars(shared_traces, tmp_path):
    """Each worker's reads (survey, launches, copy) report their bytes through shared memory to the
    bar of its file in the main process."""
    from zoomer_ar.step_window import cut_steps

    job = tmp_path / "job"
    job.mkdir()
    src = next(NS.glob("*.json.gz"))
    for r in range(2):
        shutil.copy(src, job / f"rank-{r}.pt.trace.json.gz")
    seen: dict[str, list[tuple[int, int]]] = {}

    def factory(path: Path):
        return lambda done, total: seen.setdefault(path.name, []).append((done, total))

    out = tmp_path / "cuts"
    out.mkdir()
    cut, originals, skipped, notes = cut_steps(job, (102, 103), out, workers=2, progress_factory=factory)
    assert cut == out and len(originals) == 2 and not skipped
    assert set(seen) == {"rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"}
    size = src.stat().st_size
    for reports in seen.values():
        assert any(0 < done and total == size for done, total in reports), reports  # the worker's reads, of the file as stored
        assert reports[-1] == (size, size)  # each file's bar ends complete


def test_sigterm_while_cutting_removes_the_cuts_and_exits_143(shared_traces, tmp_path):
    """A job scheduler's SIGTERM during --steps unwinds like Ctrl-C: the temporary folder of the cuts
    is removed (the default action killed the process and left it in TMPDIR)."""
    import os
    import subprocess
    import sys
    import textwrap

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        import zoomer_ar.surgery.cut as cut
        real = cut.slice_trace

        def stopped(src, dst, **kw):
            real(src, dst, **kw)  # the cut is written, then the signal comes
            assert Path(dst).exists()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)

        cut.slice_trace = stopped
        from zoomer_ar.cli import main
        sys.exit(main(["analyze", {str(NS)!r}, "--steps", "101..102", "--no-files", "--no-progress"]))
    """)
    env = {**os.environ, "TMPDIR": str(tmp), "ZOOMER_STREAM_WORKERS": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    assert list(tmp.iterdir()) == [], "the cuts stayed behind"


def test_small_rank_files_are_cut_without_starting_workers(shared_traces, tmp_path, monkeypatch):
    """Starting worker processes costs more than cutting a few small files (dlrm_8ranks: 0.89 s with
    two workers against 0.62-0.74 s here): below POOL_MIN_BYTES together the cuts run in this
    process, unless ZOOMER_STREAM_WORKERS asks for workers."""
    import zoomer_ar.stream.pool as pool
    from zoomer_ar.step_window import POOL_MIN_BYTES, cut_steps

    assert sum(p.stat().st_size for p in DLRM.iterdir()) < POOL_MIN_BYTES
    calls = []
    real = pool.run_pool
    monkeypatch.setattr(pool, "run_pool", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.delenv("ZOOMER_STREAM_WORKERS", raising=False)
    (tmp_path / "a").mkdir()
    cut, originals, _, _ = cut_steps(DLRM, (10, 10), tmp_path / "a")
    assert len(originals) == 8 and calls == []
    monkeypatch.setenv("ZOOMER_STREAM_WORKERS", "2")
    (tmp_path / "b").mkdir()
    cut, originals, _, _ = cut_steps(DLRM, (10, 10), tmp_path / "b")
    assert len(originals) == 8 and calls == [1]


def _kept_and_skipped(result: dict) -> tuple[list[str], list[tuple[str, str]]]:
    return ([r["path"] for r in result["job"]["ranks"]],
            sorted((s["path"], s["reason"]) for s in result["job"]["skipped"]))


def test_steps_keep_the_twin_plain_analyze_keeps(shared_traces, capsys, tmp_path):
    """x.json beside x.json.gz (the same JSON), and a third copy named for its rank: --steps reads the
    same file plain `analyze` reads and skips the same copies (it kept x.json.gz where analyze keeps
    x.json: the cut of the .gz was named `3.x.json`, which sorts first)."""
    import gzip

    job = tmp_path / "job"
    job.mkdir()
    plain = gzip.decompress(DLRM_RANK.read_bytes())
    (job / "x.json").write_bytes(plain)
    shutil.copy(DLRM_RANK, job / "x.json.gz")
    code, full, err = _analyze([str(job)], capsys)
    assert code == 0, err
    code, win, err = _analyze([str(job), "--steps", "10..10"], capsys)
    assert code == 0, err
    assert _kept_and_skipped(win) == _kept_and_skipped(full) == (
        [str(job / "x.json")], [(str(job / "x.json.gz"), "the same trace as x.json")])
    shutil.copy(DLRM_RANK, job / "worker0.json.gz")  # names its rank: the copy analyze keeps first
    (job / "worker1.json").write_bytes(plain.replace(b'"rank": 0', b'"rank": 1'))
    code, full, err = _analyze([str(job)], capsys)
    assert code == 0, err
    code, win, err = _analyze([str(job), "--steps", "10..10"], capsys)
    assert code == 0, err
    assert _kept_and_skipped(win) == _kept_and_skipped(full)
    assert _kept_and_skipped(win)[0] == [str(job / "worker0.json.gz"), str(job / "worker1.json")]


def test_steps_read_a_folder_of_gz_files_without_json_in_their_names(shared_traces, capsys, tmp_path):
    """worker0.gz, worker1.gz: `analyze` reads them as ranks; --steps cut them to `worker0`, `worker1`,
    names no reader takes for traces, and failed naming its temporary folder."""
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(DLRM_RANK, job / "worker0.gz")
    shutil.copy(DLRM_RANK, job / "WORKER1.GZ")
    code, full, err = _analyze([str(job)], capsys)
    assert code == 0, err
    code, win, err = _analyze([str(job), "--steps", "10..10"], capsys)
    assert code == 0, err
    assert _kept_and_skipped(win) == _kept_and_skipped(full)
    assert len(win["job"]["ranks"]) == 2


def test_a_refusal_of_the_cuts_names_the_files_given(shared_traces, capsys, tmp_path):
    """A folder of one rank's pieces (`trace split`'s files) is refused as `analyze` refuses it, naming
    the folder and its files, not the temporary folder of the cuts and their plain names."""
    pieces = tmp_path / "pieces"
    assert main(["trace", "split", str(next(NS.glob("*.json.gz"))), str(pieces)]) == 0
    capsys.readouterr()
    code, _, plain_err = _analyze([str(pieces)], capsys)
    assert code == 2
    code, _, err = _analyze([str(pieces), "--steps", "101..102"], capsys)
    assert code == 2
    assert err == plain_err and err.startswith(f"zoomer-ar: error: {pieces}: not one job: ")
    assert "zoomer-steps-" not in err and "steps_101-101.json.gz and " in err
