"""`zoomer-ar trace ...` on bad input and bad arguments (second audit): outputs that are the inputs
(data loss), fields of the wrong type and invalid UTF-8 (BufferError), nesting deeper than the
recursion limit (RecursionError), compress of non-traces, slice outputs without `ts`, `-k 0`.
Every test drives the real CLI (or the surgery API) on crafted files; each failed on the code
before the fix. The error convention: exit 2 and one line naming the file, never a traceback."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import msgspec
import pytest

from zoomer_ar.cli import main
from zoomer_ar.errors import InputError
from zoomer_ar.surgery import check_trace
from zoomer_ar.surgery.io import read_events


def _trace(rank: int = 0, extra: list[dict] | None = None) -> dict:
    """A small valid Kineto-like trace: two profiler steps, a kernel in each, named tracks."""
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"name": "ProfilerStep#1", "ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 100, "dur": 50},
        {"name": "gemm", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 110, "dur": 20},
        {"name": "ProfilerStep#2", "ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 160, "dur": 50},
        {"name": "gemm", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 170, "dur": 20},
    ]
    return {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events + (extra or [])}


def _write(path: Path, doc: dict) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _job(folder: Path, extra: dict[str, bytes] | None = None) -> Path:
    """A job folder of two rank files, plus raw extra files (name -> bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        _write(folder / f"rank{r}.json.gz", _trace(r))
    for name, data in (extra or {}).items():
        (folder / name).write_bytes(data)
    return folder


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _refused(capsys, *names: str) -> str:
    """The run printed one error line on stderr naming every given file, and no traceback."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("zoomer-ar: error:") and "internal error" not in err, err
    for n in names:
        assert n in err, (n, err)
    return err


# ---- 1: outputs that are inputs ----------------------------------------------------------------


@pytest.mark.parametrize("cmd", [
    ["filter", "{T}", "{T}", "--cat", "kernel"],
    ["filter", "{T}", "{LINK}", "--cat", "kernel"],
    ["slice", "{T}", "{T}", "--steps", "1..1"],
    ["compress", "{T}", "{T}"],
    ["compress", "{LINK}", "{T}"],
    ["merge", "{J}", "{J}/rank0.json.gz"],
    ["merge", "{J}/rank0.json.gz", "{J}/rank1.json.gz", "{J}/rank1.json.gz"],
    ["merge", "{J}", "{J}/merged.json.gz"],
    ["sample", "{J}", "{J}", "-k", "1"],
    ["sample", "{J}", "{J}/sub", "-k", "1"],
    ["filter", "{J}", "{J}", "--cat", "kernel"],
    ["filter", "{J}", "{J}/sub", "--cat", "kernel"],
    ["split", "{J}/rank0.json.gz", "{J}"],
    ["split", "{T}", "{W}"],
])
def test_an_output_that_is_an_input_or_inside_its_job_folder_is_refused(cmd, tmp_path, capsys):
    """Used to replace the input with its filtered copy, overwrite rank 0, fail with SameFileError
    (exit 1), or write step files that a later `analyze DIR` read as extra ranks."""
    work = tmp_path / "w"
    job = _job(work / "job")
    t = _write(work / "t.json.gz", _trace())
    (work / "link.json.gz").symlink_to(t.name)
    before = _digest(work), _digest(job)
    args = [a.format(T=t, LINK=work / "link.json.gz", J=job, W=work) for a in cmd]
    assert main(["trace", *args]) == 2
    out = [a for a in args if a.startswith(str(tmp_path))][-1]
    _refused(capsys, str(Path(out)))
    assert (_digest(work), _digest(job)) == before
    assert not (job / "sub").exists()


def test_outputs_next_to_the_inputs_are_still_fine(tmp_path, capsys):
    """The guard refuses only the input itself: a sibling file or a folder beside the job works."""
    job = _job(tmp_path / "job")
    t = _write(tmp_path / "t.json.gz", _trace())
    assert main(["trace", "filter", str(t), str(tmp_path / "t.kernels.json.gz"), "--cat", "kernel"]) == 0
    assert main(["trace", "sample", str(job), str(tmp_path / "sample"), "-k", "1"]) == 0
    assert main(["trace", "merge", str(job), str(tmp_path / "merged.json")]) == 0
    assert main(["trace", "split", str(t), str(tmp_path / "steps")]) == 0
    assert len(list((tmp_path / "steps").iterdir())) == 2


# ---- 2: wrong field types and invalid UTF-8 ----------------------------------------------------

_EVENT = '{"name":"x","ph":"X","pid":1,"tid":1,"ts":1,"dur":2}'
BAD_EVENTS = {
    "ts_string.json": b'{"traceEvents":[' + _EVENT.replace('"ts":1', '"ts":"abc"').encode() + b"]}",
    "name_list.json": b'{"traceEvents":[' + _EVENT.replace('"name":"x"', '"name":[1,2]').encode() + b"]}",
    "bad_utf8.json": b'{"traceEvents":[' + _EVENT.replace('"x"', '"a\xff\xfeb"').encode("latin-1") + b"]}",
}


def _args(cmd: str, src: Path, tmp_path: Path) -> list[str]:
    out = {"check": [], "filter": [str(tmp_path / "o.json"), "--cat", "kernel"],
           "slice": [str(tmp_path / "o.json"), "--window", "0..5", "--absolute"],
           "split": [str(tmp_path / "steps")], "compress": [str(tmp_path / "o.json.gz")]}[cmd]
    return ["trace", cmd, str(src), *out]


@pytest.mark.parametrize("name", sorted(BAD_EVENTS))
@pytest.mark.parametrize("cmd", ["filter", "slice", "split"])
def test_bad_field_types_and_invalid_utf8_are_bad_input(name, cmd, tmp_path, capsys):
    """Used to be `internal error: BufferError: memoryview has 1 exported buffer` (exit 1)."""
    src = tmp_path / name
    src.write_bytes(BAD_EVENTS[name])
    assert main(_args(cmd, src, tmp_path)) == 2
    _refused(capsys, str(src))
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "steps").exists()


def test_an_exception_raised_while_events_are_handled_comes_out_as_itself(tmp_path):
    """The root cause of the BufferError: msgspec.Raw values pointed into the scanner's buffer, and
    any exception raised while they were alive became BufferError when the buffer was released."""
    src = _write(tmp_path / "t.json", _trace())

    def on_slice(raws: list[msgspec.Raw], lite: list) -> None:
        raise InputError(str(src), "stop here")

    with pytest.raises(InputError, match="stop here"):
        read_events(src, on_slice)


# ---- 3: nesting deeper than the recursion limit ------------------------------------------------

_STEP = '{"name":"ProfilerStep#1","ph":"X","cat":"user_annotation","pid":1,"tid":1,"ts":1,"dur":9'
DEEP = {
    "deep_array.json": ("[" * 100_000 + "]" * 100_000).encode(),
    "deep_args.json": ('{"traceEvents":[' + _STEP + ',"args":' + '{"a":' * 50_000 + "1" + "}" * 50_000
                       + "}]}").encode(),
    "deep_event.json": ('{"traceEvents":[' + '{"a":' * 100_000 + "1" + "}" * 100_000 + "]}").encode(),
    "deep_head.json": ('{"x":' + '{"a":' * 100_000 + "1" + "}" * 100_000 + ',"traceEvents":[]}').encode(),
}


@pytest.mark.parametrize("name", sorted(DEEP))
@pytest.mark.parametrize("cmd", ["check", "filter", "slice", "split", "compress"])
def test_deep_nesting_is_bad_input(name, cmd, tmp_path, capsys):
    """Used to be `internal error: RecursionError: maximum recursion depth exceeded` (exit 1)."""
    src = tmp_path / name
    src.write_bytes(DEEP[name])
    assert main(_args(cmd, src, tmp_path)) == 2
    err = capsys.readouterr()
    assert "internal error" not in err.err and "Traceback" not in err.err
    assert len(err.err.strip().splitlines()) == 1 and str(src) in err.err


@pytest.mark.parametrize("cmd", [["filter", "{J}", "{O}"], ["merge", "{J}", "{O}.json"],
                                 ["sample", "{J}", "{O}", "-k", "3", "--compression", "gzip"]])
def test_a_deeply_nested_rank_is_skipped_in_a_job_folder(cmd, tmp_path, capsys):
    """Like `analyze`, which skips the file with a note: the other ranks are still written."""
    job = _job(tmp_path / "job", {"rank2.json": DEEP["deep_args.json"]})
    args = [a.format(J=job, O=tmp_path / "out") for a in cmd]
    assert main(["trace", *args]) == 0
    io = capsys.readouterr()
    assert "note: skipped" in io.err and "rank2.json" in io.err and "nested too deeply" in io.err
    if cmd[0] == "merge":
        doc = json.loads((tmp_path / "out.json").read_bytes())
        assert doc["distributedInfo"]["merged_ranks"] == [0, 1]
    else:
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank0.json.gz", "rank1.json.gz"]


def test_a_job_of_only_deeply_nested_ranks_is_bad_input(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.json").write_bytes(DEEP["deep_event.json"])
    assert main(["trace", "filter", str(job), str(tmp_path / "out")]) == 2
    _refused(capsys, "rank0.json", "nested too deeply")


# ---- 4: compress validates its input -----------------------------------------------------------

NOT_TRACES = {
    "no_events.json": b'{"hello": 1}',
    "nan.json": b'{"traceEvents":[' + _EVENT.replace('"ts":1', '"ts":NaN').encode() + b"]}",
    "unterminated.json": b'{"traceEvents":[' + _EVENT.encode(),
}


@pytest.mark.parametrize("name", sorted(NOT_TRACES))
def test_compress_refuses_what_is_not_a_valid_trace(name, tmp_path, capsys):
    """Used to exit 0 and write the input into a .json.gz that the docs call a valid trace."""
    src = tmp_path / name
    src.write_bytes(NOT_TRACES[name])
    out = tmp_path / "o.json.gz"
    assert main(["trace", "compress", str(src), str(out)]) == 2
    _refused(capsys, str(src))
    assert not out.exists()


# ---- 5: slice and split write only events a viewer can place ----------------------------------


@pytest.mark.parametrize("cmd", [["slice", "{S}", "{O}.json", "--steps", "1..1"],
                                 ["slice", "{S}", "{O}.json", "--window", "0..200", "--absolute"],
                                 ["split", "{S}", "{O}"]])
def test_slice_and_split_leave_out_events_without_ts_and_say_so(cmd, tmp_path, capsys):
    """Used to copy them, so the output failed the tool's own `trace check` (`ts missing`)."""
    untimed = [{"name": "no_ts", "ph": "i", "pid": 1, "tid": 1},
               {"name": "no_dur", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 120},
               {"name": "no_tid", "ph": "X", "cat": "kernel", "pid": 2, "ts": 121, "dur": 1}]
    src = _write(tmp_path / "t.json", _trace(extra=untimed))
    args = [a.format(S=src, O=tmp_path / "out") for a in cmd]
    assert main(["trace", *args]) == 0
    assert "left out 3 events without ts" in capsys.readouterr().out
    outs = [tmp_path / "out.json"] if cmd[0] == "slice" else sorted((tmp_path / "out").iterdir())
    for out in outs:
        n, problems = check_trace(out)
        assert not problems and n >= 2, problems
        data = out.read_bytes()
        doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        names = [e["name"] for e in doc["traceEvents"]]
        assert "process_name" in names and not {"no_ts", "no_dur", "no_tid"} & set(names)


# ---- 6 and other arguments that were taken silently or failed late ----------------------------


@pytest.mark.parametrize("cmd", [
    ["sample", "{J}", "{O}", "-k", "0"],
    ["sample", "{J}", "{O}", "-k", "-3"],
    ["split", "{T}", "{O}", "--steps-per-file", "0"],
    ["filter", "{T}", "{O}.json.gz", "--level", "12"],
    ["filter", "{T}", "{J}"],  # an existing folder as the output file
    ["sample", "{J}", "{T}", "-k", "1"],  # an existing file as the output folder
])
def test_bad_counts_levels_and_output_kinds_are_refused(cmd, tmp_path, capsys):
    """`-k 0` was taken as `-k 1` and `--steps-per-file 0` as 1; a bad level, a folder given as
    the output file or a file as the output folder were internal errors (exit 1)."""
    job = _job(tmp_path / "job")
    t = _write(tmp_path / "t.json.gz", _trace())
    args = [a.format(J=job, T=t, O=tmp_path / "out") for a in cmd]
    assert main(["trace", *args]) == 2
    _refused(capsys)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.json.gz").exists()
