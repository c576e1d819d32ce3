"""`trace filter`: keep events by category (across the two Kineto schemas), name, pid, tid or phase."""

from __future__ import annotations
import re
from collections.abc import Iterable
from itertools import compress, repeat
from operator import is_, ne
from pathlib import Path
from typing import Any
import numpy as np
from ..errors import InputError
from . import guard
from .slices import Batch
from .copying import Stats, copy_with
from .recode import refuse_no_events


#: Category names that mean the same events in the two Kineto schemas: today's (`cpu_op`, `kernel`,
#: ...) and the 2021 tb_plugin one (`Operator`, `Kernel`, ...). `--cat`/`--exclude-cat` select a
#: whole group, so one command works on traces of either schema. Keys are lower case: names are
#: compared without regard to case, then through this table (case alone does not make `Runtime`
#: match `cuda_runtime`).
CATEGORY_EQUIVALENTS: dict[str, str] = {
    "operator": "cpu_op",
    "kernel": "kernel",
    "runtime": "cuda_runtime",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
}


def canonical_category(cat: str) -> str:
    """The schema-independent name of a category (see CATEGORY_EQUIVALENTS), for matching only."""
    low = cat.lower()
    return CATEGORY_EQUIVALENTS.get(low, low)




def filter_trace(src: Path, dst: Path, *, cats: Iterable[str] = (), exclude_cats: Iterable[str] = (),
                 name: str | None = None, exclude_name: str | None = None, pids: Iterable[str] = (),
                 tids: Iterable[str] = (), phases: Iterable[str] = (),
                 compression: str | None = None, level: int | None = None) -> Stats:
    """Keep events by category, name (regular expression), pid, tid or phase; metadata always.

    Categories match across schemas (CATEGORY_EQUIVALENTS: `--cat kernel` keeps 2021 `Kernel`
    events too). A filter that would keep nothing but metadata is refused (InputError naming the
    categories present, nothing written), as is a trace without events or with only metadata: such an
    output is one `trace check` and `analyze` refuse.
    Every event is held to `trace check`'s rules (read_events(check="all")): the events are copied
    verbatim, so one the check refuses would make the output invalid; the file is refused instead."""
    cats = {canonical_category(c) for c in cats}
    exclude_cats = {canonical_category(c) for c in exclude_cats}
    pids, tids, phases = {str(p) for p in pids}, {str(t) for t in tids}, set(phases)
    name_re = compile_pattern(name, "--name")
    exclude_re = compile_pattern(exclude_name, "--exclude-name")
    memo: dict[Any, bool] = {}
    seen_cats: set[str] = set()
    kept = [0, 0]  # non-metadata events: seen, kept

    # The decision depends on the fields the filters look at: memo by those alone (the category,
    # and the name, phase, pid, tid where a filter names them).
    fields = ["cat"] + (["name"] if name_re is not None or exclude_re is not None else []) + \
        (["ph"] if phases else []) + (["pid"] if pids else []) + (["tid"] if tids else [])

    def decide(key: Any) -> bool:
        """Whether a non-metadata event with these values of `fields` passes the filters."""
        v = dict(zip(fields, key)) if len(fields) > 1 else {"cat": key}
        seen_cats.add(v["cat"])
        cat = canonical_category(v["cat"])
        return bool((not cats or cat in cats) and cat not in exclude_cats
                    and (not phases or v["ph"] in phases)
                    and (not pids or str(v["pid"]) in pids) and (not tids or str(v["tid"]) in tids)
                    and (name_re is None or name_re.search(v["name"]) is not None)
                    and (exclude_re is None or exclude_re.search(v["name"]) is None))

    def select(b: Batch, st: Stats) -> np.ndarray:
        n = b.n
        phs = b.column("ph")
        keys = b.column("cat") if len(fields) == 1 else list(zip(*(b.column(f) for f in fields)))
        vals = list(map(memo.get, keys))  # None: not decided yet, or metadata (always kept)
        if None in vals:
            for i in compress(range(n), map(is_, vals, repeat(None))):
                if phs[i] == "M":
                    vals[i] = True
                    continue
                key = keys[i]
                v = memo.get(key)  # decided by an earlier event of this slice
                if v is None:
                    v = decide(key)
                    if len(memo) < 200_000:
                        memo[key] = v
                vals[i] = v
        other = np.fromiter(map(ne, phs, repeat("M")), dtype=bool, count=n)
        keep = np.fromiter(vals, dtype=bool, count=n)
        if not other.all():  # a metadata event whose values a filtered-out event shares
            keep |= ~other
        kept[0] += int(other.sum())
        kept[1] += int((keep & other).sum())
        return keep

    def nothing_kept(st: Stats) -> None:
        refuse_no_events(src, st.events_in, bool(kept[0]))
        if not kept[1]:
            raise InputError(str(src), _nothing_kept(seen_cats))

    guard.require_file(src)
    guard.check_file_output(dst, [src])
    guard.check_suffix(dst, compression)
    return copy_with(src, dst, select, compression=compression, level=level, check="all", before_close=nothing_kept)


def compile_pattern(pattern: str | None, option: str) -> re.Pattern | None:
    """The regular expression of --name / --exclude-name; InputError (exit 2, one line) when it is
    not one, before anything is read or written."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InputError(None, f"{option} {pattern!r}: not a valid regular expression ({exc})") from None


def _nothing_kept(seen_cats: set[str]) -> str:
    """Why a filter wrote nothing, with what would help to choose another: the trace's categories."""
    named = sorted(c for c in seen_cats if c)
    have = ", ".join(named) + (", (no category)" if "" in seen_cats else "") if seen_cats else "none"
    return f"the filter kept no event besides metadata (categories in this trace: {have}); nothing written"
