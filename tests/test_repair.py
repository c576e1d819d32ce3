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
    from zoomer_ar.load.repair import _CALL_STACK, _NAME, _pass

    return _pass(_pass(data, _NAME)[0], _CALL_STACK)[0]


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
