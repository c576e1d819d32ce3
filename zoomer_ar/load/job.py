"""Load a trace file or a folder of per-rank trace files into one Job."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from ..errors import InputError
from ..models import JobInfo, RankInfo, SkippedFile
from .columns import PH_COMPLETE, PH_INSTANT, RankTrace, build_columns
from .reader import DEFAULT_MAX_BYTES, Progress, read_trace_bytes
from .schema import TRACE_DECODER, RawTrace

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
_RANK_PATTERNS = (
    re.compile(r"rank[-_]?(\d+)", re.I),
    re.compile(r"worker[-_]?(\d+)", re.I),
    re.compile(r"(?:^|[-_.])r(\d+)(?:[-_.]|$)", re.I),
)
_GPU_CATS_2021 = {"Kernel", "Runtime", "Memcpy", "Memset", "Operator"}


@dataclass
class Job:
    """All ranks of one job, ready for feature extraction."""

    info: JobInfo
    ranks: list[RankTrace] = field(default_factory=list)


def rank_from_name(path: Path) -> int | None:
    for pattern in _RANK_PATTERNS:
        m = pattern.search(path.name)
        if m:
            return int(m.group(1))
    return None


def _describe_non_trace(data: bytes) -> str | None:
    """A one-line reason why a JSON document is not a Kineto trace (only called on the error path)."""
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        return f"not valid JSON ({exc})"
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return None  # a trace whose events have wrong field types
    if isinstance(doc, list) and all(isinstance(e, dict) for e in doc[:100]) and doc:
        return None
    if isinstance(doc, dict):
        if "nodes" in doc and "traceEvents" not in doc:
            return "not a Kineto trace: this is a PyTorch execution trace (has 'nodes', no 'traceEvents')"
        if "traceEvents" not in doc:
            keys = ", ".join(list(doc)[:5]) or "none"
            return f"not a Kineto trace: no 'traceEvents' (top-level keys: {keys})"
    if isinstance(doc, list):
        if doc and isinstance(doc[0], list):
            return "not a Kineto trace: a JSON array of arrays (looks like a memory-timeline export)"
        return "not a Kineto trace: a JSON array whose items are not trace events"
    return f"not a Kineto trace: top-level JSON {type(doc).__name__}"


def decode_trace(data: bytes, path: str) -> RawTrace:
    try:
        doc = TRACE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        reason = _describe_non_trace(data)
        if reason is not None:
            raise InputError(path, reason) from None
        raise InputError(path, f"malformed trace: {exc}") from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "truncated" in msg.lower():
            raise InputError(path, f"truncated JSON ({msg})") from None
        raise InputError(path, f"not valid JSON ({msg})") from None
    if isinstance(doc, list):
        doc = RawTrace(traceEvents=doc)
    return doc


def _accelerator(trace: RankTrace, devices: list[str]) -> str:
    cats = set(trace.cats)
    if any(c.startswith("mtia") for c in cats):
        return "mtia"
    names_blob = " ".join(devices).lower()
    has_gpu_events = bool(cats & {"kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
    if "amd" in names_blob or "instinct" in names_blob or "radeon" in names_blob:
        return "amd"
    if any(n.startswith("hip") for n in trace.names[:5000]) and has_gpu_events:
        return "amd"
    if has_gpu_events or "nvidia" in names_blob or "tesla" in names_blob:
        return "nvidia"
    return "none"


def _schema(trace: RankTrace) -> str:
    cats = set(trace.cats)
    if cats & _GPU_CATS_2021:
        return "2021"
    if cats & {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "mtia_ccp_events", "mtia_runtime"}:
        return "current"
    if cats & {"cpu_op", "user_annotation", "python_function"}:
        return "cpu-only"
    return "unknown"


def load_trace(
    path: Path, *, rank_hint: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES, progress: Progress | None = None
) -> tuple[RankTrace, RankInfo]:
    data = read_trace_bytes(path, max_bytes=max_bytes, progress=progress)
    sha = hashlib.sha256(data).hexdigest()
    doc = decode_trace(data, str(path))
    del data
    events = doc.traceEvents
    if not events:
        raise InputError(str(path), "trace has no events ('traceEvents' is empty)")
    dist = doc.distributedInfo or {}
    rank_source = "default"
    rank = 0
    if isinstance(dist.get("rank"), int):
        rank, rank_source = int(dist["rank"]), "distributedInfo"
    elif rank_hint is not None:
        rank, rank_source = rank_hint, "file name"
    elif (r := rank_from_name(path)) is not None:
        rank, rank_source = r, "file name"
    trace = build_columns(events, rank, str(path))
    del events, doc.traceEvents
    useful = (trace.ph == PH_COMPLETE) | (trace.ph == PH_INSTANT)
    if not useful.any():
        raise InputError(str(path), "not a Kineto trace: no complete ('X') or instant events")
    # Nanosecond timestamps: epoch microseconds today are ~1.7e15; nanoseconds are ~1.7e18.
    xs = trace.ts[trace.ph == PH_COMPLETE]
    if xs.size and float(np.median(xs)) > 1e17:
        trace.ts = trace.ts / 1000.0
        trace.dur = trace.dur / 1000.0
        trace.time_unit_note = "timestamps were nanoseconds; converted to microseconds"
    devices = [str(d.get("name", "")) for d in (doc.deviceProperties or []) if isinstance(d, dict)]
    trace.metadata = {
        "distributedInfo": {k: v for k, v in dist.items() if k != "pg_config"},
        "devices": devices,
        "baseTimeNanoseconds": doc.baseTimeNanoseconds,
    }
    world = dist.get("world_size")
    info = RankInfo(
        path=str(path),
        rank=rank,
        rank_source=rank_source,
        sha256=sha,
        size_bytes=path.stat().st_size,
        n_events=len(trace),
        trace_schema=_schema(trace),
        devices=sorted(set(devices)),
        accelerator=_accelerator(trace, devices),
        world_size=int(world) if isinstance(world, int) else None,
        backend=str(dist["backend"]) if dist.get("backend") else None,
    )
    return trace, info


def is_trace_file(p: Path) -> bool:
    n = p.name.lower()
    return p.is_file() and (n.endswith(".json") or n.endswith(".json.gz") or n.endswith(".gz"))


def load_job(
    path: str | Path,
    *,
    name: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress_factory: Callable[[Path], Progress | None] | None = None,
) -> Job:
    """Load a single trace file, or a folder of per-rank files analysed as one job.

    In a folder, files that fail to load are skipped and reported; if none loads, InputError.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(str(p), "no such file or directory")
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if is_trace_file(f) and not f.name.startswith("."))
        files = [f for f in files if f.name != "job.json"]
        if not files:
            raise InputError(str(p), "folder holds no trace files (*.json, *.json.gz)")
    else:
        files = [p]
    ranks: list[RankTrace] = []
    infos: list[RankInfo] = []
    skipped: list[SkippedFile] = []
    for f in files:
        try:
            trace, info = load_trace(
                f, max_bytes=max_bytes, progress=progress_factory(f) if progress_factory else None
            )
        except InputError as exc:
            if not p.is_dir():
                raise
            skipped.append(SkippedFile(path=str(f), reason=exc.reason))
            continue
        ranks.append(trace)
        infos.append(info)
    if not ranks:
        reasons = "; ".join(f"{Path(s.path).name}: {s.reason}" for s in skipped[:3])
        raise InputError(str(p), f"no usable trace in folder ({reasons})")
    # In a folder, ranks must be distinct: fall back to file-name ranks, then to order.
    if len({r.rank for r in ranks}) != len(ranks):
        for i, (trace, info) in enumerate(zip(ranks, infos)):
            r = rank_from_name(Path(info.path))
            trace.rank = r if r is not None else i
            info.rank, info.rank_source = trace.rank, "file name" if r is not None else "default"
        if len({r.rank for r in ranks}) != len(ranks):
            for i, (trace, info) in enumerate(zip(ranks, infos)):
                trace.rank, info.rank, info.rank_source = i, i, "default"
    order = sorted(range(len(ranks)), key=lambda i: ranks[i].rank)
    ranks = [ranks[i] for i in order]
    infos = [infos[i] for i in order]
    world = max([i.world_size or 0 for i in infos] + [len(ranks)])
    info = JobInfo(
        name=name or (p.name if p.is_dir() else p.name.split(".")[0]),
        path=str(p),
        ranks=infos,
        skipped=skipped,
        world_size=world,
    )
    return Job(info=info, ranks=ranks)
