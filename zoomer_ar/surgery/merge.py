"""`trace merge`: per-rank files into one trace, each rank on its own tracks (pids and ids offset by
rank, as zoomer_ar.load.merged splits them again)."""

from __future__ import annotations
from pathlib import Path
from typing import Any
import msgspec
from ..errors import InputError
from ..load.job import rank_files as folder_rank_files
from ..load.job import no_traces_reason
from ..load.merged import ID_SHIFT, PID_STRIDE, merged_dist
from ..stream.scan import scan
from ..stream.source import BadJSON, StreamError, is_trace_file
from . import guard
from .io import TOO_DEEP, TraceWriter, compression_for, decode_top, encode_head, write_queue
from . import slices
from .validate import ONLY_METADATA, _valid_slice, event_problems, refuse_wrong_types
from .copying import Stats, abort_outputs
from .jobs import job_folder, rank_files, refuse_merged, refuse_same_rank


_ID_ARGS = ("correlation", "External id", "external id")


def remap_rank(events: list[dict], rank: int) -> list[dict]:
    """Give the events of rank `rank` their own tracks and ids (see merge_job). For rank 0 the
    offsets are 0: the integer values stay as they are (and are not reassigned)."""
    shift = rank << ID_SHIFT
    base = rank * PID_STRIDE
    limit = 1 << ID_SHIFT
    for e in events:
        get = e.get
        pid = get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and 0 <= pid < PID_STRIDE:
            if base:
                e["pid"] = base + pid
        elif pid is not None:
            e["pid"] = f"rank{rank}:{pid}"
        i = get("id")
        if i is not None:
            if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < limit:
                if shift:
                    e["id"] = i + shift
            elif isinstance(i, str):
                e["id"] = f"{rank}:{i}"
        args = get("args")
        if isinstance(args, dict):
            if shift:
                for k in _ID_ARGS:
                    v = args.get(k)
                    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < limit:
                        args[k] = v + shift
            if get("ph") == "M" and get("name") == "process_name" and "name" in args:
                args["name"] = f"rank {rank}: {args['name']}"
    return events


def merge_job(src: Path | list[Path], dst: Path, *, compression: str | None = None, level: int | None = None) -> Stats:
    """Per-rank files -> one trace. Integer pids become rank * 10^7 + pid (string pids get a
    `rank<r>:` prefix) and process names a `rank <r>: ` prefix, so each rank keeps its own tracks;
    flow ids and correlation ids are offset by rank << 40 so that links stay within a rank.
    Top-level keys come from the first rank; `distributedInfo` records the merged ranks. Inputs that
    are not traces, or turn out unusable while read, are skipped (Stats.skipped), as `analyze` skips
    them in a job folder. A folder among several inputs stands for its rank files."""
    if isinstance(src, (list, tuple)):
        folders = [Path(f) for f in src if Path(f).is_dir()]
        if len(src) == 1 and folders:
            src = folders[0]
    if isinstance(src, (list, tuple)):
        for d in folders:
            guard.refuse_inside(dst, d, what="merged trace")
        guard.check_file_output(dst, [Path(f) for f in src if not Path(f).is_dir()])
    else:
        guard.refuse_dir_as_file(dst)
        guard.refuse_inside(dst, Path(src), what="merged trace")
    guard.check_suffix(dst, compression)
    guard.check_level(compression_for(dst, compression), level, dst)
    expanded: list[str] = []
    if isinstance(src, (list, tuple)):
        inputs: list[Path] = []
        for f in map(Path, src):
            if f.is_dir():  # its rank files, as `merge DIR` would read them
                found = folder_rank_files(f, is_trace_file)
                if not found:
                    expanded.append(f"{f}: {no_traces_reason(f, is_trace_file)}")
                inputs += found
            elif f not in inputs:
                inputs.append(f)
        if not inputs:
            raise InputError(None, "; ".join(expanded))
        job = rank_files(inputs)
    else:
        job = job_folder(Path(src))
    refuse_merged(job, "merge the rank files it came from")
    refuse_same_rank(job, None if isinstance(src, (list, tuple)) else Path(src),
                     "merge the rank files of one run (the trace they were cut from is one rank)")
    files = list(job.files)
    skipped = expanded + list(job.skipped)
    while True:
        try:
            st = _merge_files(files, job.tops, dst, compression=compression, level=level)
            break
        except InputError as exc:
            bad = [(r, f) for r, f in files if exc.path == str(f)]
            if not bad:
                raise
            # the rank turned out unusable while read (nested too deeply, truncated): the output is
            # one stream that already holds part of it, so merge again without it (rare: the
            # common path reads every rank once)
            files.remove(bad[0])
            skipped.append(f"{bad[0][1]}: {exc.reason}")
            if not files:
                where = None if isinstance(src, (list, tuple)) else str(src)
                if where is None and len(skipped) == 1:
                    raise InputError(str(bad[0][1]), exc.reason) from None
                reasons = "; ".join(skipped[:3]) + (f"; +{len(skipped) - 3} more" if len(skipped) > 3 else "")
                raise InputError(where, f"no usable trace ({reasons})") from None
    st.skipped = skipped
    return st


def _merge_files(files: list[tuple[int, Path]], tops: dict[Path, dict[str, Any]], dst: Path, *,
                 compression: str | None, level: int | None) -> Stats:
    """merge_job on rank files known to be traces; InputError naming a rank that fails while read."""
    first_top = decode_top(*_frame_of(files[0][1]))
    devices: list = []
    seen_dev = set()
    for _, f in files:
        for d in tops[f].get("deviceProperties") or []:
            key = msgspec.json.encode(d)
            if key not in seen_dev:
                seen_dev.add(key)
                devices.append(d)
    top = dict(first_top)
    if devices:
        top["deviceProperties"] = devices
    worlds = [w for _, f in files if isinstance(w := (tops[f].get("distributedInfo") or {}).get("world_size"), int)]
    top["distributedInfo"] = merged_dist(top.get("distributedInfo"), [r for r, _ in files], max(worlds, default=None))
    head, tail = encode_head(top)
    st = Stats()
    with write_queue(compression_for(dst, compression) != "none") as writes:
        w = TraceWriter(dst, head=head, tail=tail, compression=compression, level=level, writes=writes)
        try:
            for rank, f in files:
                _merge_rank(w, rank, f, st)
            w.close()
        except BaseException as exc:
            abort_outputs(writes, exc, [w])
            raise
    st.outputs.append(str(dst))
    st.note = f"ranks {[r for r, _ in files]}"
    return st


_DICTS = msgspec.json.Decoder(list[dict])


def _merge_rank(w: TraceWriter, rank: int, f: Path, st: Stats) -> None:
    """Append the events of rank file f, remapped, to the merged trace. Each slice is first held to
    the loader's types (validate.refuse_wrong_types), as `analyze` reads it: re-encoded as objects,
    a wrong-typed field (`"name": [1, 2]`) would otherwise reach the output, or turn valid by the
    remapping (a float pid becomes a string). InputError naming f when f is unusable."""
    seen = [0]  # events of f before the slice
    timed = [False]  # an event other than metadata seen (looked for until one is)

    def consume(view) -> None:
        events = _DICTS.decode(view)  # first: a DecodeError here makes the scanner cut elsewhere
        if not timed[0]:
            timed[0] = any(e.get("ph") != "M" for e in events)
        if not _valid_slice(view):  # one strict decode passes nearly every slice; else the checks say why
            refuse_wrong_types(f, view, seen[0])  # decoded where it lies (no copy)
            for k, e in enumerate(events):  # and to `trace check`'s rules (a `ph`, a `ts`, ...)
                problems = event_problems(e.get("ph"), e.get("name"), e.get("ts"), e.get("dur"), e.get("pid"),
                                          e.get("tid"), e.get("id"))
                if problems:
                    raise InputError(str(f), f"event {seen[0] + k}: {problems[0]}")
        seen[0] += len(events)
        st.events_in += len(events)
        w.write_objects(remap_rank(events, rank))
        st.events_out += len(events)

    try:
        scan(f, consume, hash=False, slice_bytes=slices.SLICE_BYTES)
    except BadJSON as exc:
        raise InputError(str(f), str(exc)) from None
    except StreamError as exc:
        raise InputError(str(f), f"cannot stream this trace: {exc}") from None
    except RecursionError:  # msgspec's answer to nesting deeper than Python's recursion limit
        raise InputError(str(f), TOO_DEEP) from None
    if not timed[0]:  # `analyze` skips such a rank (and refuses such a file)
        raise InputError(str(f), ONLY_METADATA)


def _frame_of(path: Path) -> tuple[bytes, bytes]:
    """head and tail bytes of a trace (one streaming pass that decodes nothing); InputError naming
    the file when it turns out unreadable past its head (truncated, corrupt)."""
    try:
        res = scan(path, lambda v: None, hash=False)
    except StreamError as exc:
        raise InputError(str(path), f"cannot stream this trace: {exc}") from None
    except RecursionError:
        raise InputError(str(path), TOO_DEEP) from None
    return res.head, res.tail
