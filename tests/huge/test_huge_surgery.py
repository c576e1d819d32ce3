"""`zoomer-ar trace ...`: outputs are valid Chrome traces that this tool and HTA open, and the
surgery streams (bounded memory whatever the input size)."""

from __future__ import annotations

import gzip
import json
import logging
import sys
import tracemalloc
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.cli import main
from zoomer_ar.errors import InputError
from zoomer_ar.load import load_job
from zoomer_ar.surgery import (
    check_trace, compress_trace, filter_trace, job_files, merge_job, sample_job, slice_trace, split_trace, survey,
)
from zoomer_ar.surgery.ops import PID_STRIDE, choose_ranks

from conftest import REPO, SHARED_TRACES

sys.path.insert(0, str(REPO / "benchmarks"))
import gen_trace  # noqa: E402

NS = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # steps 101..105
DLRM = SHARED_TRACES / "param/dlrm_8ranks"


def json_of(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(data).read()
    return data


def events_of(path: Path) -> list[dict]:
    doc = json.loads(json_of(path))
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def assert_valid(path: Path) -> None:
    """Chrome trace structure (Perfetto) and this tool loads it."""
    n, problems = check_trace(path)
    assert not problems, f"{path}: {problems[:3]}"
    doc = json.loads(json_of(path))
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list) and len(doc["traceEvents"]) == n
    for e in doc["traceEvents"]:
        assert "ph" in e and "pid" in e
        if e["ph"] != "M":
            assert "ts" in e and "tid" in e
    analyze_path(path)  # this tool reads it (zstd files take the streaming path)


def test_slice_steps(tmp_path, shared_traces):
    out = tmp_path / "s.json.gz"
    st = slice_trace(NS, out, steps=(102, 103))
    assert_valid(out)
    assert 0 < st.events_out < st.events_in
    job = load_job(out)
    names = {job.ranks[0].name_of(i) for i in range(len(job.ranks[0]))}
    steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
    assert steps[:2] == ["ProfilerStep#102", "ProfilerStep#103"]
    assert "ProfilerStep#105" not in steps
    assert any(e["ph"] == "M" for e in events_of(out))  # metadata always kept
    with pytest.raises(InputError, match="steps present: 101..105"):
        slice_trace(NS, tmp_path / "none.json", steps=(1, 2))


def test_slice_window_in_ms_from_the_first_event(tmp_path, shared_traces):
    out = tmp_path / "w.json"
    slice_trace(NS, out, window_ms=(20.0, 40.0))
    assert_valid(out)
    sv = survey(NS)
    xs = [e for e in events_of(out) if e["ph"] == "X" and e.get("cat") != "Trace"]
    assert xs
    for e in xs:  # every kept complete event overlaps the window
        assert e["ts"] < sv.t0 + 40_000.0 and e["ts"] + e["dur"] >= sv.t0 + 20_000.0


def test_filter_categories_and_names(tmp_path, shared_traces):
    out = tmp_path / "f.json.gz"
    filter_trace(NS, out, cats=["kernel", "cuda_runtime"])
    assert_valid(out)
    assert {e.get("cat") for e in events_of(out) if e["ph"] != "M"} == {"kernel", "cuda_runtime"}
    out2 = tmp_path / "f2.json"
    filter_trace(NS, out2, exclude_cats=["ac2g", "fwdbwd"], exclude_name=r"^aten::")
    assert not any(e.get("cat") == "ac2g" or str(e.get("name", "")).startswith("aten::") for e in events_of(out2))
    assert_valid(out2)


def test_split_per_step(tmp_path, shared_traces):
    st = split_trace(NS, tmp_path / "split")
    assert len(st.outputs) == 5
    for p in map(Path, st.outputs):
        assert_valid(p)
        rank = load_job(p).ranks[0]
        cpu_steps = {rank.name_of(i) for i in range(len(rank)) if rank.name_of(i).startswith("ProfilerStep#")
                     and rank.cat_of(i) == "user_annotation"}
        assert len(cpu_steps) >= 1


def test_sample_merge_and_filter_ranks_of_a_job(tmp_path, shared_traces):
    files = job_files(DLRM)
    assert [r for r, _ in files] == list(range(8))
    assert choose_ranks(list(range(8)), 3) == [0, 4, 7]
    assert choose_ranks(list(range(8)), 3, seed=1) == choose_ranks(list(range(8)), 3, seed=1)
    st = sample_job(DLRM, tmp_path / "sample", 3)
    assert len(st.outputs) == 3
    assert load_job(tmp_path / "sample").info.world_size == 8  # distributedInfo kept
    merged = tmp_path / "merged.json.gz"
    merge_job(DLRM, merged)
    assert_valid(merged)
    ev = events_of(merged)
    pids = {e["pid"] for e in ev if isinstance(e.get("pid"), int)}
    assert {p // PID_STRIDE for p in pids} == set(range(8))
    names = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
    assert any(n.startswith("rank 7: ") for n in names)
    rc = main(["trace", "filter", str(DLRM), str(tmp_path / "two"), "--ranks", "0,7", "--exclude-cat", "python_function"])
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(f.name for r, f in files if r in (0, 7))


def test_compress_round_trip_gzip_and_zstd(tmp_path, shared_traces):
    plain = tmp_path / "plain.json"
    compress_trace(NS, plain, compression="none")
    again = tmp_path / "again.json.gz"
    compress_trace(plain, again)
    assert gzip.decompress(again.read_bytes()) == plain.read_bytes() == gzip.decompress(NS.read_bytes())
    try:
        import zstandard  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="zstandard"):
            compress_trace(plain, tmp_path / "x.json.zst")
        return
    zst = tmp_path / "x.json.zst"
    compress_trace(plain, zst)
    back = tmp_path / "back.json"
    compress_trace(zst, back, compression="none")
    assert back.read_bytes() == plain.read_bytes()
    assert_valid(zst)


def _zstd_raw(data: bytes) -> bytes:
    """A zstd frame of raw (stored) blocks: zstd bytes without the zstandard package."""
    out = bytearray(b"\x28\xb5\x2f\xfd\x00\x50")  # magic; no checksum, no content size; window 1 MiB
    step = 1 << 17
    chunks = [data[i:i + step] for i in range(0, len(data), step)] or [b""]
    for k, c in enumerate(chunks):
        out += ((len(c) << 3) | (k == len(chunks) - 1)).to_bytes(3, "little") + c
    return bytes(out)


def test_a_zstd_trace_without_zstandard_says_what_is_missing(tmp_path, shared_traces, capsys, monkeypatch):
    """Without `zstandard`, `analyze` and `trace repair` of a .json.zst fell back to the in-memory reader,
    which gave the compressed bytes to the JSON decoder: `not valid JSON (JSON is malformed: invalid
    character (byte 0))`, as if the trace were corrupt. They now say the package is needed, as the other
    trace commands do; with it, the in-memory reader reads zstd too."""
    import zoomer_ar.stream.source as source

    amd = SHARED_TRACES / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    zst = tmp_path / "t.json.zst"
    zst.write_bytes(_zstd_raw(gzip.decompress(amd.read_bytes())))
    if source.zstandard is not None:  # the real reader, then the in-memory one
        assert main(["analyze", str(zst), "--no-files", "--format", "json"]) == 0
        from zoomer_ar.load.reader import read_trace_bytes

        assert read_trace_bytes(zst) == gzip.decompress(amd.read_bytes())
        capsys.readouterr()
    monkeypatch.setattr(source, "zstandard", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # `import zstandard` fails
    for cmd in (["analyze", str(zst), "--no-files"], ["trace", "repair", str(zst), str(tmp_path / "r.json.gz")]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert err.strip() == f"zoomer-ar: error: {zst}: zstd-compressed trace: install the `zstandard` package to read it", err
    assert not (tmp_path / "r.json.gz").exists()


def test_cli_subcommands(tmp_path, shared_traces, capsys):
    assert main(["trace", "slice", str(NS), str(tmp_path / "a.json.gz"), "--steps", "101..101"]) == 0
    assert main(["trace", "split", str(NS), str(tmp_path / "sp"), "--steps-per-file", "2"]) == 0
    assert len(list((tmp_path / "sp").iterdir())) == 3
    assert main(["trace", "sample", str(DLRM), str(tmp_path / "smp"), "--ranks", "1..2"]) == 0
    assert main(["trace", "merge", str(DLRM), str(tmp_path / "m.json")]) == 0
    assert main(["trace", "compress", str(tmp_path / "m.json"), str(tmp_path / "m.json.gz")]) == 0
    assert main(["trace", "check", str(tmp_path / "a.json.gz"), str(tmp_path / "m.json.gz")]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1}]}))
    assert main(["trace", "check", str(bad)]) == 2
    assert main(["trace", "slice", str(NS), str(tmp_path / "z.json"), "--steps", "1..2"]) == 2
    out = capsys.readouterr()
    assert "wrote" in out.out and "dur" in out.out and "steps present" in out.err


def test_surgery_streams_in_bounded_memory(tmp_path):
    """Peak Python memory (tracemalloc) is about a few slices, whatever the input size."""
    peaks = []
    for size in (0.002, 0.008):
        src = tmp_path / f"syn_{size}.json"
        gen_trace.generate(src, size, synthetic=True, quiet=True)
        tracemalloc.start()
        try:
            filter_trace(src, tmp_path / "f.json.gz", exclude_cats=["python_function"])
            slice_trace(src, tmp_path / "s.json", window_ms=(0.0, 500.0))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] < 32e6 and peaks[1] < 1.5 * peaks[0] + 4e6, [p / 1e6 for p in peaks]


def test_hta_opens_the_outputs(tmp_path, shared_traces):
    hta = pytest.importorskip("hta.trace_analysis")
    logging.disable(logging.WARNING)
    try:
        for k, make in enumerate([
            lambda p: slice_trace(NS, p, steps=(102, 103)),
            lambda p: filter_trace(NS, p, exclude_cats=["fwdbwd"]),
            lambda p: merge_job(DLRM, p),
        ]):
            d = tmp_path / f"hta{k}"
            d.mkdir()
            make(d / "trace.json.gz")
            analysis = hta.TraceAnalysis(trace_dir=str(d))
            breakdown = analysis.get_temporal_breakdown(visualize=False)
            assert len(breakdown) == 1 and breakdown["kernel_time(us)"].iloc[0] > 0
    finally:
        logging.disable(logging.NOTSET)
