"""What every trace command shares: its one-line report (Stats) and the copy of the events a
selection keeps into an output that is removed when the command fails."""

from __future__ import annotations
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np
from . import guard
from .io import TraceWriter, compression_for, write_queue
from .slices import Batch, Plan, read_slices


def human_bytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


@dataclass
class Stats:
    """What an operation did, for its one-line report.

    Byte copies (sample, compress) set `bytes_out` and count no events: they never decode them."""

    events_in: int = 0
    events_out: int = 0
    outputs: list[str] = field(default_factory=list)
    note: str = ""
    bytes_out: int | None = None
    skipped: list[str] = field(default_factory=list)  # "path: reason" of input files that are not traces
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the command did that was not asked (clipping)
    unplaced: int = 0  # events left out because a viewer cannot place them (no ts, pid/tid, X without dur)

    def line(self) -> str:
        outs = ", ".join(self.outputs[:4]) + (f" (+{len(self.outputs) - 4} more)" if len(self.outputs) > 4 else "")
        if self.bytes_out is not None:
            n = len(self.outputs)
            what = f"{n} file{'' if n == 1 else 's'} ({human_bytes(self.bytes_out)})"
        else:
            what = f"{self.events_out:,} of {self.events_in:,} events"
        dropped = (f"; left out {self.unplaced:,} event{'' if self.unplaced == 1 else 's'} without ts, pid/tid, "
                   "(X) dur or (M) name" if self.unplaced else "")
        return f"{what} -> {outs}" + (f"; {self.note}" if self.note else "") + dropped

    def add(self, other: Stats) -> None:
        """Fold the result of one file of a job into the job's."""
        self.events_in += other.events_in
        self.events_out += other.events_out
        self.outputs += other.outputs
        self.warnings += other.warnings
        self.notes += other.notes
        self.unplaced += other.unplaced
        if other.bytes_out is not None:
            self.bytes_out = (self.bytes_out or 0) + other.bytes_out




def write_selected(w: TraceWriter, b: Batch, keep: np.ndarray) -> int:
    if not keep.any():
        return 0
    raws = b.selected(keep)
    w.write_raw(raws)
    return len(raws)


def abort_outputs(writes, exc: BaseException, writers: list) -> None:
    """A command failed with `exc`: a write that failed before it is the error to report (writes.settle
    raises it); the outputs are removed either way."""
    try:
        if writes is not None:
            writes.settle(exc)
    finally:
        for w in writers:
            w.abort()


def copy_with(src: Path, dst: Path, select, *, compression: str | None = None, level: int | None = None,
               check: str = "none", before_close=None, plan: Plan | None = None, skip=None) -> Stats:
    """Copy the events `select(batch, stats)` keeps from src into dst. `check`: read_slices' check
    of the events; `before_close(stats)` may still refuse the result (raise): no output then.
    `plan`, `skip`: the slices `skip(k)` says keep nothing are not decoded (their events are
    counted from the plan)."""
    st = Stats()
    comp = compression_for(dst, compression)
    guard.check_level(comp, level, dst)

    def on_slice(b: Batch) -> None:
        st.events_in += b.n
        st.events_out += write_selected(w, b, select(b, st))

    def on_skip(k: int) -> None:
        st.events_in += plan.counts[k]  # type: ignore[union-attr]
        st.unplaced += plan.unplaced[k]  # type: ignore[union-attr]

    with write_queue(comp != "none") as writes:
        w = TraceWriter(dst, compression=compression, level=level, writes=writes)
        try:
            res = read_slices(src, on_slice, on_head=w.set_head, check=check, replay=plan, skip=skip, on_skip=on_skip)
            if before_close is not None:
                before_close(st)
            w.close(TraceWriter.tail_of(res))
        except BaseException as exc:
            abort_outputs(writes, exc, [w])
            raise
    st.outputs.append(str(dst))
    return st




@contextmanager
def output_folder(folder: Path) -> Iterator[None]:
    """When the command fails, remove its output folder again if the command created it and it is
    empty (a full disk on the first file, or no usable rank, left an empty folder behind). Files
    written completely before the failure stay."""
    existed = folder.exists()
    try:
        yield
    except BaseException:
        if not existed:
            with suppress(OSError):  # not empty: complete outputs stay
                folder.rmdir()
        raise
