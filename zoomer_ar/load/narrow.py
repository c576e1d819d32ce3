"""Narrow column dtypes: the smallest integer type that holds every value, one-value columns as
read-only broadcasts. The same values for every read, fewer bytes per row: the in-memory loader
(`columns.trace_from_columns`, `fastcols.FastBuilder`) and the streaming path (`stream/parts.py`,
`stream/compact.py`) keep their columns this way: the code columns (`cat`, `name`, `pid`, `tid`)
and the ids (`correlation`, `stream`, `device`, `external_id`) in int8 where every value fits (a
trace's categories, threads, streams and devices nearly always do), else int16, else int32.

What that asks of the code that reads them (NumPy 2 keeps the array's type against a Python int):
the values are compared (`==`, `np.isin`, `np.searchsorted`, `np.unique`, used as indices or
lookup positions), never computed with. A comparison with any Python int is exact, in range or
not (`int8_column == 300` is all False); arithmetic is not (`column + 100` wraps in int8,
`column + 200` raises OverflowError, `np.where(mask, column, 1000)` wraps), nor is writing a value
the type cannot hold. Code that computes with a column or writes new ids or codes into it widens
a copy first (`synth.augment.clone_trace`, `stream.prune._codes_of`)."""

from __future__ import annotations

import numpy as np

CODE_COLUMNS = ("cat", "name", "pid", "tid")  # positions in the trace's tables (names, cats, pid/tid values)
NARROW_INT_COLUMNS = CODE_COLUMNS + ("correlation", "stream", "device", "external_id")
CONSTANT_COLUMNS = ("stream", "device", "external_id", "correlation", "nbytes", "total_allocated")


def _int_type(lo: int, hi: int, a: np.ndarray) -> np.dtype:
    if -(2**7) <= lo and hi < 2**7:
        return np.dtype(np.int8)
    if -(2**15) <= lo and hi < 2**15:
        return np.dtype(np.int16)
    if a.dtype.itemsize > 4 and -(2**31) <= lo and hi < 2**31:
        return np.dtype(np.int32)
    return a.dtype


def narrow(a: np.ndarray) -> np.ndarray:
    """An integer column as int8/int16/int32 when every value fits (see the module's note on what
    that asks of the code that reads it)."""
    if a.size == 0:
        return a.astype(np.int8)
    if a.dtype.kind != "i" or a.dtype.itemsize == 1:
        return a
    dt = _int_type(int(a.min()), int(a.max()), a)
    return a if dt == a.dtype else a.astype(dt)


def as_constant(a: np.ndarray) -> np.ndarray:
    """A column (or a slice's part of one) that holds one value, e.g. NaN `total_allocated`
    without [memory] events or INT_NONE 2021-schema ids, as a read-only broadcast of that value:
    the same values for every read, no bytes per row; any other array as it is."""
    if a.size < 2 or a.strides == (0,):
        return a
    v = a[0]
    same = bool(np.isnan(a).all()) if a.dtype.kind == "f" and v != v else bool((a == v).all())
    return np.broadcast_to(a[:1].copy(), a.shape) if same else a


def concat_parts(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate (parts of different widths join in the widest), except that broadcast parts
    of one value stay a broadcast."""
    if not any(p.size for p in parts):
        return np.concatenate(parts)
    parts = [p for p in parts if p.size]
    kind = parts[0].dtype.kind
    if all(p.ndim == 1 and (p.strides == (0,) or p.size == 1) and p.dtype.kind == kind for p in parts) \
            and any(p.strides == (0,) for p in parts):
        v = parts[0][0]
        nan = kind == "f" and v != v
        if all((p[0] != p[0]) if nan else (p[0] == v) for p in parts):
            dt = np.result_type(*parts)
            return np.broadcast_to(parts[0][:1].astype(dt), (sum(p.shape[0] for p in parts),))
    return np.concatenate(parts)


def narrow_column(a: np.ndarray) -> np.ndarray:
    """narrow, then as_constant (one min and one max decide both): how the loaders keep an id column."""
    if a.size < 2 or a.strides == (0,) or a.dtype.kind != "i":
        return as_constant(narrow(a))
    lo, hi = int(a.min()), int(a.max())
    dt = _int_type(lo, hi, a)
    if lo == hi:
        return np.broadcast_to(np.array([lo], dtype=dt), a.shape)
    return a if dt == a.dtype else a.astype(dt)
