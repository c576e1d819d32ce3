"""`zoomer-ar analyze --steps N..M`: analyse a window of profiler steps of a trace of any size.

Each rank file is cut to ProfilerStep#N..#M by the streaming `trace slice` (CPU and GPU side of the
steps, the kernels their launches queued wherever they run; a few MB of memory whatever the input's
size) into a temporary folder, and the cut files are analysed as the job. The analysis then names the
original files (each rank's sha256, size and event count are the window's: what was analysed) and
says which steps it covers. A rank without those steps is skipped with its reason, as an unreadable
rank of a folder is; when no rank has them the command fails (exit 2) naming the steps present.
"""

from __future__ import annotations

from pathlib import Path

from .errors import InputError
from .load.job import rank_files
from .models import Analysis, SkippedFile
from .stream.source import is_trace_file


def _plain_name(name: str) -> str:
    """The cut's file name: the rank file's own (rank numbers and names come from it), as plain JSON."""
    for suffix in (".gz", ".zst"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def cut_steps(path: Path, steps: tuple[int, int], into: Path) -> tuple[Path, dict[str, str], list[SkippedFile], list[str]]:
    """Cut every rank of `path` (a trace file or a rank folder) to steps N..M into the folder `into`.

    Returns what to analyse (a file or `into`), {cut file: original file}, the ranks skipped (no such
    steps, unreadable) and the notes of the cuts (steps missing in a rank's range)."""
    from .surgery.cut import slice_trace  # the surgery commands load only when asked

    files = rank_files(path, is_trace_file) if path.is_dir() else [path]
    originals: dict[str, str] = {}
    skipped: list[SkippedFile] = []
    notes: list[str] = []
    for f in files:
        out = into / _plain_name(f.name)
        try:
            st = slice_trace(f, out, steps=steps, compression="none")
        except InputError as exc:
            if not path.is_dir():
                raise
            skipped.append(SkippedFile(path=str(f), reason=exc.reason))
            continue
        originals[str(out)] = str(f)
        for n in st.notes:  # "--steps N..M: kept steps ..., those this trace has of them (...)"
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
    moved = [s.model_copy(update={"path": originals.get(s.path, s.path)}) for s in job.skipped]
    analysis = analysis.model_copy(update={"job": job.model_copy(update={
        "path": str(path), "ranks": ranks, "skipped": skipped + moved})})
    analysis.notes.insert(0, f"Analysed ProfilerStep#{steps[0]}..#{steps[1]} only (--steps): each rank was cut to "
                             "those steps with `zoomer-ar trace slice`; the figures, sizes and hashes are the window's.")
    analysis.notes[1:1] = [f"--steps: {n}" for n in notes]
    return analysis


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
