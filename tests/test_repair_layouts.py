"""Unescaped event names (pytorch/pytorch#146900) in the layouts other writers use: compact JSON (no blanks),
torch's EventList export (`{"name": "...", "ph": ...}`: the name first, then `"ph":`), and Kineto's thread and
process names (`"args": {"name": "..."}`: the name last in its object). zoomer_ar/load/repair.py, name_end.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.load import fastcols
from zoomer_ar.load import repair as R
from zoomer_ar.stream import load as SL


def _events(names: list[str]) -> list[dict]:
    """A small trace's events: a Python frame per name (the name written raw below), each with a cpu op."""
    out = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    for i, name in enumerate(names):
        ts = 100 + 20 * i
        out.append({"ph": "X", "cat": "python_function", "name": f"@@{i}@@", "pid": 1, "tid": 1, "ts": ts, "dur": 10})
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 5,
                    "args": {"External id": i}})
    return out


def _raw(text: str, names: list[str]) -> bytes:
    """text with each placeholder replaced by its name as the profiler writes it: unescaped."""
    data = text.encode()
    for i, name in enumerate(names):
        data = data.replace(f"@@{i}@@".encode(), name.encode())
    return data


def compact_trace(names: list[str], *, one_line: bool) -> bytes:
    """A trace written without blanks (`"name":"...","pid":1`), all on one line or one event a line."""
    sep = (",", ":")
    events = [json.dumps(e, separators=sep) for e in _events(names)]
    body = ",".join(events) if one_line else "\n" + ",\n".join(events) + "\n"
    return _raw('{"schemaVersion":1,"traceEvents":[' + body + "]}", names)


BROKEN = ['train.py(3): f("a")', "C:\\Users\\me\\train.py(10): step", "ok.py(1): fine"]


def _record_passes(monkeypatch) -> list[tuple[str, bool]]:
    calls: list[tuple[str, bool]] = []
    real_fast, real_slow = SL.scan_columns, SL.scan

    def fast(*a, **k):
        calls.append(("compiled", k.get("repair") is not None))
        return real_fast(*a, **k)

    def slow(*a, **k):
        calls.append(("msgspec", k.get("repair") is not None))
        return real_slow(*a, **k)

    monkeypatch.setattr(SL, "scan_columns", fast)
    monkeypatch.setattr(SL, "scan", slow)
    return calls


@pytest.mark.parametrize("one_line", [True, False])
def test_the_compiled_reader_recognises_a_compact_broken_name(tmp_path, monkeypatch, one_line):
    """The compiled reader's stop was matched against `"name": "` (with a blank): in a compact trace it was
    not recognised as an unescaped name, so a whole msgspec pass read the file again only to find it."""
    if not fastcols.available():
        pytest.skip("the compiled event reader is not built")
    src = tmp_path / "compact.json"
    src.write_bytes(compact_trace(BROKEN, one_line=one_line))
    with pytest.raises(ValueError):
        json.loads(src.read_bytes())
    calls = _record_passes(monkeypatch)
    trace, _ = SL.stream_rank(src)
    assert calls == [("compiled", False), ("compiled", True)]
    assert trace.metadata["repaired_names"] == 2
    assert [trace.names[c] for c in trace.name if trace.names[c] != "aten::mm"][-3:] == BROKEN


def _cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zoomer_ar.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, ZOOMER_NO_PROGRESS="1", **env))


@pytest.mark.parametrize("one_line", [True, False])
def test_a_compact_broken_trace_is_analysed_by_the_streaming_path_alone(tmp_path, one_line):
    """Forced through the streaming path with an in-memory limit below the file's size: analysed, with the
    repair's note (nothing may fall back to the in-memory loader, which would refuse the file)."""
    src = tmp_path / "compact.json"
    src.write_bytes(compact_trace(BROKEN, one_line=one_line))
    done = _cli(tmp_path, "analyze", str(src), "--no-files", ZOOMER_STREAM="1", ZOOMER_MAX_TRACE_BYTES="200")
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "2 event names " in said and "streaming pass" in said


# ---- the layouts whose name is not followed by `"pid":`

def event_list_trace(names: list[bytes]) -> bytes:
    """What torch's EventList.export_chrome_trace writes (torch/autograd/profiler_util.py; `prof.events()
    .export_chrome_trace(path)`, and a profiler built without Kineto): a bare array on one line, each event
    opening with its name, unescaped, then `"ph":`; a flow start (`"ph": "s"`) after the second event."""
    out = []
    for i, name in enumerate(names):
        out.append(b'{"name": "' + name + b'", "ph": "X", "ts": ' + str(100 + 20 * i).encode()
                   + b', "dur": 10.5, "tid": 1, "pid": "CPU functions", "args": {}}, ')
        if i == 1:
            out.append(b'{"name": "' + name + b'", "ph": "s", "ts": 120, "tid": 1, "pid": "CPU functions", "id": 0, '
                       b'"cat": "cpu_to_cuda", "args": {}}, ')
    return b"[" + b"".join(out)[:-2] + b"]"


def thread_name_trace(names: list[bytes], *, layout: str) -> bytes:
    """Kineto's thread names (`thread <tid> (<the OS thread's name>)`, unescaped) in its metadata events'
    args: torch 2.13's layout ("multi": one key a line) or the older one ("single"), one Python frame each."""
    events = []
    for i, name in enumerate(names):
        tid = str(10 + i).encode()
        head = (b'    "ph": "M",\n    "name": "thread_name",\n    "ts": 1,\n    "pid": 1,\n    "tid": ' + tid + b",\n"
                if layout == "multi" else b'    "name": "thread_name", "ph": "M", "ts": 1, "pid": 1, "tid": ' + tid + b",\n")
        events.append(b"  {\n" + head + b'    "args": {\n      "name": "thread ' + tid + b" (" + name + b')"\n    }\n  }')
        events.append(b'  {\n    "ph": "X", "cat": "python_function", "name": "t.py(1): f", "pid": 1, "tid": ' + tid
                      + b",\n    " + b'"ts": ' + str(100 + 20 * i).encode() + b', "dur": 5\n  }')
    return b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + b",\n".join(events) + b"\n  ]\n}\n"


def _thread_names(doc) -> list[str]:
    return [e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"]


def _event_list_names(doc) -> list[str]:
    return [e["name"] for e in doc if e["ph"] == "X"]


# raw names holding what the layouts use to end a name, quotes, backslashes, control characters
RAW = [b'user "annot" \\ x', b'f("a")', b"C:\\dir\\", b'a"b"c', b'"', b"\\", b"tab\there", b'x", "ph": "y',
       b'", "ph": ', b'f(", "ph": 1)', b'x", "pid": 1, "k": "v', b'{"name": "n"}', b'v.py(0):     """', b"ok(1): fine"]
THREAD_RAW = [b'py"th\\on', b'a"b', b'"', b"\\", b'x"}', b"tab\there", b'q", "k": 1', b"python"]


def _repaired(data: bytes) -> tuple[bytes, int]:
    """The whole-document repair, and the streaming one cut into small chunks (the same bytes)."""
    import msgspec

    decode = msgspec.json.Decoder().decode
    with pytest.raises(msgspec.DecodeError) as err:
        decode(data)
    got = R.repair(data, decode, err.value)
    assert not isinstance(got, BaseException), got
    for size in (1, 7, 64) if len(data) < 100_000 else (4096, 1 << 20):  # tiny feeds of a long line: each copies it
        fix, parts = R.StreamRepair(), []
        for i in range(0, len(data), size):
            parts.append(fix.feed(data[i : i + size]))
        parts.append(fix.finish())
        assert b"".join(parts) == R.passes(data)[0]
    return got.data, got.fixed


def test_event_list_names_come_back_as_written():
    """torch's EventList export puts `"ph":` after the name: such a name was never repaired (only a quote
    followed by `"pid":` could end it), so the file was refused."""
    data, fixed = _repaired(event_list_trace(RAW))
    assert _event_list_names(json.loads(data)) == [r.decode() for r in RAW]
    assert json.loads(data)[2]["ph"] == "s" and json.loads(data)[2]["name"] == RAW[1].decode()
    assert fixed == sum(1 for r in RAW if b'"' in r or b"\\" in r or b"\t" in r) + 1  # the flow's name too


@pytest.mark.parametrize("layout", ["multi", "single"])
def test_kineto_thread_names_come_back_as_written(layout):
    """A thread whose OS name holds a quote or a backslash: Kineto writes `"name": "thread 7 (py"th\\on)"` as
    the last member of its args, the object's `}` on the next line; no `"pid":` follows, so it was refused."""
    data, fixed = _repaired(thread_name_trace(THREAD_RAW, layout=layout))
    tids = range(10, 10 + len(THREAD_RAW))
    assert _thread_names(json.loads(data)) == [f"thread {t} ({r.decode()})" for t, r in zip(tids, THREAD_RAW)]
    assert fixed == len(THREAD_RAW) - 1  # `python` is valid


@pytest.mark.parametrize("data", [
    event_list_trace([b"ok", b'g("a"}, {"name": "b")', b'f("a")']),  # one name, or an event's end and another's
    event_list_trace([b"ok", b'x", "ph": "X"}, {"name": "y', b'f("a")']),
])
def test_an_event_list_name_that_may_hold_another_events_start_is_refused(tmp_path, data):
    from zoomer_ar.cli import main

    src, out = tmp_path / "t.json", tmp_path / "fixed.json"
    src.write_bytes(data)
    assert main(["trace", "repair", str(src), str(out)]) == 2 and not out.exists()


def test_a_name_the_ph_key_follows_is_only_ended_there_where_it_opens_its_object():
    """Kineto's events hold `"ph":` before the name (`"ph": "X", "cat": ..., "name": ..., "pid":`), so a
    name there holding `", "ph": "` is not ended at it: the name's `"pid":` ends it, as before."""
    doc = (b'{"traceEvents": [\n  {\n    "ph": "X",\n    "cat": "python_function",\n    "name": "a"b", "ph": "c",\n'
           b'    "pid": 1,\n    "tid": 1,\n    "ts": 1,\n    "dur": 2\n  }\n]}')
    data, fixed = _repaired(doc)
    assert fixed == 1 and json.loads(data)["traceEvents"][0]["name"] == 'a"b", "ph": "c'


@pytest.mark.parametrize("fast", [True, False])
def test_the_loaders_read_the_new_layouts(tmp_path, fast):
    """analyze's loaders read such files repaired: the in-memory one, and the streaming one by itself (it
    did not recognise these names, and could only hand the file to the in-memory loader)."""
    from zoomer_ar.load import load_job

    if fast and not fastcols.available():
        pytest.skip("the compiled event reader is not built")
    events, threads = tmp_path / "events.json", tmp_path / "threads.json"
    events.write_bytes(event_list_trace(RAW))
    threads.write_bytes(thread_name_trace(THREAD_RAW, layout="multi"))
    for path, names, fixed in ((events, sorted({r.decode() for r in RAW}), len(RAW)),  # a flow's name too
                               (threads, ["t.py(1): f", "thread_name"], len(THREAD_RAW) - 1)):
        streamed, _ = SL.stream_rank(path, fast=fast)
        for rank in (load_job(path).ranks[0], streamed):
            assert sorted(rank.names) == names and rank.metadata["repaired_names"] == fixed


RECORD = r"""
import ctypes, sys, torch
from torch.profiler import ProfilerActivity, profile, record_function

libc = ctypes.CDLL(None)
libc.pthread_self.restype = ctypes.c_ulong
libc.pthread_setname_np.argtypes = [ctypes.c_ulong, ctypes.c_char_p]
libc.pthread_setname_np(libc.pthread_self(), b'py"th\\on')  # the OS thread's name, as Kineto reads it
x = torch.randn(8, 8)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    with record_function('user "annot" \\ x'):
        (x @ x).sum()
prof.export_chrome_trace(sys.argv[1])  # Kineto's layout
prof.events().export_chrome_trace(sys.argv[2])  # EventList's
"""


def test_traces_torch_writes_are_repaired_and_analysed_streaming(tmp_path):
    """The real thing: torch's profiler (CPU) writes both files invalid; `analyze`, forced through the
    streaming path with an in-memory limit below their size, reads them, and `trace repair` writes copies
    json.load opens, every other byte kept."""
    pytest.importorskip("torch")
    kineto, event_list = tmp_path / "kineto.json", tmp_path / "events.json"
    script = tmp_path / "record.py"
    script.write_text(RECORD)
    made = subprocess.run([sys.executable, str(script), str(kineto), str(event_list)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    for path in (kineto, event_list):
        raw = path.read_bytes()
        with pytest.raises(ValueError):
            json.loads(raw)
        done = _cli(tmp_path, "analyze", str(path), "--no-files", ZOOMER_STREAM="1", ZOOMER_MAX_TRACE_BYTES="200")
        assert done.returncode == 0, done.stderr
        assert "pytorch/pytorch#146900" in done.stdout + done.stderr
        out = tmp_path / f"fixed-{path.name}"
        assert _cli(tmp_path, "trace", "repair", str(path), str(out)).returncode == 0
        doc = json.loads(out.read_bytes())
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        names = {e["name"] for e in events} | {e.get("args", {}).get("name") for e in events}
        if path == kineto:  # Kineto writes a backslash in a name as `/`, not in a thread's name
            assert 'user "annot" / x' in names and any(str(n).endswith('(py"th\\on)') for n in names)
        else:
            assert 'user "annot" \\ x' in names
        assert out.read_bytes().replace(b'\\"', b'"').replace(b"\\\\", b"\\") == raw


# ---- long names: the 1 MiB limit, and texts whose reading took minutes to hours

def kineto_trace(names: list[bytes]) -> bytes:
    """torch 2.13's layout (one key a line), a user annotation per name, written raw."""
    events = [b'  {\n    "ph": "X",\n    "cat": "user_annotation",\n    "name": "' + n + b'",\n    "pid": 1,\n'
              b'    "tid": 1,\n    "ts": ' + str(100 + 10 * i).encode() + b',\n    "dur": 5\n  }' for i, n in enumerate(names)]
    return b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + b",\n".join(events) + b"\n  ]\n}\n"


def _names_of(data: bytes) -> list[str]:
    doc = json.loads(data)
    return [e["name"] for e in (doc["traceEvents"] if isinstance(doc, dict) else doc) if e["ph"] == "X"]


@pytest.mark.parametrize("layout", ["kineto", "event list"])
def test_a_name_over_a_mib_comes_back_as_written(layout):
    """A record_function name holding a 2 MiB config dump (quotes, backslashes): the end of a name was only
    looked for in its first MiB, so such a file was refused."""
    config = b'{"path": "C:\\data\\x", "layers": [1, 2]} ' * (2 << 20 >> 5)
    raw = [b"ok(1): f", b"cfg=" + config, b'f("a")']
    make = kineto_trace if layout == "kineto" else event_list_trace
    data, fixed = _repaired(make(raw))
    assert _names_of(data) == [r.decode() for r in raw]


def test_many_keys_in_a_name_are_each_read_once(monkeypatch):
    """A name holding many `"name":` keys: each was tested against every quote before it (each quote's
    reading again for each key): a 26 KB text took 13 s, now each quote is read once."""
    from zoomer_ar.load import name_end as N

    reads = []
    real = N.follows
    monkeypatch.setattr(N, "follows", lambda *a, **k: (reads.append(a[1]), real(*a, **k))[1])
    text = b'x"' + b'a, "name": "b' * 2000
    data = kineto_trace([b"ok", text])
    start = data.index(b'"name": "x') + len(b'"name": "')
    assert N.name_end(data, start) == start + len(text)
    assert len(reads) <= text.count(b'"') + 2  # each quote once (the valid text's end: also as a string)


@pytest.mark.parametrize("unit", [b'", "pid": 1, "k": "v', b'\\", "pid": "'])
def test_texts_whose_every_end_reads_far_are_read_in_linear_time(unit):
    """Each `", "pid":` in such a text is a candidate end after which the rest of the text reads as JSON (a
    key repeated, or one long string): each candidate's reading ran to the end of the line, so a 40 KB text
    took 11 s and a MiB hours. A repeated key now ends a candidate's reading; 0.2 MiB is read in a blink."""
    import time

    text = b'x"' + unit * (200_000 // len(unit))
    t = time.process_time()
    data, _ = _repaired(kineto_trace([b"ok", text]))
    assert time.process_time() - t < 30  # before: about 5 minutes
    assert _names_of(data)[1] == text.decode()


def test_a_text_too_costly_to_read_is_refused_in_seconds(tmp_path):
    """Beyond its budget (READ_BUDGET steps of reading) a name is refused as one that cannot be told apart,
    with the decoder's one line, instead of being read for hours."""
    from zoomer_ar.cli import main
    from zoomer_ar.load import name_end as N

    text = b'x"' + b'", "pid": 1, "k": "v' * (3 << 20 >> 4)
    data = kineto_trace([b"ok", text])
    start = data.index(b'"name": "x') + len(b'"name": "')
    with pytest.raises(N.AmbiguousName, match="too long"):
        N.name_end(data, start)
    src, out = tmp_path / "t.json", tmp_path / "fixed.json"
    src.write_bytes(data)
    assert main(["trace", "repair", str(src), str(out)]) == 2 and not out.exists()
