"""`zoomer-ar analyze --steps N..M`: analyse a window of profiler steps of a trace of any size.

Each rank file is cut to ProfilerStep#N..#M by the streaming `trace slice` (CPU and GPU side of the
steps, the kernels their launches queued wherever they run; a few MB of memory whatever the input's
size) into a temporary folder, the files of a folder in parallel processes (stream/pool.py), and the
cut files are analysed as the job. The analysis then names the
original files (each rank's sha256, size and event count are the window's: what was analysed) and
says which steps it covers. A rank without those steps is skipped with its reason, as an unreadable
rank of a folder is; when no rank has them the command fails (exit 2) naming the steps present.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .errors import InputError
from .load.job import rank_files
from .models import Analysis, SkippedFile
from .stream.source import is_trace_file


def _plain_name(name: str) -> str:
    """The rank file's name without its compression suffix (.gz, .zst, .zstd, in any case)."""
    low = name.lower()
    for suffix in (".gz", ".zstd", ".zst"):
        if low.endswith(suffix):
            return name[: -len(suffix)]
    return name


POOL_MIN_BYTES = 32 << 20  # rank files smaller than this together are cut in this process: starting workers costs more


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0


def _cut_one(src: str, dst: str, steps: tuple[int, int], slot: int | None = None) -> list[str] | InputError:
    """One rank file cut to the steps (in a worker process: its reads report to the shared bar)."""
    from .load.reader import reading_progress
    from .stream.pool import shared_progress
    from .surgery.cut import slice_trace  # the surgery commands load only when asked

    bar = shared_progress(slot)
    # in a worker, the reads report to the shared bar; in this process, to the bars of the caller's
    # reading_progress block (left as it is)
    scope = reading_progress(lambda _path: bar) if bar is not None else contextlib.nullcontext()
    try:
        with scope:
            return list(slice_trace(Path(src), Path(dst), steps=steps, compression="none").notes)
    except InputError as exc:
        return exc


def _cut_names(files: list[Path]) -> list[str]:
    """Each rank file's cut name (files in sorted order): its own name as plain JSON (`x.json.gz` ->
    `x.json`), so that rank numbers, names and notes come from it; where that name is taken (`x.json`
    beside `x.json.gz`) or is no trace's (`worker0.gz` -> `worker0`, which no folder reader lists), the
    whole name with `.json` after it (`x.json.gz.json`). The cuts then sort as their files do: the
    analysis numbers unclaimed ranks and keeps the first of two copies by that order, as without
    --steps (the taken name used to get the file's position in front, `1.x.json`, which sorted first:
    the .gz copy was kept where `analyze` keeps x.json)."""
    taken: set[str] = set()
    out = []
    for i, f in enumerate(files):
        n = _plain_name(f.name)
        if n in taken or not n.lower().endswith(".json"):
            n = f.name if f.name.lower().endswith(".json") else f"{f.name}.json"
        while n in taken:  # only for names made to collide (x.gz beside x.gz.json)
            n = f"{i}.{n}"
        taken.add(n)
        out.append(n)
    return out


def cut_steps(path: Path, steps: tuple[int, int], into: Path, *, workers: int | None = None,
              progress_factory=None) -> tuple[Path, dict[str, str], list[SkippedFile], list[str]]:
    """Cut every rank of `path` (a trace file or a rank folder) to steps N..M into the folder `into`,
    the ranks of a folder in up to `workers` processes at once (default: ZOOMER_STREAM_WORKERS, else
    the CPU count, as the streaming reader reads them; without the variable, files under
    POOL_MIN_BYTES together are cut here, as starting the workers would take longer than the cuts);
    `progress_factory` gives the bars of the workers' reads (in this process, the reads report to
    reading_progress's bars).

    Returns what to analyse (a file or `into`), {cut file: original file}, the ranks skipped (no such
    steps, unreadable) and the notes of the cuts (steps missing in a rank's range)."""
    from .stream.pool import env_workers, run_pool

    files = rank_files(path, is_trace_file) if path.is_dir() else [path]
    outs = [into / n for n in _cut_names(files)]
    args = [(str(f), str(out), steps) for f, out in zip(files, outs)]
    if workers is None:
        small = sum(_size(f) for f in files) < POOL_MIN_BYTES
        workers = 1 if small and "ZOOMER_STREAM_WORKERS" not in os.environ else env_workers()
    n_workers = max(1, min(workers, len(files)))
    if n_workers == 1:
        results = [_cut_one(*a) for a in args]
    else:
        results = run_pool(_cut_one, files, args, n_workers, progress_factory)
    originals: dict[str, str] = {}
    skipped: list[SkippedFile] = []
    notes: list[str] = []
    for f, out, res in zip(files, outs, results):
        if isinstance(res, InputError):
            if not path.is_dir():
                raise res
            skipped.append(SkippedFile(path=str(f), reason=res.reason))
            continue
        originals[str(out)] = str(f)
        for n in res:  # "--steps N..M: kept steps ..., those this trace has of them (...)"
            n = n.split(": ", 1)[1] if n.startswith("--steps ") else n
            notes.append(f"{f.name}: {n}" if path.is_dir() else n)
    if not originals:
        reasons = "; ".join(f"{Path(s.path).name}: {s.reason}" for s in skipped[:3])
        more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        raise InputError(str(path), f"no rank could be cut to steps {steps[0]}..{steps[1]} ({reasons}{more})")
    return (into if path.is_dir() else next(iter(originals))), originals, skipped, notes


def name_originals(analysis: Analysis, path: Path, steps: tuple[int, int], originals: dict[str, str],
                   skipped: list[SkippedFile], notes: list[str]) -> Analysis:
    """The analysis of the cut files, told as the analysis of `path`'s steps N..M."""
    job = analysis.job
    ranks = [r.model_copy(update={"path": originals.get(r.path, r.path)}) for r in job.ranks]
    names = {Path(cut).name: Path(orig).name for cut, orig in originals.items()}
    twin = "the same trace as "  # load/folder.py's reason names the other file: the cut's name

    def reason(r: str) -> str:
        return twin + names.get(r[len(twin):], r[len(twin):]) if r.startswith(twin) else r

    moved = [s.model_copy(update={"path": originals.get(s.path, s.path), "reason": reason(s.reason)})
             for s in job.skipped]
    # the analysis of the cuts noted its skipped files under their temporary paths, and knows nothing
    # of the ranks skipped while cut: every skipped file is noted under its own path, where analyze
    # notes them without --steps
    tmp_notes = {f"Skipped {s.path}: {s.reason}" for s in job.skipped}
    at = next((i for i, n in enumerate(analysis.notes) if n in tmp_notes), len(analysis.notes))
    kept = [n for n in analysis.notes if n not in tmp_notes]
    at -= sum(1 for n in analysis.notes[:at] if n in tmp_notes)
    kept[at:at] = [f"Skipped {s.path}: {s.reason}" for s in skipped + moved]
    analysis = analysis.model_copy(update={"notes": kept, "job": job.model_copy(update={
        "path": str(path), "ranks": ranks, "skipped": skipped + moved})})
    analysis.notes.insert(0, f"Analysed ProfilerStep#{steps[0]}..#{steps[1]} only (--steps): each rank was cut to "
                             "those steps with `zoomer-ar trace slice`; the figures, sizes and hashes are the window's.")
    analysis.notes[1:1] = [f"--steps: {n}" for n in notes]
    return analysis


def told_as_originals(exc: InputError, into: Path, path: Path, originals: dict[str, str]) -> InputError:
    """The analysis of the cuts refused them (a folder of one rank's pieces, say): the same refusal,
    naming `path` and the original files instead of the temporary folder `into` and its cuts."""
    import re

    def named(text: str) -> str:
        for cut, orig in originals.items():
            text = text.replace(cut, orig)
        text = text.replace(str(into), str(path))
        names = {Path(cut).name: Path(orig).name for cut, orig in originals.items()}
        if not names:
            return text
        pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        return re.sub(rf"(?<![\w.\-/])(?:{pattern})(?![\w.\-])", lambda m: names[m.group(0)], text)

    where = None if exc.path is None else originals.get(exc.path, str(path) if exc.path == str(into) else exc.path)
    return InputError(where, named(exc.reason))


def parse_steps(text: str) -> tuple[int, int]:
    """`N..M` (also `N:M`, `N-M`; a single `N` is N..N) as (N, M), refused before anything is read
    when it is not two step numbers or is reversed."""
    import re

    m = re.fullmatch(r"\s*(\d+)\s*(?:\.\.|:|-)\s*(\d+)\s*", text) or re.fullmatch(r"\s*(\d+)\s*", text)
    if m is None:
        raise InputError(None, f"--steps {text!r}: expected N..M (step numbers, as in ProfilerStep#N)")
    lo, hi = int(m.group(1)), int(m.group(m.lastindex or 1))
    if hi < lo:
        raise InputError(None, f"--steps {lo}..{hi} is reversed: give N..M with N <= M")
    return lo, hi
