"""Annotated trace: the original trace plus markers at each finding's worst events.

`zoomer-ar analyze TRACE --annotate OUT.json.gz` copies the trace (streaming, events verbatim)
and appends, on a track of its own (pid "zoomer", named "Zoomer AR findings", one thread per
finding), for every evidence event of every finding:

- an instant event (`ph: i`) at the evidence time, named `<pattern>: <event>`, whose args carry
  the finding (title, severity, impact per step, recommendation) and the evidence details;
- a complete event (`ph: X`) spanning the evidence duration on the same track, clipped to the
  rank's profiled window (so the annotated trace analyses to the same features as the original);
- when the evidence is a real event of the trace (matched by name, time and duration), a flow
  arrow (`ph: s` on the marker, `ph: f` bound to the event) from the marker to that event.

Evidence times are milliseconds from the rank's first complete event (EvidenceEvent.ts_ms); the
copy pass measures that first event (and whether timestamps are nanoseconds) as the loader does,
and the markers are appended after the original events. A job of several rank files is written
as one merged trace (pids of rank r become r * 10^7 + pid, as `zoomer-ar trace merge` does) when
OUT is a file, or as one annotated copy per file when OUT is a folder (no .json/.gz suffix; a single
trace too: OUT/<its name>): a merged trace among them is copied once with each of its ranks' markers. Open the result in
Perfetto (ui.perfetto.dev) or chrome://tracing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .errors import InputError
from .load.merged import MARKER_PID, PID_STRIDE, RankOwners, merged_dist
from .models import Analysis, EvidenceEvent, Finding
from .stream.nscount import NsCounter
from .stream.scan import ScanResult, scan
from .stream.source import StreamError
from .surgery.io import Lite, TraceWriter, decode_top, encode_head, read_events
from .surgery.guard import refuse_overwrite
from .surgery.merge import remap_rank

ZOOMER_PID = MARKER_PID  # the markers' track; a merged trace's loader leaves it out of every rank
ZOOMER_CAT = "zoomer"
_MATCH_TOL_MS = 2e-3


@dataclass
class Marker:
    finding: int  # index in analysis.findings
    event: EvidenceEvent
    ts: float = 0.0  # absolute, trace units
    dur: float = 0.0
    bound: tuple[Any, Any, float] | None = None  # (pid, tid, ts) of the matched trace event


@dataclass
class AnnotateReport:
    outputs: list[str] = field(default_factory=list)
    markers: int = 0
    bound: int = 0

    def line(self) -> str:
        return (f"annotated trace: {', '.join(self.outputs)} ({self.markers} markers, {self.bound} linked to their "
                "events)")


class _RankPass:
    """What the copy pass of one rank file measures: first event, unit, end, candidate matches."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.ns = NsCounter()
        self.t0 = np.inf
        self.t1 = -np.inf
        self.candidates: dict[str, list[tuple[float, float, Any, Any]]] = {}

    def see(self, lite: list[Lite]) -> None:
        xs = [e for e in lite if e.ph == "X"]
        if xs:
            ts = np.fromiter((e.ts for e in xs), dtype=np.float64, count=len(xs))
            self.ns.add(ts)
            span = np.fromiter((e.cat != "Trace" for e in xs), dtype=bool, count=len(xs))
            if span.any():
                dur = np.fromiter((e.dur for e in xs), dtype=np.float64, count=len(xs))
                self.t0 = min(self.t0, float(ts[span].min()))
                self.t1 = max(self.t1, float((ts + dur)[span].max()))
        if self.names:
            for e in lite:
                if e.name[:300] in self.names and e.ph in ("X", "i", "I"):
                    self.candidates.setdefault(e.name[:300], []).append((float(e.ts), float(e.dur or 0), e.pid, e.tid))


def _evidence_by_rank(analysis: Analysis) -> dict[int, list[Marker]]:
    out: dict[int, list[Marker]] = {}
    for k, f in enumerate(analysis.findings):
        for ev in f.evidence.events:
            if ev.category == "rank":  # a per-rank aggregate (compute per step): no place in time to mark
                continue
            out.setdefault(int(ev.rank), []).append(Marker(finding=k, event=ev))
    return out


def _place(markers: list[Marker], rp: _RankPass) -> None:
    """Absolute times of the markers, and the trace event each one points at (if any)."""
    if not np.isfinite(rp.t0):
        return
    ns = rp.ns.nanoseconds()
    unit = 1e6 if ns else 1e3  # trace units per millisecond
    scale = 1000.0 if ns else 1.0
    t0c = rp.t0 / scale
    for m in markers:
        ev = m.event
        m.ts = rp.t0 + ev.ts_ms * unit
        m.dur = max(0.0, ev.dur_ms * unit)
        best = None
        for ts, dur, pid, tid in rp.candidates.get(ev.name[:300], ()):
            rel = (ts / scale - t0c) / 1000.0
            if abs(rel - ev.ts_ms) <= _MATCH_TOL_MS and abs(dur / scale / 1000.0 - ev.dur_ms) <= _MATCH_TOL_MS:
                err = abs(rel - ev.ts_ms)
                if best is None or err < best[0]:
                    best = (err, pid, tid, ts)
        if best is not None:
            m.ts = best[3]
            m.bound = (best[1], best[2], best[3])


def _finding_args(f: Finding) -> dict[str, Any]:
    return {
        "pattern": f.pattern, "title": f.title, "severity": f.severity,
        "impact_ms_per_step": round(f.impact.ms_per_step, 4), "impact_pct_of_step": round(f.impact.pct_of_step, 3),
        "recommendation": f.recommendation[:500],
    }


def _marker_events(analysis: Analysis, markers: list[Marker], t0: float, t1: float, pid_of, flow_base: int,
                   with_meta: bool) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    if with_meta:
        events.append({"ph": "M", "name": "process_name", "pid": ZOOMER_PID, "tid": 0,
                       "args": {"name": "Zoomer AR findings"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": ZOOMER_PID, "tid": 0, "args": {"sort_index": -1}})
        for k, f in enumerate(analysis.findings):
            events.append({"ph": "M", "name": "thread_name", "pid": ZOOMER_PID, "tid": k + 1,
                           "args": {"name": f"{f.severity} {f.pattern}: {f.title}"[:200]}})
    flow_id = flow_base
    for m in markers:
        f = analysis.findings[m.finding]
        ev = m.event
        name = f"{f.pattern}: {ev.name}"[:300]
        args = _finding_args(f) | {
            "evidence": ev.name[:300], "rank": ev.rank, "ts_ms": ev.ts_ms, "dur_ms": ev.dur_ms,
            "category": ev.category, "detail": ev.detail,
            "frames": [f"{fr.file}:{fr.line} {fr.function}" for fr in ev.frames][:4],
        }
        tid = m.finding + 1
        events.append({"ph": "i", "s": "t", "name": name, "cat": ZOOMER_CAT, "pid": ZOOMER_PID, "tid": tid,
                       "ts": m.ts, "args": args})
        a, b = max(m.ts, t0), min(m.ts + m.dur, t1)
        if b > a:
            events.append({"ph": "X", "name": name, "cat": ZOOMER_CAT, "pid": ZOOMER_PID, "tid": tid, "ts": a,
                           "dur": b - a, "args": args})
        if m.bound is not None:
            flow_id += 1
            pid, btid, bts = m.bound
            events.append({"ph": "s", "id": flow_id, "name": "zoomer evidence", "cat": ZOOMER_CAT, "pid": ZOOMER_PID,
                           "tid": tid, "ts": m.ts})
            events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "zoomer evidence", "cat": ZOOMER_CAT,
                           "pid": pid_of(pid), "tid": btid, "ts": bts})
    return events


FLOW_BASE = 1 << 52  # marker flow ids: far above Kineto's, below 2**53 (JavaScript viewers)


def is_file_output(out: Path) -> bool:
    """OUT names a file (a .json/.gz/.zst name) rather than a folder for one annotated copy per file."""
    return out.name.lower().endswith((".json", ".gz", ".zst", ".zstd"))


def annotate_targets(out: Path, inputs: list[Path]) -> list[Path]:
    """The files `annotate` writes for a job read from `inputs` (its rank files): OUT, or one copy per
    input file in the folder OUT."""
    return [out] if is_file_output(out) else [out / p.name for p in inputs]


def refuse_own_inputs(out: Path, inputs: list[Path]) -> None:
    """None of the files `annotate` writes may be one of the job's trace files, under any name (a rank
    folder of symbolic links to the files in OUT, a hard link): each is written to a temporary file
    renamed over its target, which would replace the original with its annotated copy."""
    for target in annotate_targets(out, inputs):
        refuse_overwrite(target, inputs)


def annotate(analysis: Analysis, out: str | Path) -> AnnotateReport:
    """Write the annotated trace(s) of an analysed job; see the module docstring."""
    out = Path(out)
    ranks = sorted(((r.rank, Path(r.path)) for r in analysis.job.ranks), key=lambda t: t[0])
    refuse_own_inputs(out, list(dict.fromkeys(p for _, p in ranks)))
    by_rank = _evidence_by_rank(analysis)
    report = AnnotateReport()
    is_file = is_file_output(out)
    files: dict[Path, list[int]] = {}  # each file's ranks: several for a merged trace, analysed as its ranks
    for rank, path in ranks:
        files.setdefault(path, []).append(rank)
    if len(files) == 1 or not is_file:
        for path, held in files.items():
            target = out if is_file else out / path.name
            if len(held) == 1:
                markers = by_rank.get(held[0], [])
                groups = {held[0]: (markers, _RankPass({m.event.name[:300] for m in markers}), FLOW_BASE)}
                report.markers += _annotate_one(analysis, path, target, groups, report)
            else:
                groups = {r: (m := by_rank.get(r, []), _RankPass({x.event.name[:300] for x in m}),
                              FLOW_BASE + r * 1_000_000) for r in held}  # flow ids as in a merged annotation of the rank files
                report.markers += _annotate_one(analysis, path, target, groups, report, merged=held)
            report.outputs.append(str(target))
        return report
    if len(files) != len(ranks):
        raise InputError(analysis.job.path, "cannot annotate a job that mixes a merged trace with other rank files into "
                                            "one file: give a folder (one annotated copy per file)")
    report.markers += _annotate_merged(analysis, ranks, out, by_rank, report)
    report.outputs.append(str(out))
    return report


def _annotate_one(analysis: Analysis, path: Path, target: Path, groups: dict[int, tuple[list[Marker], _RankPass, int]],
                  report: AnnotateReport, merged: list[int] | None = None) -> int:
    """Copy one trace file with the markers of the ranks it holds: rank -> (markers, pass, first flow id),
    several ranks for a merged trace (`merged`: its ranks), whose events each go to their rank's pass."""
    w = TraceWriter(target)
    owner = RankOwners(merged) if merged is not None else None
    holder: dict[str, ScanResult] = {}

    def on_head(res: ScanResult) -> None:
        holder["res"] = res
        w.set_head(res)

    def on_slice(raws: list, lite: list[Lite]) -> None:
        if merged is None:
            for _, rp, _ in groups.values():
                rp.see(lite)
        else:
            by_owner: dict[int | None, list[Lite]] = {}
            for e in lite:
                by_owner.setdefault(owner(e.pid), []).append(e)
            for r, events in by_owner.items():
                if r in groups:
                    groups[r][1].see(events)
        w.write_raw(raws)

    try:
        res = read_events(path, on_slice, on_head=on_head)
        for i, (markers, rp, flow_base) in enumerate(groups.values()):
            _place(markers, rp)
            t1 = rp.t1 if np.isfinite(rp.t1) else rp.t0
            w.write_objects(_marker_events(analysis, markers, rp.t0, t1, lambda p: p, flow_base, i == 0))
        w.close(TraceWriter.tail_of(res))
    except BaseException:
        w.abort()
        raise
    report.bound += sum(1 for markers, _, _ in groups.values() for m in markers if m.bound is not None)
    return sum(len(markers) for markers, _, _ in groups.values())


def _annotate_merged(analysis: Analysis, ranks: list[tuple[int, Path]], target: Path, by_rank: dict[int, list[Marker]],
                     report: AnnotateReport) -> int:
    first = ranks[0][1]
    res0 = scan(first, lambda v: None, hash=False)
    top = decode_top(res0.head, res0.tail)
    top["distributedInfo"] = merged_dist(top.get("distributedInfo"), [r for r, _ in ranks], analysis.job.world_size)
    head, tail = encode_head(top)
    w = TraceWriter(target, head=head, tail=tail)
    decoder = msgspec.json.Decoder(list[dict])
    lite_decoder = msgspec.json.Decoder(list[Lite])
    total = 0
    try:
        for n, (rank, path) in enumerate(ranks):
            markers = by_rank.get(rank, [])
            rp = _RankPass({m.event.name[:300] for m in markers})

            def consume(view, rank=rank, rp=rp) -> None:
                events = decoder.decode(view)
                rp.see(lite_decoder.decode(view))
                w.write_objects(remap_rank(events, rank))

            try:
                scan(path, consume, hash=False)
            except StreamError as exc:
                raise ValueError(f"{path}: cannot stream this trace: {exc}") from None
            _place(markers, rp)

            def pid_of(p, rank=rank):
                if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < PID_STRIDE:
                    return rank * PID_STRIDE + p
                return f"rank{rank}:{p}"

            t1 = rp.t1 if np.isfinite(rp.t1) else rp.t0
            w.write_objects(_marker_events(analysis, markers, rp.t0, t1, pid_of, FLOW_BASE + rank * 1_000_000,
                                           n == 0))
            report.bound += sum(1 for m in markers if m.bound is not None)
            total += len(markers)
        w.close()
    except BaseException:
        w.abort()
        raise
    return total
