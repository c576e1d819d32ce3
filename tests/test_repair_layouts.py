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
