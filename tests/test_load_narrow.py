"""The loaders keep id columns in the narrowest integer type that holds them and one-value columns
as read-only broadcasts (load/narrow.py): the same values as the wide columns, fewer bytes a row
(the in-memory loader's peak on hta/ns_resolution_trace: 60.6 -> 55.7 MB)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zoomer_ar.load import fastcols
from zoomer_ar.load import job as J
from zoomer_ar.load.narrow import as_constant, narrow, narrow_column

from test_benchmarks_smoke import _assert_same_trace, _reference


@pytest.mark.parametrize(("lo", "hi", "dtype"), [
    (-1, 2**7 - 1, np.int8), (-(2**7), 0, np.int8), (0, 2**7, np.int16), (-(2**7) - 1, 0, np.int16),
    (-1, 2**15 - 1, np.int16), (-(2**15), 5, np.int16), (-1, 2**15, np.int32), (-(2**15) - 1, 0, np.int32),
    (-1, 2**31 - 1, np.int32), (-1, 2**31, np.int64), (-(2**31) - 1, 0, np.int64), (-1, 2**62, np.int64),
])
def test_narrow_picks_the_smallest_type_that_holds_every_value(lo, hi, dtype):
    a = np.array([lo, 0, hi], dtype=np.int64)
    got = narrow(a)
    assert got.dtype == dtype and np.array_equal(got.astype(np.int64), a)


def test_one_value_columns_are_read_only_broadcasts():
    ids = narrow_column(np.full(1000, -1, dtype=np.int64))
    assert ids.strides == (0,) and ids.dtype == np.int8 and (ids == -1).all() and not ids.flags.writeable
    nan = as_constant(np.full(10, np.nan))
    assert nan.strides == (0,) and np.isnan(nan).all()
    varied = np.array([1, 2], dtype=np.int64)
    assert narrow_column(varied).strides != (0,)


def _trace(path, n: int, corr_of) -> None:
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2,
               "ts": 1000.0 + 10 * i, "dur": 2.0, "args": {"correlation": corr_of(i), "External id": i}}
              for i in range(n)]
    path.write_text(json.dumps({"traceEvents": events}))


@pytest.mark.parametrize("fast", [True, False])
def test_chunks_of_different_widths_join_to_the_whole_columns_values(tmp_path, monkeypatch, fast):
    """A chunk whose ids fit int16 and a later one that needs int64 (the compiled reader narrows
    each chunk's part as it comes): the joined column has every value, in the type the
    whole-document loader gives."""
    if fast and not fastcols.available():
        pytest.skip("the compiled event reader is not built in this installation")
    path = tmp_path / "t.json"
    _trace(path, 3000, lambda i: i if i < 1500 else 2**40 + i)
    monkeypatch.setattr(J, "STREAM_READ", 4096)  # many chunks
    monkeypatch.setattr(J, "STREAM_SLICE", 4096)
    got = J.stream_trace(path, fast=fast)
    assert got is not None
    _, _, ref = _reference(path)
    _assert_same_trace(got[2], ref, str(path))
    assert got[2].correlation.dtype == np.int64 and got[2].correlation[-1] == 2**40 + 2999
    assert got[2].external_id.dtype == np.int16
    assert got[2].stream.strides == (0,)  # no stream on any event: one value


def test_a_clone_for_editing_has_wide_writable_columns(tmp_path):
    """synth edits loaded traces (new events with new correlation ids): its copy widens the narrow
    columns (a new id past int16 used to overflow: `corpus build` failed with OverflowError)."""
    from zoomer_ar.synth.augment import clone_trace

    path = tmp_path / "t.json"
    _trace(path, 50, lambda i: i)
    t = J.stream_trace(path)[2]
    assert t.correlation.dtype == np.int8 and t.name.dtype == np.int8 and t.cat.dtype == np.int8
    c = clone_trace(t)
    for f in ("correlation", "stream", "device", "external_id"):
        assert getattr(c, f).dtype == np.int64 and getattr(c, f).flags.writeable, f
    for f in ("cat", "name", "pid", "tid"):  # codes of new names and categories past int8's 127
        assert getattr(c, f).dtype == np.int32 and getattr(c, f).flags.writeable, f
    for f in ("nbytes", "total_allocated"):
        assert getattr(c, f).flags.writeable, f
    c.correlation[0] = 2**40
    c.name[0] = 2**15
    assert t.correlation[0] == 0 and t.name[0] == 0
