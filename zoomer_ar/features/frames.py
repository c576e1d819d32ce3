"""Python frames for evidence events: from python_function events (with_stack) or 2021 'Call stack' args."""

from __future__ import annotations

import numpy as np

from ..load.columns import PH_COMPLETE, RankTrace
from ..models import SourceFrame
from .names import is_library_file, normalise_frame_name, parse_frame


class FrameIndex:
    """Finds the Python frames enclosing an event on the same thread (innermost user frames first)."""

    def __init__(self, trace: RankTrace):
        self.trace = trace
        mask = trace.mask_cat("python_function") & (trace.ph == PH_COMPLETE)
        self.idx = np.flatnonzero(mask)
        self.ts = trace.ts[self.idx]
        self.end = self.ts + trace.dur[self.idx]
        self.tid = trace.tid[self.idx]

    @property
    def available(self) -> bool:
        return self.idx.size > 0 or bool(self.trace.call_stack)

    def frames_for(self, i: int, limit: int = 4) -> list[SourceFrame]:
        tr = self.trace
        if i in tr.call_stack:  # 2021 schema: "file(line): func;file(line): func" innermost first
            out = []
            for part in tr.call_stack[i].split(";"):
                parsed = parse_frame(part.strip())
                if parsed and not is_library_file(parsed[0]):
                    out.append(SourceFrame(file=parsed[0], line=parsed[1], function=parsed[2]))
                if len(out) >= limit:
                    break
            return out
        if self.idx.size == 0:
            return []
        t0, t1, tid = tr.ts[i], tr.ts[i] + tr.dur[i], tr.tid[i]
        sel = np.flatnonzero((self.tid == tid) & (self.ts <= t0) & (self.end >= t1))
        if sel.size == 0:
            return []
        # innermost first: the enclosing frame that started last
        sel = sel[np.argsort(-self.ts[sel], kind="stable")]
        out: list[SourceFrame] = []
        for j in sel:
            parsed = parse_frame(normalise_frame_name(tr.names[int(tr.name[self.idx[j]])]))
            if parsed and not is_library_file(parsed[0]):
                out.append(SourceFrame(file=parsed[0], line=parsed[1], function=parsed[2]))
                if len(out) >= limit:
                    break
        return out

    def names_matching(self, needle: str) -> int:
        """How many python_function events' names contain `needle`."""
        codes = self.trace.name_codes(lambda n: needle in n)
        if codes.size == 0 or self.idx.size == 0:
            return 0
        return int(self.trace.has_name_code(self.trace.name[self.idx], codes).sum())
