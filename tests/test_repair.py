"""Traces that PyTorch's profiler writes as invalid JSON (event names it does not escape) are repaired and
analysed (zoomer_ar/load/repair.py); anything else invalid is still refused with the decoder's reason."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest

from zoomer_ar.analyze import analyze_job, analyze_path
from zoomer_ar.errors import InputError
from zoomer_ar.features import extract
from zoomer_ar.load import load_job
from zoomer_ar.load.repair import repair
from zoomer_ar.stream import load_job_streaming

EXCERPT = Path(__file__).parent / "data" / "broken_names" / "compile_with_stack.pt.trace.json.gz"
BROKEN_NAME = 'torch/_higher_order_ops/passes/inline_invoke_subgraph.py(0):         """'


def test_the_real_excerpt_is_invalid_json_and_is_analysed(tmp_path):
    raw = gzip.open(EXCERPT).read()
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    a = analyze_path(EXCERPT)
    (note,) = [n for n in a.notes if "is not valid JSON as the profiler wrote it" in n]
    assert "1 event name " in note and "pytorch/pytorch#146900" in note
    job = load_job(EXCERPT)
    assert BROKEN_NAME in job.ranks[0].names  # the raw text, now a name like any other
    # the same trace written correctly gives the same features
    good = tmp_path / "fixed.json"
    good.write_bytes(raw.replace(b'py(0):         """",', b'py(0):         \\"\\"\\"",'))
    assert extract(load_job(good)).vector == extract(job).vector
    # the streaming reader falls back to the repairing reader and says the same
    streamed = analyze_job(load_job_streaming(EXCERPT, workers=1))
    assert streamed.features == a.features and note in streamed.notes


def _doc(*names: bytes, layout: str = "multi") -> bytes:
    """A trace as Kineto writes it (torch 2.13's one key per line, or the older one-line layout), with the
    given names written raw, as the profiler does."""
    events = []
    for i, name in enumerate(names):
        if layout == "multi":
            events.append(b'  {\n    "ph": "X",\n    "cat": "python_function",\n    "name": "' + name
                          + b'",\n    "pid": 1,\n    "tid": 1,\n    "ts": ' + str(100 + 10 * i).encode()
                          + b',\n    "dur": 5\n  }')
        else:
            events.append(b'  {\n    "ph": "X", "cat": "python_function", "name": "' + name + b'", "pid": 1, "tid": 1,\n'
                          b'    "ts": ' + str(100 + 10 * i).encode() + b', "dur": 5\n  }')
    return b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + b",\n".join(events) + b"\n]\n}\n"


DECODE = msgspec.json.Decoder().decode


def _names(data: bytes) -> list[str]:
    first_error = None
    try:
        DECODE(data)
    except msgspec.DecodeError as exc:
        first_error = exc
    assert first_error is not None, "the test trace should be invalid as written"
    got = repair(data, DECODE, first_error)
    assert not isinstance(got, BaseException)
    doc = got.doc
    return [e["name"] for e in doc["traceEvents"]]


@pytest.mark.parametrize("layout", ["multi", "single"])
def test_quotes_backslashes_and_control_characters_come_back_as_written(layout):
    raw = [b'gen {"device": "cpu"}(3): run', b'C:\\Users\\me\\train.py(10): step', b"tab\there(1): f",
           b'validator.py(0):     """', b"ok.py(1): fine"]
    assert _names(_doc(*raw, layout=layout)) == [r.decode() for r in raw]


def test_older_kineto_instant_events_are_not_folded_into_their_names():
    """Older Kineto wrote instant events with more members after the name on its line and `"pid":` on the
    next one (hta/df_index_resolver holds two). A repair elsewhere in the file must leave them as they are:
    re-escaping `Iteration Start: PyTorch Profiler", "ph": "i", "s": "g` as one name lost the event's phase."""
    instant = (b'  {\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
               b'    "pid": "Traces", "tid": "PyTorch Profiler", "ts": 90\n  }')
    data = _doc(b'bad "one"(2): g', b"ok(1): f", layout="single")
    data = data.replace(b'"traceEvents": [\n', b'"traceEvents": [\n' + instant + b",\n", 1)
    with pytest.raises(msgspec.DecodeError) as err:
        DECODE(data)
    doc, fixed_bytes, n = repair(data, DECODE, err.value)
    assert n == 1 and instant in fixed_bytes
    first = doc["traceEvents"][0]
    assert (first["name"], first["ph"], first["s"]) == ("Iteration Start: PyTorch Profiler", "i", "g")
    assert [e["name"] for e in doc["traceEvents"][1:]] == ['bad "one"(2): g', "ok(1): f"]


def test_invalid_utf8_is_replaced_not_refused():
    names = _names(_doc(b"config.py(0): \xff\xfe", b'x"y(1): z'))
    assert names == ["config.py(0): \ufffd\ufffd", 'x"y(1): z']


def test_a_raw_line_break_inside_a_name_is_repaired_where_the_decoder_stops():
    # pytorch/pytorch#113001: `_test_lib_impl = torch.library.Library("_inductor_test", "IMPL")\n(1): <module>`
    raw = b'_test_lib_impl = torch.library.Library("_inductor_test", "IMPL")\n(1): <module>'
    assert _names(_doc(raw, b"ok.py(1): fine", layout="single"))[0] == raw.decode()


def test_windows_call_stacks_are_repaired():
    # pytorch/kineto#336: "Call stack" with unescaped backslashes (old Kineto, record_shapes + with_stack)
    data = (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, '
            b'"dur": 2, "args": {"Call stack": "C:\\Users\\u\\train.py(101): step;C:\\Users\\u\\train.py(5): <module>", '
            b'"Input type": ["float"]}}]}')
    with pytest.raises(msgspec.DecodeError) as err:
        DECODE(data)
    doc, _, n = repair(data, DECODE, err.value)
    assert n == 1
    assert doc["traceEvents"][0]["args"]["Call stack"].startswith("C:\\Users\\u\\train.py(101): step;")


def test_valid_values_are_left_byte_for_byte():
    data = _doc(b'escaped \\"ok\\"(1): f', b'bad "one"(2): g')
    with pytest.raises(msgspec.DecodeError) as err:
        DECODE(data)
    doc, fixed_bytes, n = repair(data, DECODE, err.value)
    assert fixed_bytes.replace(b'bad \\"one\\"', b'bad "one"') == data  # only the broken value changed
    assert n == 1 and [e["name"] for e in doc["traceEvents"]] == ['escaped "ok"(1): f', 'bad "one"(2): g']


@pytest.mark.parametrize("mangle, reason", [
    (lambda d: d[: len(d) // 2], "truncated JSON"),
    (lambda d: d.replace(b'"dur": 5\n  },', b'"dur": 5\n  }', 1), "not valid JSON"),  # a missing comma
    (lambda d: d.replace(b'"ts": 100,', b'"ts": 1 00,', 1), "not valid JSON"),
])
def test_other_invalid_json_is_still_refused(tmp_path, mangle, reason):
    p = tmp_path / "t.json"
    p.write_bytes(mangle(_doc(b'bad "one"(2): g', b"ok(1): f", b"ok(2): f")))
    with pytest.raises(InputError, match=reason):
        load_job(p)


def test_trace_repair_writes_a_copy_other_tools_open(tmp_path, capsys):
    from zoomer_ar.cli import main

    out = tmp_path / "fixed.json.gz"
    assert main(["trace", "repair", str(EXCERPT), str(out)]) == 0
    assert "1 event name re-escaped, gzip" in capsys.readouterr().out
    raw, fixed = gzip.open(EXCERPT).read(), gzip.open(out).read()
    doc = json.loads(fixed)  # what json.load, HTA and Perfetto need
    assert BROKEN_NAME in {e.get("name") for e in doc["traceEvents"]}
    assert fixed.replace(b'py(0):         \\"\\"\\"",', b'py(0):         """",') == raw  # every other byte kept
    # valid input: copied as it is, with a note; other invalid JSON: exit 2, one line, no output
    good = tmp_path / "good.json"
    assert main(["trace", "repair", str(out), str(good)]) == 0
    assert "nothing to repair" in capsys.readouterr().err and good.read_bytes() == fixed
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a" "b"}]}')
    assert main(["trace", "repair", str(bad), str(tmp_path / "never.json")]) == 2
    err = capsys.readouterr().err
    assert "not the profiler's unescaped names" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "never.json").exists()
    notebook = tmp_path / "nb.json"  # valid JSON that is not a trace: nothing was repaired, and it says so
    notebook.write_text('{"cells": []}')
    assert main(["trace", "repair", str(notebook), str(tmp_path / "never.json")]) == 2
    err = capsys.readouterr().err
    assert "valid JSON, but not a valid trace" in err and "repaired" not in err
    assert not (tmp_path / "never.json").exists()


@pytest.mark.parametrize("cmd", [["trace", "check"], ["trace", "slice", "--window", "0..10"],
                                 ["trace", "filter", "--cat", "cpu_op"]])
def test_the_streaming_commands_say_how_to_repair(tmp_path, capsys, cmd):
    """The surgery commands stream and check every event: they refuse such a file, and say what is wrong
    with it and which command repairs it; other invalid JSON gets no such hint."""
    from zoomer_ar.cli import main

    def run(src):
        args = [*cmd[:2], str(src)] + ([] if cmd[1] == "check" else [str(tmp_path / f"out-{src.stem}.json")]) + cmd[2:]
        assert main(args) == 2
        return capsys.readouterr().err

    assert "did not escape (pytorch/pytorch#146900): `zoomer-ar trace repair" in run(EXCERPT)
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X" "name": "a", "pid": 1}]}')  # a comma missing between keys
    assert "trace repair" not in run(bad)


# ---- the streaming repair (load.repair.StreamRepair): huge traces, the streaming reader, `trace repair`

def _whole_passes(data: bytes) -> bytes:
    from zoomer_ar.load.repair import passes

    return passes(data)[0]


def _streamed(data: bytes, sizes) -> tuple[bytes, int]:
    from zoomer_ar.load.repair import StreamRepair

    fix, out, i, k = StreamRepair(), [], 0, 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        out.append(fix.feed(data[i : i + n]))
        i, k = i + n, k + 1
    out.append(fix.finish())
    return b"".join(out), fix.fixed


@pytest.mark.parametrize("sizes", [[1], [3, 17, 5], [64], [4096], [1 << 22]])
def test_the_streaming_repair_gives_the_whole_document_passes_bytes(sizes):
    instant = (b'  {\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
               b'    "pid": "Traces", "tid": "PyTorch Profiler", "ts": 90\n  },\n')
    docs = [gzip.open(EXCERPT).read()[: 300_000 if sizes == [1] else None]]
    for layout in ("multi", "single"):
        d = _doc(b'gen {"device": "cpu"}(3): run', b"C:\\Users\\me\\t.py(10): step", b'v.py(0):     """', b"ok(1): f",
                 layout=layout)
        docs.append(d.replace(b'"traceEvents": [\n', b'"traceEvents": [\n' + instant, 1))
    docs.append(b'{"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1, "args": {"Call stack": "C:\\a\\b.py(1): f"}}]}')
    for data in docs:
        want = _whole_passes(data)
        got, fixed = _streamed(data, sizes)
        assert got == want
        assert (fixed > 0) == (want != data)


def test_the_streaming_repair_refuses_a_document_without_line_breaks(monkeypatch):
    from zoomer_ar.load import repair as R

    monkeypatch.setattr(R, "MAX_LINE", 1000)
    with pytest.raises(ValueError, match="no line break"):
        _streamed(b'{"traceEvents": [' + b'{"ph": "X", "name": "a", "pid": 1}, ' * 200 + b"]}", [512])


def _cli(tmp_path, *args, max_bytes: int):
    """zoomer-ar in a fresh process whose in-memory loader takes files up to max_bytes of JSON."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ZOOMER_MAX_TRACE_BYTES=str(max_bytes), ZOOMER_NO_PROGRESS="1")
    return subprocess.run([sys.executable, "-m", "zoomer_ar.cli", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path)


def test_the_streaming_reader_repairs_what_the_in_memory_loader_cannot_hold(tmp_path):
    """Above ZOOMER_MAX_TRACE_BYTES only the streaming reader reads a trace: it re-escapes the names itself
    (before, it handed such a file to the in-memory loader, which refused it as too big)."""
    small = 200_000  # the excerpt is 1.7 MB of JSON
    refused = _cli(tmp_path, "analyze", str(EXCERPT), "--no-stream", "--no-files", max_bytes=small)
    assert refused.returncode == 2 and "ZOOMER_MAX_TRACE_BYTES" in refused.stderr
    done = _cli(tmp_path, "analyze", str(EXCERPT), "--stream", "--out", str(tmp_path / "s"), max_bytes=small)
    assert done.returncode == 0, done.stderr
    streamed = json.loads((tmp_path / "s" / "findings.json").read_text())
    streamed["features"].pop("cost_attribution", None)  # the CLI's figure on top of the analysis
    whole = analyze_path(EXCERPT)
    assert streamed["features"] == json.loads(whole.model_dump_json())["features"]
    assert any("1 event name " in n and "pytorch/pytorch#146900" in n for n in streamed["notes"])


def test_trace_repair_streams_and_never_replaces_an_output_with_a_failed_one(tmp_path):
    small = 200_000
    out = tmp_path / "fixed.json.gz"
    done = _cli(tmp_path, "trace", "repair", str(EXCERPT), str(out), max_bytes=small)  # no whole-file read
    assert done.returncode == 0, done.stderr
    assert "1 event name re-escaped" in done.stdout
    raw = gzip.open(EXCERPT).read()
    assert gzip.open(out).read() == _whole_passes(raw)
    json.loads(gzip.open(out).read())
    # a name with a raw line break: only the whole-document repair finds it (at the decoder's offset)
    nl = tmp_path / "newline.json"
    nl.write_bytes(_doc(b'lib = Library("t", "IMPL")\n(1): <module>', b"ok.py(1): fine", layout="single"))
    fixed = tmp_path / "nl-fixed.json"
    assert _cli(tmp_path, "trace", "repair", str(nl), str(fixed), max_bytes=1 << 30).returncode == 0
    assert json.loads(fixed.read_bytes())["traceEvents"][0]["name"] == 'lib = Library("t", "IMPL")\n(1): <module>'
    # above the in-memory limit that file cannot be repaired: refused, and an existing output stays as it was
    out.write_bytes(b"earlier output")
    bad = _cli(tmp_path, "trace", "repair", str(nl), str(out), max_bytes=100)
    assert bad.returncode == 2 and "not the profiler's unescaped names" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert out.read_bytes() == b"earlier output"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".zoomer-repair")]


def test_the_compiled_reader_says_where_a_name_is_broken_no_msgspec_pass_needed(monkeypatch):
    """Where the compiled reader stops at an event whose name the profiler did not escape, the streaming
    reader goes straight to a repaired pass (a msgspec pass to locate the name read the whole file again,
    and was the pass that needed the most memory)."""
    from zoomer_ar.load import fastcols
    from zoomer_ar.stream import load as SL

    if not fastcols.available():
        pytest.skip("the compiled event reader is not built")
    calls = []
    real_fast, real_slow = SL.scan_columns, SL.scan
    monkeypatch.setattr(SL, "scan_columns", lambda *a, **k: (calls.append(("compiled", k.get("repair") is not None)),
                                                               real_fast(*a, **k))[1])
    monkeypatch.setattr(SL, "scan", lambda *a, **k: (calls.append(("msgspec", k.get("repair") is not None)),
                                                      real_slow(*a, **k))[1])
    trace, _ = SL.stream_rank(EXCERPT)
    assert calls == [("compiled", False), ("compiled", True)]
    assert trace.metadata["repaired_names"] == 1 and BROKEN_NAME in trace.names


# ---- events written several to a line: each name read on its own (the pattern ran to the line's last `"pid":`)

def _line_doc(names: list[bytes], *, layout: str = "one-line", sep: bytes = b", ") -> bytes:
    """A trace whose events hold the given raw names: all on one line ("one-line"), or one event a line
    ("pretty"), with `sep` between each name and its `"pid":` (`,` for a compact writer)."""
    events = [b'{"ph": "X", "cat": "python_function", "name": "' + n + b'"' + sep + b'"pid": 1, "tid": 1, "ts": '
              + str(100 + 10 * i).encode() + b', "dur": 5, "args": {"External id": ' + str(i).encode() + b"}}"
              for i, n in enumerate(names)]
    if layout == "one-line":
        return b'{"schemaVersion": 1, "traceEvents": [' + b", ".join(events) + b"]}"
    return b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n  ' + b",\n  ".join(events) + b"\n  ]\n}\n"


def _all_readers(tmp_path, data: bytes) -> dict[str, list[str]]:
    """The event names each way in: repair() on the whole document, the streaming repair cut in tiny
    chunks (decoded), `trace repair`'s output, and the in-memory and streaming loaders' event counts."""
    from zoomer_ar.cli import main

    got = {"repair": _names(data)}
    for sizes in ([1], [3, 17, 5]):
        streamed, _ = _streamed(data, sizes)
        got[f"stream{sizes}"] = [e["name"] for e in json.loads(streamed)["traceEvents"]]
    src, out = tmp_path / "t.json", tmp_path / "fixed.json"
    src.write_bytes(data)
    assert main(["trace", "repair", str(src), str(out)]) == 0
    got["trace repair"] = [e["name"] for e in json.loads(out.read_bytes())["traceEvents"]]
    for how, job in (("load_job", load_job(src)), ("load_job_streaming", load_job_streaming(src, workers=1))):
        rank = job.ranks[0]
        got[how] = [rank.names[c] for c in rank.name]
    return got


@pytest.mark.parametrize("layout, sep", [("one-line", b", "), ("one-line", b","), ("pretty", b", "), ("pretty", b",")])
def test_events_on_one_line_keep_their_count_and_names(tmp_path, layout, sep):
    """Three events on one line, the middle one's name holding an unescaped quote: `trace repair` and
    `analyze` made them one event named `a(1): f", "pid": 1, ... "name": "c(3): h` (exit 0)."""
    raw = [b"a(1): f", b'f("a")', b"c(3): h"]
    data = _line_doc(raw, layout=layout, sep=sep)
    for how, names in _all_readers(tmp_path, data).items():
        assert names == [r.decode() for r in raw], how


def _any_doc(names: list[bytes], layout: str) -> bytes:
    """The names written raw in one of the layouts: Kineto's ("multi": one key a line; "single": the older
    one), all events on one line, or one event a line."""
    return _doc(*names, layout=layout) if layout in ("multi", "single") else _line_doc(names, layout=layout)


LAYOUTS = ["multi", "single", "one-line", "pretty"]
# raw names holding what the layouts use to end a name: `", "pid":`, quotes, a backslash before the closing quote
TRICKY = [b'f(", "pid": x)', b'x", "pid": y', b'x", "pid": 1, "k": "v', b"C:\\dir\\", b"\\", b'"', b'a"b"c',
          b'{"name": "n"}', b'v.py(0):     """', b"tab\there", b'", "pid": ']


@pytest.mark.parametrize("layout", LAYOUTS)
def test_names_holding_the_layouts_separators_come_back_as_written(layout):
    """Each name ends at the first `"pid":` after which the bytes read as JSON: a name holding `", "pid":`
    itself ends at the later one, one whose reading would repeat a member at the one that does not."""
    raw = [b"ok(1): f", *TRICKY, b'g("a")(2): h']
    data = _any_doc(raw, layout)
    assert _names(data) == [r.decode() for r in raw]
    for sizes in ([1], [3, 17, 5], [64]):  # the streaming repair, names cut anywhere: the same bytes
        assert _streamed(data, sizes)[0] == _whole_passes(data)


# names that cannot be told apart from the events around them: one name, or an event's end and another's start
AMBIGUOUS = [b'g("a"}, {"ph": "X", "name": "b")', b'g("a"}, {"cat": "c", "name": "b")']
# the same, the text before the event structure a valid string: in a layout of events over several lines
WHOLE_EVENTS = b'x", "pid": 1, "tid": 2}, {"ph": "X", "name": "y'


def _refused(tmp_path, data: bytes) -> None:
    """Every way in refuses data in one line (exit 2), and `trace repair` writes nothing."""
    from zoomer_ar.cli import main

    with pytest.raises(msgspec.DecodeError) as err:
        DECODE(data)
    assert isinstance(repair(data, DECODE, err.value), BaseException)
    src, out = tmp_path / "t.json", tmp_path / "fixed.json"
    src.write_bytes(data)
    assert main(["trace", "repair", str(src), str(out)]) == 2 and not out.exists()
    with pytest.raises(InputError, match="not valid JSON"):
        load_job(src)
    with pytest.raises(InputError, match="not valid JSON"):
        load_job_streaming(src, workers=1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", AMBIGUOUS)
def test_a_name_that_may_hold_another_events_start_is_refused_not_guessed(tmp_path, layout, name):
    """The pattern took `g("a"}, {"ph": "X", "name": "b")` for one name where it ran to the line's last
    `"pid":`, and the decoder-offset repair took the rest of a name already re-escaped for more text (a
    second backslash before its quote): the file is now refused, as any other invalid JSON."""
    _refused(tmp_path, _any_doc([b"ok(1): f", name, b'f("a")(3): h'], layout))


@pytest.mark.parametrize("layout", ["multi", "single"])
def test_whole_events_in_a_name_are_refused_where_the_layout_tells(tmp_path, layout):
    """Kineto writes an event over several lines: `x", "pid": 1, "tid": 2}, {"ph": "X", "name": "y` on one
    line is not its layout, but reads as valid JSON (two events) as written; with another name to repair
    in the file, the repair made two events of it. Now it is refused (the text cannot be told apart)."""
    _refused(tmp_path, _any_doc([b"ok(1): f", WHOLE_EVENTS, b'f("a")(3): h'], layout))


@pytest.mark.parametrize("layout", ["one-line", "pretty"])
def test_whole_events_in_a_name_read_as_json_where_the_layout_cannot_tell(layout):
    """Events written one a line or all on one line: `x", ... "name": "y` are two events to every JSON
    reader, and to the repair (the documented limit: these bytes cannot be told apart)."""
    data = _any_doc([b"ok(1): f", WHOLE_EVENTS, b'f("a")(3): h'], layout)
    as_written = json.loads(data.replace(b'f("a")', b'f(\\"a\\")'))
    assert _names(data) == [e["name"] for e in as_written["traceEvents"]] == ["ok(1): f", "x", "y", 'f("a")(3): h']


ONE_LINE_TRACES = ["hta/large_integer_trace", "hta/trace_compare/base", "hta/trace_compare/test",
                   "tracelens/inference/vllm_decode_full/graph_execution.json.gz"]


@pytest.mark.parametrize("where", ONE_LINE_TRACES)
def test_the_passes_leave_valid_one_line_traces_as_they_are(shared_traces, where):
    """Valid traces written on one line: the pattern took each line's first name to its last `"pid":` (one
    name re-escaped where there was none), so a broken name anywhere else in such a file merged them all."""
    from zoomer_ar.load.job import read_trace_bytes
    from zoomer_ar.load.repair import passes

    path = shared_traces / where
    for p in sorted(path.glob("*.json*")) if path.is_dir() else [path]:
        data = read_trace_bytes(p)
        DECODE(data)
        assert passes(data) == (data, 0)


def _inject(data: bytes, spots: list[tuple[int, int]], texts: list[bytes]) -> bytes:
    out, last = [], 0
    for (a, b), text in zip(spots, texts):
        out += [data[last:a], text]
        last = b
    return b"".join(out) + data[last:]


REAL = ["tracelens/torch_compile_triton/trace.json.gz", "hta/trace_compare/base/base.json.gz"]


@pytest.mark.parametrize("where", [*REAL, "excerpt"])
def test_real_traces_with_names_broken_come_back_with_every_event(shared_traces, where):
    """Real traces (Kineto's older layout, one line, and torch 2.13's excerpt), a few event names replaced by
    raw texts the profiler could write: the repair gives the same events, the texts as their names."""
    from zoomer_ar.load.job import read_trace_bytes
    from zoomer_ar.load.name_end import NAME_START, PID_END, VALID

    data = read_trace_bytes(EXCERPT if where == "excerpt" else shared_traces / where)
    try:
        DECODE(data)
    except msgspec.DecodeError as exc:  # the excerpt: broken as written; its own repair is tested above
        data = repair(data, DECODE, exc).data
    spots = []
    for m in NAME_START.finditer(data):
        end = VALID.match(data, m.end()).end()
        if PID_END.match(data, end):
            spots.append((m.end(), end))
    step = max(1, len(spots) // 40)
    spots = spots[::step][:40]
    texts = [(TRICKY + [b'f("a")'])[i % (len(TRICKY) + 1)] for i in range(len(spots))]
    broken = _inject(data, spots, texts)
    with pytest.raises(msgspec.DecodeError) as err:
        DECODE(broken)
    got = repair(broken, DECODE, err.value)
    assert not isinstance(got, BaseException), got
    escaped = [json.dumps(t.decode(), ensure_ascii=False)[1:-1].encode() for t in texts]
    assert got.doc == DECODE(_inject(data, spots, escaped))
    assert _streamed(broken, [4096])[0] == _whole_passes(broken)
