"""`zoomer-ar trace ...` and the streaming reader on the inputs of the fourth surgery audit: slices
that lost the GPU side of their steps (D1), named pipes that hung (D2), gzip sizes that wrap at
4 GiB (D3), events copied into invalid outputs (D4), bad option values (D5), empty selections (D6),
outputs named for another compression (D7), `merge DIR FILE` (D8), junk sampled as a rank (D9),
leftovers (D10) and messages (D11). Each test failed on the code before the fix. The convention:
bad input is exit 2 with one line, never a traceback; no partial output is left behind."""

from __future__ import annotations

import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.surgery import check_trace
from zoomer_ar.surgery.io import read_events

from conftest import SHARED_TRACES, one_error_line, files_under

NS = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # steps 101..105
DLRM = SHARED_TRACES / "param/dlrm_8ranks"
RESNET_2021 = SHARED_TRACES / "kineto/resnet50_num_workers_0"
CLI = [sys.executable, "-c", "import sys; from zoomer_ar.cli import main; sys.exit(main(sys.argv[1:]))"]

_RUNTIME = ("cuda_runtime", "Runtime")
_DEVICE = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")


def _doc(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _trace(extra: list[dict] | None = None) -> dict:
    """A small valid trace: two steps, each with a launch and its kernel (after the step's CPU end)."""
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"name": "ProfilerStep#1", "ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 100, "dur": 50},
        {"name": "cudaLaunchKernel", "ph": "X", "cat": "cuda_runtime", "pid": 1, "tid": 1, "ts": 110, "dur": 5,
         "args": {"correlation": 5}},
        {"name": "gemm", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 152, "dur": 20,
         "args": {"correlation": 5}},
        {"name": "ProfilerStep#2", "ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 160, "dur": 50},
        {"name": "gemm", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 170, "dur": 20},
    ]
    return {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events + (extra or [])}


def _write(path: Path, doc: dict | bytes) -> Path:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


# ---- D1: the GPU side of the steps ---------------------------------------------------------------


def _launched_in(doc: dict, lo: int, hi: int) -> list[dict]:
    """The device events whose launching runtime call starts inside the CPU side of steps lo..hi."""
    ev = doc["traceEvents"]
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in ev
             if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
             and e.get("cat") != "gpu_user_annotation"}
    w0, w1 = min(steps[k][0] for k in range(lo, hi + 1)), max(steps[k][1] for k in range(lo, hi + 1))
    corr = {e["args"]["correlation"] for e in ev if e.get("cat") in _RUNTIME and w0 <= e["ts"] <= w1
            and "correlation" in e.get("args", {})}
    return [e for e in ev if e.get("cat") in _DEVICE and e.get("args", {}).get("correlation") in corr]


def _key(e: dict) -> str:
    return json.dumps(e, sort_keys=True)


@pytest.mark.parametrize("which,lo,hi", [("ns", 102, 103), ("2021", 6, 7)])
def test_slice_keeps_the_gpu_ops_launched_in_the_steps(which, lo, hi, tmp_path, capsys, shared_traces):
    """Without GPU-side step annotations, 1,021 of the 2,438 GPU ops launched in steps 102..103 of
    the NS trace were cut off (they run after the CPU step ends)."""
    src = NS if which == "ns" else next(RESNET_2021.glob("*.json.gz"))
    out = tmp_path / "o.json.gz"
    assert main(["trace", "slice", str(src), str(out), "--steps", f"{lo}..{hi}"]) == 0
    want = _launched_in(_doc(src), lo, hi)
    got = {_key(e) for e in _doc(out)["traceEvents"]}
    assert len(want) > 1000
    missing = [e for e in want if _key(e) not in got]
    assert not missing, f"{len(missing)} of {len(want)} launched GPU ops missing"
    flows = {e["id"] for e in _doc(out)["traceEvents"] if e.get("ph") == "f" and e.get("cat") in ("ac2g", "async")}
    assert {e["args"]["correlation"] for e in want} <= flows  # the arrows to them too
    assert check_trace(out)[1] == []


def test_split_puts_each_steps_gpu_ops_in_its_file(tmp_path, capsys, shared_traces):
    out = tmp_path / "steps"
    assert main(["trace", "split", str(NS), str(out)]) == 0
    doc = _doc(NS)
    for f in sorted(out.iterdir()):
        step = int(f.name.split(".steps_")[1].split("-")[0])
        got = {_key(e) for e in _doc(f)["traceEvents"]}
        missing = [e for e in _launched_in(doc, step, step) if _key(e) not in got]
        assert not missing, (f.name, len(missing))


def test_slice_of_a_small_trace_keeps_the_kernel_after_the_step(tmp_path, capsys):
    src = _write(tmp_path / "t.json", _trace())
    out = tmp_path / "o.json"
    assert main(["trace", "slice", str(src), str(out), "--steps", "1..1"]) == 0
    names = [(e["name"], e.get("ts")) for e in _doc(out)["traceEvents"]]
    assert ("gemm", 152) in names and ("gemm", 170) not in names


# ---- D2: named pipes -------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["analyze", "{P}", "--stream", "--out", "{T}/an"], ["trace", "filter", "{P}", "{T}/o.json"],
    ["trace", "slice", "{P}", "{T}/o.json", "--steps", "1..2"], ["trace", "compress", "{P}", "{T}/o.json.gz"],
    ["trace", "split", "{P}", "{T}/split"], ["trace", "check", "{P}"],
])
def test_a_named_pipe_is_refused_at_once(args, tmp_path):
    """Used to wait for ever (and leave `.o.json.PID.tmp` when killed)."""
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    cmd = [a.format(P=fifo, T=tmp_path) for a in args]
    run = subprocess.run(CLI + cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "not a regular file" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert files_under(tmp_path) == ["p.json"]


# ---- D3: gzip sizes beyond 4 GiB ------------------------------------------------------------------


def test_a_gzip_trailer_that_wrapped_does_not_choose_the_in_memory_path(tmp_path, monkeypatch):
    """ISIZE is the size modulo 4 GiB: a 4.5 GB trace says 0.2 GB. Modelled at a small scale: a
    trailer that says less than the JSON holds (but more than the file) was taken at its word."""
    from zoomer_ar.stream import json_size_estimate, should_stream

    data = json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
                                       for i in range(400_000)]}).encode()
    honest = tmp_path / "honest.json.gz"
    honest.write_bytes(gzip.compress(data, 1))
    wrapped = tmp_path / "wrapped.json.gz"
    fake = 3 * honest.stat().st_size
    wrapped.write_bytes(honest.read_bytes()[:-4] + struct.pack("<I", fake))
    cap = len(data) // 2
    assert fake < cap < len(data)
    monkeypatch.delenv("ZOOMER_STREAM", raising=False)
    monkeypatch.setenv("ZOOMER_STREAM_THRESHOLD", str(cap))
    import zoomer_ar.stream as S

    assert json_size_estimate(wrapped) == fake  # a file this small cannot have wrapped: its trailer is believed
    monkeypatch.setattr(S, "_MAX_DEFLATE_RATIO", 1 << 32)  # as if it were large enough to have wrapped
    assert json_size_estimate(wrapped) > cap  # never below the threshold when the JSON is above it
    assert should_stream(wrapped) and should_stream(honest)
    monkeypatch.setenv("ZOOMER_STREAM_THRESHOLD", str(len(data) + 1))
    assert json_size_estimate(honest) == len(data)  # exact below the threshold
    assert not should_stream(honest)


# ---- D4: events the outputs cannot hold --------------------------------------------------------------

BAD_EVENTS = {
    "args_list": {"name": "k", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 120, "dur": 1, "args": [1]},
    "pid_float": {"name": "k", "ph": "X", "cat": "cpu_op", "pid": 1.5, "tid": 1, "ts": 120, "dur": 1},
    "no_ph": {"name": "k", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 120, "dur": 1},
}
COMMANDS = {
    "filter": ["filter", "{S}", "{O}.json", "--cat", "cpu_op"],
    "slice": ["slice", "{S}", "{O}.json", "--steps", "1..2"],
    "split": ["split", "{S}", "{O}"],
    "compress": ["compress", "{S}", "{O}.json.gz"],
}


@pytest.mark.parametrize("case,cmd", [(case, cmd) for case in sorted(BAD_EVENTS) for cmd in sorted(COMMANDS)
                                      if not (case == "no_ph" and cmd in ("slice", "split"))])
def test_events_trace_check_refuses_are_refused_not_copied(case, cmd, tmp_path, capsys):
    """Were copied verbatim with exit 0, and `trace check` then refused the output. (slice and
    split leave out an event without `ph`, as they leave out any event a viewer cannot place.)"""
    src = _write(tmp_path / "in" / "t.json", _trace([BAD_EVENTS[case]]))
    args = [a.format(S=src, O=tmp_path / "out") for a in COMMANDS[cmd]]
    assert main(["trace", *args]) == 2
    one_error_line(capsys, str(src), "event 6")
    assert files_under(tmp_path) == ["in", "in/t.json"]


def test_sample_skips_a_rank_with_events_check_refuses(tmp_path, capsys):
    job = tmp_path / "job"
    _write(job / "rank0.json", _trace())
    _write(job / "rank1.json", _trace([BAD_EVENTS["args_list"]]))
    assert main(["trace", "sample", str(job), str(tmp_path / "s"), "--ranks", "0,1"]) == 0
    assert "note: skipped" in capsys.readouterr().err
    assert files_under(tmp_path / "s") == ["rank0.json"]
    (job / "rank0.json").unlink()
    assert main(["trace", "sample", str(job), str(tmp_path / "s2"), "-k", "1"]) == 2
    one_error_line(capsys, "rank1.json", "`args` has the wrong type")
    assert not (tmp_path / "s2").exists()


# ---- D5: bad option values ---------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["filter", "{J}", "{O}", "--ranks", "abc"], ["sample", "{J}", "{O}", "--ranks", "1..x"],
    ["filter", "{T}", "{O}.json", "--name", "("], ["filter", "{T}", "{O}.json", "--exclude-name", "[z"],
    ["filter", "{J}", "{O}", "--name", "("], ["slice", "{T}", "{O}.json", "--steps", "1..x"],
])
def test_bad_option_values_are_one_line_exit_2(args, tmp_path, capsys):
    """Were internal errors (ValueError, re.error: exit 1)."""
    job = tmp_path / "job"
    _write(job / "rank0.json", _trace())
    t = _write(tmp_path / "t.json", _trace())
    assert main(["trace", *[a.format(J=job, T=t, O=tmp_path / "out") for a in args]]) == 2
    one_error_line(capsys, args[3])
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())


# ---- D6: empty selections, clipping, conflicting options --------------------------------------------


@pytest.mark.parametrize("window", [["100000..200000"], ["-50..-10"], ["0..1", "--absolute"]])
def test_a_window_without_events_is_refused_naming_the_span(window, tmp_path, capsys, shared_traces):
    out = tmp_path / "o.json"
    assert main(["trace", "slice", str(NS), str(out), "--window", *window]) == 2
    one_error_line(capsys, "holds no event", "its events span")
    assert not out.exists()


def test_clipped_or_conflicting_selections(tmp_path, capsys, shared_traces):
    assert main(["trace", "filter", str(DLRM), str(tmp_path / "f"), "--ranks", "3..2"]) == 2
    one_error_line(capsys, "reversed")
    assert main(["trace", "slice", str(NS), str(tmp_path / "s.json"), "--steps", "105..999"]) == 0
    err = capsys.readouterr().err
    assert "note: --steps 105..999: kept steps 105" in err and "101..105" in err
    assert main(["trace", "sample", str(DLRM), str(tmp_path / "k"), "-k", "20"]) == 0
    assert "note: -k 20: the job has 8 ranks" in capsys.readouterr().err
    assert main(["trace", "sample", str(DLRM), str(tmp_path / "k2"), "-k", "2", "--ranks", "1,2"]) == 2
    one_error_line(capsys, "--ranks")
    assert not (tmp_path / "f").exists() and not (tmp_path / "k2").exists()


# ---- D7: outputs named for their compression ---------------------------------------------------------


def test_filter_of_a_job_names_outputs_by_compression(tmp_path, capsys):
    job = tmp_path / "job"
    _write(job / "rank0.json", _trace())
    out = tmp_path / "f"
    assert main(["trace", "filter", str(job), str(out), "--compression", "gzip"]) == 0
    assert files_under(out) == ["rank0.json.gz"]
    assert (out / "rank0.json.gz").read_bytes()[:2] == b"\x1f\x8b" and check_trace(out / "rank0.json.gz")[1] == []


@pytest.mark.parametrize("args", [["filter", "{T}", "{O}.json", "--compression", "gzip"],
                                  ["slice", "{T}", "{O}.json.gz", "--steps", "1..1", "--compression", "none"],
                                  ["compress", "{T}", "{O}.json", "--zstd"]])
def test_a_single_output_named_for_another_compression_is_refused(args, tmp_path, capsys):
    t = _write(tmp_path / "t.json", _trace())
    assert main(["trace", *[a.format(T=t, O=tmp_path / "out") for a in args]]) == 2
    one_error_line(capsys, "the name says")
    assert files_under(tmp_path) == ["t.json"]


# ---- D8: merge DIR FILE ------------------------------------------------------------------------------


def test_merge_of_a_folder_and_a_file_merges_the_folders_ranks(tmp_path, capsys, shared_traces):
    """The folder was skipped with `Is a directory` (exit 0)."""
    folder = tmp_path / "two"
    folder.mkdir()
    files = sorted(DLRM.iterdir())
    for f in files[:2]:
        (folder / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "m.json.gz"
    assert main(["trace", "merge", str(folder), str(files[5]), str(out)]) == 0
    assert "skipped" not in capsys.readouterr().err
    assert _doc(out)["distributedInfo"]["merged_ranks"] == [0, 1, 5]


# ---- D9: junk taken for a rank ------------------------------------------------------------------------


@pytest.mark.parametrize("junk", [b"[1,2", b"[1,2,3]", b'{"traceEvents": []}', b'{"traceEvents": [1, 2]}'])
def test_sample_does_not_take_junk_for_a_rank(junk, tmp_path, capsys):
    job = tmp_path / "junk"
    _write(job / "c.json", junk)
    assert main(["trace", "sample", str(job), str(tmp_path / "o"), "-k", "1"]) == 2
    one_error_line(capsys, "no usable trace", "c.json")
    assert not (tmp_path / "o").exists()


# ---- D10: leftovers -----------------------------------------------------------------------------------


def test_a_failed_command_removes_the_folders_it_made(tmp_path, capsys):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(json.dumps(_trace()).encode())[:-30])
    assert main(["trace", "filter", str(bad), str(tmp_path / "new" / "sub" / "x.json.gz")]) == 2
    one_error_line(capsys, str(bad))
    assert files_under(tmp_path) == ["bad.json.gz"]


def test_gzip_header_names_the_output_and_a_replaced_output_is_noted(tmp_path, capsys):
    t = _write(tmp_path / "t.json", _trace())
    out = tmp_path / "x.json.gz"
    assert main(["trace", "filter", str(t), str(out)]) == 0
    assert "replaced" not in capsys.readouterr().err
    header = out.read_bytes()[:40]
    assert header[3] & 0x08 and header[10:17] == b"x.json\x00"  # FNAME: the output, not `.x.json.gz.PID.tmp`
    assert main(["trace", "filter", str(t), str(out)]) == 0
    assert f"note: replaced the existing file {out}" in capsys.readouterr().err


def test_sigterm_removes_the_temporary_output_and_the_folder_it_made(tmp_path, shared_traces):
    """SIGTERM used to leave `.out.json.gz.PID.tmp` (and the output folder)."""
    big = tmp_path / "in" / "big.json"
    doc = _doc(NS)
    big.parent.mkdir()
    with big.open("w") as fh:  # ~60 MB: several seconds of work
        fh.write('{"traceEvents": [')
        fh.write(",".join(json.dumps(e) for _ in range(4) for e in doc["traceEvents"]))
        fh.write("]}")
    out = tmp_path / "made" / "out.json.gz"
    proc = subprocess.Popen(CLI + ["trace", "filter", str(big), str(out), "--cat", "kernel"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list((tmp_path / "made").glob(".out.json.gz.*.tmp")) and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert b"Traceback" not in err
    assert files_under(tmp_path) == ["in", "in/big.json"]


# ---- D11: messages, the memory limit, the bytes after the events array ------------------------------------


@pytest.mark.parametrize("content", [
    b'{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1},{"ph":"X","name":"a","pid":1,"tid":1,'
    b'"ts":NaN,"dur":1}]}',
    b"[1,2,3]",
])
def test_check_and_analyze_say_the_same_of_invalid_json(content, tmp_path, capsys):
    src = tmp_path / "t.json"
    src.write_bytes(content)
    assert main(["analyze", str(src), "--out", str(tmp_path / "an")]) == 2
    said = one_error_line(capsys).split(f"{src}: ", 1)[1]
    assert main(["trace", "check", str(src)]) == 2
    one_error_line(capsys, f"not a valid Chrome trace: {said}")


@pytest.mark.parametrize("event,field", [({"pid": 1.5}, "pid"), ({"ph": 5}, "ph")])
def test_check_says_a_field_has_the_wrong_type_not_that_it_is_missing(event, field, tmp_path, capsys):
    e = {"name": "k", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 200, "dur": 1, **event}
    src = _write(tmp_path / "t.json", _trace([e]))
    n, problems = check_trace(src)
    assert problems and all(f"`{field}` has the wrong type" in p for p in problems), problems
    assert not any("missing" in p or "no `ph`" in p for p in problems)


def test_a_memory_limit_that_is_not_a_number_is_refused(tmp_path, capsys, monkeypatch):
    from zoomer_ar.stream.guard import budget_mb

    src = _write(tmp_path / "t.json", _trace())
    for bad in ("abc", "-5", "nan"):
        monkeypatch.setenv("ZOOMER_MEMORY_LIMIT_MB", bad)
        assert main(["analyze", str(src), "--stream", "--out", str(tmp_path / "an")]) == 2
        one_error_line(capsys, f"ZOOMER_MEMORY_LIMIT_MB='{bad}'")
    assert not (tmp_path / "an").exists()
    monkeypatch.setenv("ZOOMER_MEMORY_LIMIT_MB", "0")
    assert budget_mb() is None


def _padded(path: Path, mb: int, inside: bool) -> Path:
    """A trace with `mb` MB of blanks after the events array (inside: before the closing brace)."""
    body = json.dumps(_trace()).encode()
    pad = b" \n" * (mb << 19)
    return _write(path, body[:-1] + pad + b"}" if inside else body + pad)


@pytest.mark.parametrize("reader", ["surgery", "compiled", "msgspec"])
@pytest.mark.parametrize("inside", [False, True])
def test_blank_padding_after_the_events_is_not_kept_in_memory(inside, reader, tmp_path):
    """The scanner kept every byte after the events array: 4.4 GB of trailing whitespace took
    9.8 GB (the compiled reader refused more than 256 MB and the in-memory loader then read it all)."""
    from zoomer_ar.load import fastcols
    from zoomer_ar.stream import stream_rank

    if reader == "compiled" and not fastcols.available():
        pytest.skip("the compiled event reader is not built")
    peaks = []
    for mb in (24, 72):  # the peak does not grow with the padding (past the chunks in flight)
        src = _padded(tmp_path / f"pad{mb}.json", mb, inside)
        seen: list[int] = []
        tracemalloc.start()
        try:
            if reader == "surgery":
                read_events(src, lambda raws, lite: seen.append(len(lite)))
            else:
                _, info = stream_rank(src, fast=reader == "compiled", frames=False)
                seen.append(info.n_events)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert sum(seen) == len(_trace()["traceEvents"])
        src.unlink()
    # kept padding would add the 48 MB between the two files; what moves is only the chunks in flight
    # (the reader thread's timing: up to a few 1-4 MB chunks)
    assert peaks[1] - peaks[0] < 12 << 20, peaks


def test_data_after_the_events_array_beyond_the_bound_is_refused(tmp_path, capsys, monkeypatch):
    from zoomer_ar.stream import scan as scan_mod

    monkeypatch.setattr(scan_mod, "MAX_TAIL", 1 << 20)
    doc = _trace()
    doc["zz_extra"] = "x" * (2 << 20)
    src = _write(tmp_path / "t.json", doc)
    assert main(["trace", "filter", str(src), str(tmp_path / "o.json")]) == 2
    one_error_line(capsys, "MB of data after the events array")
