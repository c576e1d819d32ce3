"""Column parts of the rows a streaming pass keeps: narrow dtypes, one-value columns as broadcasts,
parts joined in blocks, categorical codes shared across slices."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np

from ..load.columns import RankTrace, _int_column
from ..load.narrow import CODE_COLUMNS, CONSTANT_COLUMNS, as_constant, concat_parts, narrow, narrow_column


def f32_if_exact(a: np.ndarray) -> np.ndarray:
    """float32 when every value (NaN included) survives the round trip; features only compare and
    print these byte counts, and a float32 holding the same value compares and prints the same."""
    b = a.astype(np.float32)
    return b if np.array_equal(b.astype(np.float64), a, equal_nan=True) else a


# columns that are one value on most rows of most traces: a part where every row has it is a broadcast
SPARSE_COLS = ("total_allocated", "ext21", "nbytes")
# integer columns narrowed again when parts join into a block (a part keeps its reader's type: int32
# codes, int16 defaults): codes as the narrowest type, ids a broadcast too where the block has one value
BLOCK_CODES = CODE_COLUMNS
BLOCK_IDS = ("correlation", "stream", "device", "ext", "ext21")


def constant_columns(t: RankTrace) -> list[str]:
    """Replace columns that hold a single value (e.g. `total_allocated` without [memory] events)
    by a read-only broadcast of that value: same values for every read, no memory per row."""
    done = []
    for f in CONSTANT_COLUMNS:
        a = getattr(t, f)
        b = as_constant(a)
        if b is not a:
            setattr(t, f, b)
            done.append(f)
    return done


def codes_into(index: dict, values: list) -> np.ndarray:
    """Categorical codes shared across slices, first-seen order (as load.columns._code_into).

    One lookup per value when every value is known already (the usual case after a few slices)."""
    n = len(values)
    try:
        return np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=n)
    except KeyError:
        setdefault = index.setdefault
        for v in dict.fromkeys(values):
            setdefault(v, len(index))
        return np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=n)


def int_of(getter, objs: list) -> np.ndarray:
    """load.columns._int_column over getter(objs), at C speed when numpy takes every value."""
    try:
        return np.fromiter(map(getter, objs), dtype=np.int64, count=len(objs))
    except (TypeError, ValueError, OverflowError):
        return _int_column(list(map(getter, objs)))


def take_list(seq: list, idx: list[int]) -> list:
    if not idx:
        return []
    if len(idx) == 1:
        return [seq[idx[0]]]
    return list(itemgetter(*idx)(seq))


class ColumnParts:
    """Column parts of kept events (one dict of arrays per slice) and their sparse values."""

    FIELDS = ("ts", "dur", "ph", "cat", "name", "pid", "tid", "correlation", "stream", "device", "ext", "ext21",
              "nbytes", "total_allocated", "ordinal")

    CONSOLIDATE = 32  # slices' parts merged into one block: few large arrays, no heap fragmentation

    def __init__(self, ordinals: bool) -> None:
        self.ordinals = ordinals  # main rows are in file order; only the extra block needs ordinals
        self.blocks: list[dict[str, np.ndarray]] = []
        self.parts: list[dict[str, np.ndarray]] = []
        self.n = 0
        self.input_dims: dict[int, Any] = {}
        self.input_type: dict[int, Any] = {}
        self.call_stack: dict[int, str] = {}

    def append(self, cols: dict[str, np.ndarray]) -> None:
        if not self.ordinals:
            cols.pop("ordinal", None)
        for f in SPARSE_COLS:
            if f in cols:
                cols[f] = as_constant(cols[f])
        self.parts.append(cols)
        self.n += int(cols["ts"].shape[0])
        if len(self.parts) >= self.CONSOLIDATE:
            parts, self.parts = self.parts, []
            block = {f: concat_parts([p.pop(f) for p in parts]) for f in list(parts[0])}
            for f in BLOCK_CODES + BLOCK_IDS:
                if f in block:
                    block[f] = (narrow if f in BLOCK_CODES else narrow_column)(block[f])
            self.blocks.append(block)

    def pop_column(self, f: str) -> list[np.ndarray]:
        return [b.pop(f) for b in self.blocks] + [p.pop(f) for p in self.parts]

    def column(self, f: str) -> np.ndarray:
        arrs = [b[f] for b in self.blocks] + [p[f] for p in self.parts]
        return concat_parts(arrs) if arrs else np.empty(0)

    def clear(self) -> None:
        self.blocks, self.parts = [], []
