"""`zoomer-ar trace ...` on the inputs a user audit tripped over: stray JSON files in a job folder
(D7), 2021-schema category names (D8), reversed windows (D10) and what sample/compress report
(D12). Every test drives the real CLI on real traces; each failed on the code before the fix."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.surgery import ops

from conftest import SHARED_TRACES

DLRM = SHARED_TRACES / "param/dlrm_8ranks"
RESNET_2021 = SHARED_TRACES / "kineto/resnet50_num_workers_0"


def _events(path: Path) -> list[dict]:
    data = path.read_bytes()
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return doc["traceEvents"]


@pytest.fixture
def job_with_stray_file(tmp_path: Path, shared_traces) -> Path:
    """Two rank traces of a real job plus a JSON file that is not a trace (sorts first: bad1.json)."""
    job = tmp_path / "job"
    job.mkdir()
    for pattern in ("worker0_*", "worker1_*"):
        for f in DLRM.glob(pattern):
            shutil.copyfile(f, job / f.name)
    (job / "bad1.json").write_text('{"hello": 1}')
    return job


def _trace_2021() -> Path:
    return next(RESNET_2021.glob("*.json.gz"))


# ---- D7: job folders with a file that is not a trace -------------------------------------------


def test_merge_skips_a_stray_json_file_with_a_note(job_with_stray_file, tmp_path, capsys):
    out = tmp_path / "merged.json.gz"
    assert main(["trace", "merge", str(job_with_stray_file), str(out)]) == 0
    io = capsys.readouterr()
    assert "note: skipped" in io.err and "bad1.json" in io.err and "no traceEvents" in io.err
    merged = json.loads(gzip.decompress(out.read_bytes()))
    assert merged["distributedInfo"]["merged_ranks"] == [0, 1]
    assert len(merged["traceEvents"]) > 1000


def test_merge_with_nothing_usable_exits_2_naming_the_file(tmp_path, capsys):
    folder = tmp_path / "only_bad"
    folder.mkdir()
    (folder / "notes.json").write_text('{"hello": 1}')
    assert main(["trace", "merge", str(folder), str(tmp_path / "m.json")]) == 2
    assert "notes.json" in capsys.readouterr().err
    assert main(["trace", "merge", str(folder / "notes.json"), str(tmp_path / "m.json")]) == 2
    assert "notes.json" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_sample_counts_only_real_traces_as_ranks(job_with_stray_file, tmp_path, capsys):
    out = tmp_path / "sample"
    assert main(["trace", "sample", str(job_with_stray_file), str(out), "-k", "1"]) == 0
    io = capsys.readouterr()
    assert [p.name for p in out.iterdir()] == [f.name for f in DLRM.glob("worker0_*")]
    assert "of 2" in io.out and "bad1.json" in io.err
    assert [r for r, _ in ops.job_files(job_with_stray_file)] == [0, 1]


def test_filter_of_a_job_folder_skips_the_stray_file_like_analyze(job_with_stray_file, tmp_path, capsys):
    out = tmp_path / "filtered"
    assert main(["trace", "filter", str(job_with_stray_file), str(out), "--exclude-cat", "python_function"]) == 0
    assert "bad1.json" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in job_with_stray_file.glob("worker*"))


def test_merge_of_files_given_one_by_one_skips_the_bad_one(job_with_stray_file, tmp_path):
    files = sorted(job_with_stray_file.iterdir())
    st = ops.merge_job(files, tmp_path / "m.json")
    assert len(st.skipped) == 1 and "bad1.json" in st.skipped[0]
    assert st.note == "ranks [0, 1]"


# ---- D8: categories of the 2021 schema ---------------------------------------------------------


def test_equivalence_table_is_explicit():
    assert ops.canonical_category("Operator") == ops.canonical_category("cpu_op")
    assert ops.canonical_category("Runtime") == ops.canonical_category("cuda_runtime")
    assert ops.canonical_category("Memcpy") == ops.canonical_category("gpu_memcpy")
    assert ops.canonical_category("Memset") == ops.canonical_category("gpu_memset")
    assert ops.canonical_category("Kernel") == ops.canonical_category("kernel")
    assert ops.canonical_category("cuda_driver") != ops.canonical_category("cuda_runtime")


def test_filter_today_names_on_a_2021_trace(tmp_path, capsys, shared_traces):
    out = tmp_path / "k.json.gz"
    assert main(["trace", "filter", str(_trace_2021()), str(out), "--cat", "kernel", "--cat", "cuda_runtime"]) == 0
    cats = {e.get("cat") for e in _events(out) if e["ph"] != "M"}
    assert cats == {"Kernel", "Runtime"}
    assert "warning" not in capsys.readouterr().err
    out2 = tmp_path / "no_ops.json"
    assert main(["trace", "filter", str(_trace_2021()), str(out2), "--exclude-cat", "cpu_op"]) == 0
    assert not any(e.get("cat") == "Operator" for e in _events(out2))


def test_filter_that_keeps_only_metadata_is_refused_naming_the_categories(tmp_path, capsys, shared_traces):
    """A metadata-only output is one `trace check` and `analyze` refuse: nothing is written, and the
    line names the categories the trace has (in its own schema)."""
    out = tmp_path / "none.json"
    assert main(["trace", "filter", str(_trace_2021()), str(out), "--cat", "no_such_category"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "kept no event besides metadata" in err
    for cat in ("Kernel", "Runtime", "Operator", "Memcpy", "Memset"):
        assert cat in err
    assert not out.exists()


# ---- D10: reversed or empty ranges -------------------------------------------------------------


@pytest.mark.parametrize("args", [["--window", "5..1"], ["--window", "5..5"], ["--steps", "5..3"]])
def test_slice_refuses_a_reversed_or_empty_range(args, tmp_path, capsys, shared_traces):
    out = tmp_path / "x.json"
    assert main(["trace", "slice", str(_trace_2021()), str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("reversed" in err or "empty" in err)
    assert not out.exists()


# ---- D12: what sample and compress did ---------------------------------------------------------


def test_sample_and_compress_report_files_and_bytes(tmp_path, capsys, shared_traces):
    assert main(["trace", "sample", str(DLRM), str(tmp_path / "s"), "-k", "2"]) == 0
    line = capsys.readouterr().out
    assert "0 of 0 events" not in line and line.startswith("wrote 2 files (") and "ranks [0, 7] of 8" in line
    out = tmp_path / "c.json"
    assert main(["trace", "compress", str(_trace_2021()), str(out)]) == 0
    line = capsys.readouterr().out
    assert "0 of 0 events" not in line and line.startswith("wrote 1 file (")
    assert f"{out.stat().st_size / 1e6:.1f} MB" in line


def test_sample_names_the_ranks_it_copied_not_those_it_skipped(tmp_path, capsys, shared_traces):
    """sample --ranks 0,4 with rank 0's file cut short wrote only rank 4 and said "ranks [0, 4] of 8"."""
    job = tmp_path / "job"
    shutil.copytree(DLRM, job)
    first = sorted(job.glob("*.json.gz"))[0]
    first.write_bytes(first.read_bytes()[: first.stat().st_size // 2])
    assert main(["trace", "sample", str(job), str(tmp_path / "s"), "--ranks", "0,4"]) == 0
    io = capsys.readouterr()
    assert f"note: skipped {first}" in io.err
    assert io.out.startswith("wrote 1 file (") and io.out.rstrip().endswith("; ranks [4] of 8 (rank 0 skipped)")


def test_filter_of_ranks_missing_from_the_job_is_bad_input(job_with_stray_file, tmp_path, capsys):
    """Used to write nothing and say `wrote 0 of 0 events` with exit 0."""
    assert main(["trace", "filter", str(job_with_stray_file), str(tmp_path / "f"), "--ranks", "5"]) == 2
    assert "ranks [5] not in this job" in capsys.readouterr().err


def test_a_merged_trace_is_analysed_as_its_ranks(tmp_path, shared_traces):
    """A `trace merge` output is read back as the ranks it merges (load/merged.py): the analysis of the
    merged file is the rank folder's (analysed as one rank it pooled the ranks: 8 steps of 2.6 ms)."""
    from zoomer_ar.analyze import analyze_path
    from zoomer_ar.cli import main as cli_main

    out = tmp_path / "merged.json.gz"
    assert cli_main(["trace", "merge", str(shared_traces / "param" / "dlrm_8ranks"), str(out)]) == 0
    merged, folder = analyze_path(out), analyze_path(shared_traces / "param" / "dlrm_8ranks")
    for part in ("features", "findings", "bottleneck", "timeline"):
        assert getattr(merged, part) == getattr(folder, part), part
    assert [r.rank for r in merged.job.ranks] == list(range(8)) and merged.job.world_size == 8
    assert {r.path for r in merged.job.ranks} == {str(out)}
    assert sum(r.n_events for r in merged.job.ranks) == sum(r.n_events for r in folder.job.ranks) == 26_538
    assert [r.n_events for r in merged.job.ranks] == [r.n_events for r in folder.job.ranks]
    assert [n for n in merged.notes if "merges" in n] == [
        "merged.json.gz merges 8 ranks (zoomer-ar trace merge): analysed as those ranks, as their rank files would be."]
    assert not any("merges" in n for n in folder.notes)

def test_check_of_a_rank_folder_checks_its_trace_files(tmp_path, capsys):
    """`trace check DIR` was a usage error ("is a directory") where every other trace command takes a job folder."""
    src = SHARED_TRACES / "param" / "dlrm_8ranks"
    if not src.is_dir():
        pytest.skip("shared traces not available")
    job = tmp_path / "job"
    shutil.copytree(src, job)
    (job / "notes.txt").write_text("not a trace\n")
    assert main(["trace", "check", str(job)]) == 0
    out = capsys.readouterr().out
    assert out.count(": valid (") == 8 and "notes.txt" not in out
    victim = sorted(job.glob("*.json.gz"))[3]
    victim.write_bytes(victim.read_bytes()[:5000])
    assert main(["trace", "check", str(job)]) == 2
    io = capsys.readouterr()
    assert out.count(": valid (") == 8 and io.out.count(": valid (") == 7
    assert f"{victim}: not a valid Chrome trace" in io.err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["trace", "check", str(empty)]) == 2
    assert "folder holds no trace files" in capsys.readouterr().err


def test_split_says_why_it_wrote_more_events_than_it_read(tmp_path, capsys, shared_traces):
    """`trace split` said 'wrote 81,289 of 75,718 events' with nothing saying how a split writes more than it reads."""
    src = next((SHARED_TRACES / "kineto" / "resnet50_num_workers_0").glob("*.json.gz"))
    assert main(["trace", "split", str(src), str(tmp_path / "steps")]) == 0
    line = capsys.readouterr().out
    wrote, read = (int(x.replace(",", "")) for x in line.split("wrote ")[1].split(" events")[0].split(" of "))
    assert wrote > read
    assert "an event in several files counts once in each: the metadata goes into every file" in line
