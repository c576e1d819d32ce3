"""The compiled event reader (zoomer_ar/load/_fastjson.c) gives exactly what msgspec gives.

It is an accelerator: every result here is compared with the msgspec path (ColumnBuilder, the
compact builder's event path), never with hand-written expectations. Covered: every corpus trace
through both loaders, number parsing against Python's float() (including values whose 64-bit
intermediate lands on a midpoint between two doubles), strings with escapes and non-ASCII text,
values outside the reader's subset (which must send the file through msgspec, with the same
result or the same refusal), and chunk boundaries anywhere.
"""

from __future__ import annotations

import decimal
import gzip
import json
import os
import random

import msgspec
import numpy as np
import pytest

from zoomer_ar.errors import InputError
from zoomer_ar.load import fastcols
from zoomer_ar.load import job as J
from zoomer_ar.load import load_trace
from zoomer_ar.stream import load as SL
from zoomer_ar.stream.load import stream_rank

from conftest import all_trace_files
from test_benchmarks_smoke import _assert_same_trace, _reference

pytestmark = pytest.mark.xdist_group("fastjson")


@pytest.fixture(scope="module", autouse=True)
def compiled_reader():
    if not fastcols.available():
        if os.environ.get("CI"):
            pytest.fail("the compiled event reader was not built (setup.py ext_modules; needs gcc and Python headers)")
        pytest.skip("the compiled event reader is not built in this installation")


def _parse(doc: bytes, final: bool = True):
    p = fastcols.raw_parser({}, {}, {}, {})
    p.feed(doc, 1, final)
    return p.take()


# ------------------------------------------------------------------------------------------------
# the corpus: both loaders, both streaming paths
# ------------------------------------------------------------------------------------------------


def test_in_memory_loader_equal_on_every_corpus_trace(shared_traces):
    compared = 0
    for path in all_trace_files():
        fast = J.stream_trace(path, fast=True)
        if fast is None:  # the whole-document path decides (and refuses)
            with pytest.raises(InputError):
                _reference(path)
            continue
        # msgspec's streaming path defers some files (value types that convert differently from one
        # slice to the next) to the whole-document path: compare with that, the reference
        slow = J.stream_trace(path, fast=False) or _reference(path)
        assert fast[0] == slow[0], f"{path}: sha256"
        for f in J._TOP_FIELDS:
            assert getattr(fast[1], f) == getattr(slow[1], f), f"{path}: {f}"
        _assert_same_trace(fast[2], slow[2], str(path))
        compared += 1
    assert compared >= 80


def test_every_corpus_trace_is_in_the_readers_subset(shared_traces, monkeypatch):
    """No corpus trace needs the msgspec fallback (AMD's string ids and sizes are in the subset)."""
    redone = []
    real = J._Consumer._events_fast

    def spy(self, buf):
        try:
            return real(self, buf)
        except J._Redo:
            redone.append(self.path.name)
            raise

    monkeypatch.setattr(J._Consumer, "_events_fast", spy)
    for path in all_trace_files():
        J.stream_trace(path)
    assert not redone, redone


def test_streaming_path_gives_the_same_features_with_either_reader(shared_traces):
    from zoomer_ar.features import extract
    from zoomer_ar.load.job import assemble_job

    def features(path, fast):
        trace, info = stream_rank(path, fast=fast)
        return extract(assemble_job(path, None, [trace], [info], [])).vector.model_dump_json()

    checked = 0
    for path in all_trace_files():
        try:
            a = features(path, True)
        except Exception as exc:  # noqa: BLE001 - files the streaming reader refuses: both must refuse
            with pytest.raises(type(exc)):
                features(path, False)
            continue
        assert a == features(path, False), path
        checked += 1
    assert checked >= 80


# ------------------------------------------------------------------------------------------------
# values
# ------------------------------------------------------------------------------------------------


def _numbers() -> list[str]:
    rng = random.Random(7)
    out = ["0", "-0", "-0.0", "0.0", "1", "-1", "1e0", "1E+2", "5e-324", "1.7976931348623157e308", "2.2250738585072014e-308",
           "9007199254740993", "9007199254740993.0", "1712195495501688.5", "1623143089861.123", "123456789012345678",
           "9223372036854775807", "-9223372036854775807", "0.1", "0.30000000000000004", "1e22", "1e23", "1e-22", "1e-23"]
    for _ in range(40000):
        k = rng.random()
        if k < 0.25:
            out.append(f"{rng.randint(0, 10 ** rng.randint(1, 19))}.{rng.randint(0, 10 ** rng.randint(0, 6))}")
        elif k < 0.45:
            out.append(repr(rng.uniform(-1e6, 1e18)))
        elif k < 0.6:
            out.append(f"{rng.randint(1, 10 ** 17)}e{rng.randint(-30, 30)}")
        elif k < 0.75:
            out.append(repr(rng.random() * 10 ** rng.randint(-20, 20)))
        else:  # exact midpoints between neighbouring doubles, written with up to 19 digits
            d = rng.uniform(1, 2 ** 60)
            mid = (decimal.Decimal(d) + decimal.Decimal(float(np.nextafter(d, np.inf)))) / 2
            text = format(mid, "f")
            if len(text.replace(".", "").lstrip("0")) <= 19:
                out.append(text)
            else:
                out.append(format(mid.quantize(decimal.Decimal(1)), "f") + ".0")
    return out


def test_numbers_parse_as_python_and_msgspec_parse_them():
    nums = _numbers()
    doc = b"[" + b",".join(b'{"ts":%s,"dur":%s}' % (n.encode(), n.encode()) for n in nums) + b"]"
    n, cols, _ = _parse(doc)
    got = np.frombuffer(cols["ts"], dtype=np.float64)
    expected = np.array([float(e["ts"]) for e in msgspec.json.decode(doc)])
    assert n == len(nums)
    bad = np.flatnonzero(got.view(np.int64) != expected.view(np.int64))
    assert not bad.size, [nums[i] for i in bad[:5]]
    assert np.array_equal(got, [float(x) for x in nums])


@pytest.mark.parametrize("name", ["plain", 'quote " inside', "back\\slash", "tab\tand\nnewline", "é ü 中文 🚀",
                                  "\u2028 line sep", "ctrl \u0001 char", "/slash/"])
def test_names_with_escapes_and_unicode(tmp_path, name):
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 1.5, "dur": 2},
              {"ph": "X", "cat": "cpu_op", "name": "other", "pid": 1, "tid": 1, "ts": 3, "dur": 2},
              {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 5, "dur": 2}]
    for ensure_ascii in (True, False):
        path = tmp_path / f"t{ensure_ascii}.json"
        path.write_bytes(json.dumps({"traceEvents": events}, ensure_ascii=ensure_ascii).encode())
        fast, slow = J.stream_trace(path, fast=True), J.stream_trace(path, fast=False)
        _assert_same_trace(fast[2], slow[2], name)
        assert fast[2].names[int(fast[2].name[0])] == name


# Each variant changes one event of an otherwise ordinary trace. "subset" ones are handled by the
# compiled reader; the others must go to msgspec: the result (or the refusal) is msgspec's.
VARIANTS = {
    "amd-hex-stream": ({"args": {"stream": "0x0", "bytes": "60"}}, True),
    "decimal-string-ids": ({"args": {"correlation": "17", "External id": "-3", "Total Allocated": "1.5e3"}}, True),
    "nulls": ({"args": {"correlation": None, "bytes": None, "Input Dims": None, "Call stack": None}}, True),
    "memory-bytes": ({"args": {"Bytes": -512, "Total Allocated": 4096, "Device Id": 0}}, True),
    "external-id-2021": ({"args": {"external id": 12}}, True),
    "unknown-nested": ({"args": {"x": {"a": [1, {"b": [None, True, False, "s\\u00e9"]}]}}, "id": 3, "bp": "e"}, True),
    "plus-sign-string": ({"args": {"stream": "+7"}}, False),
    "float-stream": ({"args": {"stream": 1.5}}, False),
    "string-ts": ({"ts": "12"}, False),
    "float-pid": ({"pid": 1.0}, False),
    "bool-tid": ({"tid": True}, False),
    "null-args": ({"args": None}, False),
    "list-group-size": ({"args": {"Group size": [1]}}, False),
    "int-call-stack": ({"args": {"Call stack": 5}}, False),
    "huge-int": ({"args": {"correlation": 123456789012345678901234}}, False),
    "huge-float": ({"ts": 1e400}, False),
    "shape-out-of-range": ({"args": {"Input Dims": [[1e400, 2]]}}, True),  # both paths: dims absent
    "scalar-out-of-range": ({"args": {"Python id": 1e400}}, False),  # msgspec refuses the trace
    "skipped-scalar-out-of-range": ({"args": {"Group size": 1e400}}, False),
    "unknown-out-of-range": ({"args": {"foo": [1e400]}, "bar": 1e400}, True),  # skipped unread by both
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_values_outside_the_subset_go_through_msgspec(tmp_path, monkeypatch, variant):
    change, in_subset = VARIANTS[variant]
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 3}", "pid": 7, "tid": 1 + i % 2, "ts": 100.0 + i,
               "dur": 0.5, "args": {"External id": i, "Input Dims": [[2, 3]], "Input type": ["float"]}} for i in range(40)]
    ev = events[25]
    for k, v in change.items():
        if k == "args" and isinstance(v, dict):
            ev["args"].update(v)
        else:
            ev[k] = v
    text = json.dumps({"traceEvents": events}).replace("1e+400", "1e400").replace("Infinity", "1e400").encode()
    path = tmp_path / "v.json"
    path.write_bytes(text)
    doc = text[text.index(b"["):]
    if in_subset:
        _parse(doc)  # no Unsupported
    else:
        with pytest.raises(fastcols.Unsupported):
            _parse(doc)
    try:
        ref = _reference(path)[2]
    except InputError as exc:
        with pytest.raises(InputError) as got:
            load_trace(path)
        assert got.value.reason == exc.reason
        return
    fast = J.stream_trace(path, fast=True)
    if fast is not None:
        _assert_same_trace(fast[2], ref, variant)
    trace, _ = load_trace(path)
    _assert_same_trace(trace, ref, variant, ignore=("metadata", "rank", "time_unit_note"))


@pytest.mark.parametrize("text", [
    b'[{"ph":"X","name":"a\xff"}]',  # invalid UTF-8
    b'[{"ph":"X","name":"a"},]',  # trailing comma
    b'[{"ph":"X","name":"a"} {"ph":"X"}]',  # missing comma
    b'[{"ph":"X","ph":"i"}]',  # duplicate key (msgspec: last wins; not the reader's job)
    b'[{"ph":"X","ts":01}]',  # leading zero
    b'[{"ph":"X","args":{"a":[1,2}}]',  # unbalanced
    b'[{"ph":"X","name":"a\\x"}]',  # bad escape
    b'[{"ph":"X","name":"a"}',  # truncated
])
def test_invalid_or_unusual_json_is_not_accepted(text):
    with pytest.raises(fastcols.Unsupported):
        _parse(text, final=True)


def test_chunk_boundaries_anywhere(shared_traces):
    """feed_events over chunks of 1 to 9 bytes (every cut inside strings, numbers, literals and
    keys) gives the same columns as one feed of the whole array."""
    path = next(p for p in all_trace_files() if "resnet50_num_workers_0" in str(p))
    data = gzip.decompress(path.read_bytes())
    start = data.index(b"[", data.index(b'"traceEvents"'))
    probe = fastcols.raw_parser({}, {}, {}, {})
    pos, _ = probe.feed(data[start:start + 300_000], 1, False)
    body = data[start:start + pos].rstrip().rstrip(b",") + b"]"
    whole = _parse(body)
    assert whole[0] > 100
    rng = random.Random(3)
    for _ in range(3):
        idx = [{}, {}, {}, {}]
        p = fastcols.raw_parser(*idx)
        pieces, pos = [], 1
        while pos < len(body):
            k = rng.randint(1, 9)
            pieces.append(body[pos:pos + k])
            pos += k
        it = iter(pieces)
        got = []
        tail = fastcols.feed_events(p.feed, bytearray(body[:1]), lambda: next(it, None), lambda: got.append(p.take()))
        assert not tail.strip()
        for key in whole[1]:
            merged = b"".join(g[1][key] for g in got)
            assert merged == whole[1][key], key
        for f in whole[2]:
            assert b"".join(g[2][f][0] for g in got) == whole[2][f][0], f
            assert b"".join(g[2][f][1] for g in got) == whole[2][f][1], f
        assert sum(g[0] for g in got) == whole[0]


def test_gzip_trace_and_reader_thread(tmp_path, shared_traces):
    """A trace large enough for the reader thread, gzip-compressed, in both loaders."""
    rng = random.Random(5)
    events = [{"ph": "X", "cat": "kernel", "name": f"k{rng.randint(0, 5000)}", "pid": 0, "tid": 7,
               "ts": 1e15 + i * 3.25 + rng.random(), "dur": rng.random() * 100,
               "args": {"correlation": rng.randint(0, 1 << 40), "stream": 7, "device": 0}} for i in range(60000)]
    text = json.dumps({"traceEvents": events, "deviceProperties": [{"name": "NVIDIA H100"}]}).encode()
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(text, 1))
    assert path.stat().st_size >= J.THREAD_MIN_FILE_BYTES
    fast, slow = J.stream_trace(path, fast=True), J.stream_trace(path, fast=False)
    assert fast[0] == slow[0]
    _assert_same_trace(fast[2], slow[2], "big")


def test_stream_rank_falls_back_to_msgspec_for_a_file_outside_the_subset(tmp_path, monkeypatch):
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0 + i, "dur": 0.5,
               "args": {"correlation": i, "stream": "+7" if i == 5 else 7}} for i in range(50)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 90.0})
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps({"traceEvents": events}).encode())
    seen = []
    real = SL.scan

    def spy(*a, **k):
        seen.append("msgspec")
        return real(*a, **k)

    monkeypatch.setattr(SL, "scan", spy)
    trace, info = stream_rank(path, fast=True)
    assert seen == ["msgspec"] and info.n_events == 51
    ref, _ = stream_rank(path, fast=False)
    _assert_same_trace(trace, ref, "fallback", ignore=("metadata",))


def _mutations(seed: int, n: int):
    """Traces broken or bent at random places (bytes changed, tokens inserted, cut short)."""
    base = json.dumps([
        {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 5}", "pid": 7, "tid": i % 3, "ts": 1e15 + i * 1.25,
         "dur": 0.5 + i, "args": {"External id": i, "Input Dims": [[i, 3], []], "Input type": ["float", ""],
                                  "stream": "0x0" if i % 4 else 3, "bytes": str(i), "Call stack": f"a.py({i}): f"}}
        for i in range(60)] + [{"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "main"}}]).encode()
    tokens = [b'"', b"\\", b"\\u12", b"{", b"}", b"[", b"]", b",", b":", b"-", b"e", b".", b"0", b"9" * 25, b"null",
              b"tru", b"\xff", b"\xed\xa0\x80", b"\x00", b"1e400", b'"0x', b'"ts"', b'"args"', b' ', b'"name":"q"',
              b'"pid":"x"', b'"stream":"12"', b"[" * 300]
    rng = random.Random(seed)
    for _ in range(n):
        d = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(1, len(d))
            op = rng.random()
            if op < 0.3:
                d[pos] = rng.randrange(256)
            elif op < 0.7:
                d[pos:pos] = rng.choice(tokens)
            elif op < 0.9:
                del d[pos:pos + rng.randint(1, 30)]
            else:
                del d[pos:]
        yield bytes(d), rng


def test_mutated_input_parses_as_msgspec_or_is_refused():
    """Differential fuzzing: whatever the compiled reader accepts, msgspec decodes to the same
    columns; it never crashes, and a refusal is Unsupported (the loader then asks msgspec)."""
    from zoomer_ar.load.columns import build_columns
    from zoomer_ar.load.schema import EVENTS_DECODER

    accepted = 0
    for doc, rng in _mutations(11, 400):
        b = fastcols.FastBuilder(0, "fuzz")
        pieces, i = [], 1
        while i < len(doc):
            k = rng.choice([1, 7, 64, 4096])
            pieces.append(doc[i:i + k])
            i += k
        it = iter(pieces)
        try:
            tail = fastcols.feed_events(b.feed, bytearray(doc[:1]), lambda: next(it, None))
        except fastcols.Unsupported:
            continue
        if tail.strip():
            continue  # bytes after the array: the document-level decoder refuses those
        ref = build_columns(EVENTS_DECODER.decode(doc), 0, "fuzz")  # must not raise: the reader accepted it
        _assert_same_trace(b.finish(), ref, repr(doc[:80]), ignore=("path",))
        accepted += 1
    assert accepted >= 20  # some mutations (spaces, a changed digit, a valid token) stay valid


def test_version_names_the_reader_in_use():
    import subprocess
    import sys

    def version(env_extra):
        env = dict(os.environ, **env_extra)
        out = subprocess.run([sys.executable, "-m", "zoomer_ar", "--version"], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "reader: compiled event reader" in version({})
    assert "reader: msgspec + ColumnBuilder (ZOOMER_FAST_JSON=0)" in version({"ZOOMER_FAST_JSON": "0"})
