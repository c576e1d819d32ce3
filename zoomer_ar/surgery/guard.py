"""Refuse outputs and arguments that would destroy or pollute the inputs, before anything is read.

Every surgery command writes to a temporary file renamed into place at the end, so an output that
is the input itself (same path, a symlink to it, a hard link) silently replaces the original with
the cut-down copy. Folder outputs written into the rank folder they were read from add files that
a later `analyze DIR` takes for extra ranks. These checks run first, on paths only: nothing is read
and nothing is created when they refuse (InputError, exit 2, one line naming the output).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import InputError


def _real(path: Path) -> Path:
    """The path with symlinks and `..` resolved (the path need not exist)."""
    return Path(os.path.realpath(path))


def same_file(a: Path, b: Path) -> bool:
    """a and b name the same file: equal once symlinks are resolved, or (both existing) the same
    inode, which also catches hard links and bind mounts."""
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def is_within(path: Path, folder: Path) -> bool:
    """path is folder or somewhere below it (symlinks resolved)."""
    p, f = _real(path), _real(folder)
    if p == f or f in p.parents:
        return True
    try:
        return os.path.samefile(path, folder)
    except OSError:
        return False


def refuse_overwrite(out: Path, inputs: Iterable[Path]) -> None:
    """An output file must not be one of the inputs: it would be replaced by its own cut-down copy."""
    for src in inputs:
        if same_file(out, src):
            raise InputError(str(out), f"is the input {src}; write the output to another file "
                                       "(it would replace the original)")


def refuse_inside(out: Path, folder: Path, *, what: str = "output") -> None:
    """Outputs must not land in (or below) an input rank folder: a later `analyze` of the folder
    would read them as extra ranks, and a same-named output would replace a rank file."""
    if is_within(out, folder):
        raise InputError(str(out), f"the {what} is inside the input job folder {folder}; "
                                   "write it outside the folder")


def refuse_dir_as_file(out: Path) -> None:
    """A file output that names an existing folder would fail only after the whole input was read."""
    if out.is_dir():
        raise InputError(str(out), "is a folder; give an output file name (e.g. OUT.json.gz)")


def refuse_file_as_dir(out: Path) -> None:
    """A folder output that names an existing file cannot be created."""
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "exists and is not a folder; give a folder for the outputs")


def refuse_holding_traces(out: Path, what: str) -> None:
    """A folder output must be new, or hold no trace files: the command's files would sit beside those
    of an earlier run (another split's steps, another sample's ranks), and a later `analyze OUT` would
    read them all as one job without a word. Files that are not traces (a README) are no obstacle."""
    from ..load.job import rank_files
    from ..stream.source import is_trace_file

    if not out.is_dir():
        return
    try:
        held = rank_files(out, is_trace_file)
    except OSError as exc:
        raise InputError(str(out), f"cannot list the output folder ({exc.strerror or exc})") from None
    if held:
        shown = ", ".join(f.name for f in held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise InputError(str(out), f"already holds {len(held)} trace file{'' if len(held) == 1 else 's'} ({shown}): "
                                   f"the {what} would mix with them, and `analyze` of the folder would read them "
                                   "all; give a new or empty folder, or remove them")


def check_folder_output(out: Path, src: Path, what: str) -> None:
    """`out` may take the files (`what`, e.g. "window files") cut from the trace `src`: not a file,
    not src's own folder (they would be read as extra ranks of it), holding no traces."""
    refuse_file_as_dir(out)
    if same_file(out, src.parent):
        raise InputError(str(out), f"is the folder of the input {src.name}: the {what} would be read as extra "
                                   "ranks of it; write them to another folder")
    refuse_holding_traces(out, what)


def check_file_output(out: Path, inputs: Iterable[Path]) -> None:
    """All checks for a command that writes one file from the given input files."""
    refuse_dir_as_file(out)
    refuse_overwrite(out, inputs)


def check_level(compression: str, level: int | None, out: Path | None = None) -> None:
    """Compression levels outside the codec's range fail deep inside the codec (ValueError) after
    the input was opened, and a zstd output without the `zstandard` package only when the output is
    opened (slice, split and merge read the whole input first: minutes on a large trace); refuse both
    up front (InputError naming the output `out`, where given)."""
    from ..stream.source import zstandard

    if compression == "zstd" and zstandard is None:
        raise InputError(None if out is None else str(out),
                         "zstd output needs the optional `zstandard` package (pip install zstandard)")
    if level is None or compression == "none":
        return
    lo, hi = (1, 22) if compression == "zstd" else (0, 9)
    if not lo <= level <= hi:
        raise InputError(None, f"--level {level}: {compression} levels are {lo}..{hi}")


def at_least_one(value: int | None, option: str) -> None:
    """Counts such as -k or --steps-per-file below 1 used to be taken as 1 without a word."""
    if value is not None and value < 1:
        raise InputError(None, f"{option} {value}: must be at least 1")


def require_file(src: Path) -> None:
    """An input trace must be a regular file: a named pipe (or a device) made every command wait
    for ever, with a temporary output file left behind when it was killed. An empty file is said to be
    one, as `analyze` says it (the readers said "cannot stream this trace: no events array")."""
    if src.exists() and not src.is_file() and not src.is_dir():
        raise InputError(str(src), "not a regular file")
    if src.is_file() and src.stat().st_size == 0:
        raise InputError(str(src), "empty file")


def unreadable(src: Path) -> str | None:
    """Why a regular file cannot be read ("cannot read (Permission denied)"), else None. A file that is
    no regular file is left to the readers ("not a regular file"): opening a named pipe would block."""
    try:
        if not src.is_file():
            return None
        with src.open("rb"):
            return None
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"


def _claimed(out: Path) -> str | None:
    """The compression the output's name claims: .gz gzip, .zst/.zstd zstd, .json none (else none)."""
    name = out.name.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith((".zst", ".zstd")):
        return "zstd"
    if name.endswith(".json"):
        return "none"
    return None


_SUFFIX = {"gzip": ".json.gz", "zstd": ".json.zst", "none": ".json"}


def check_suffix(out: Path, compression: str | None) -> None:
    """An output file whose name says another compression than the one asked (`--compression gzip`
    into OUT.json) is refused: HTA, Perfetto and this tool open files by their suffix, so gzip
    bytes in a .json file cannot be opened. A name without a known suffix takes any compression."""
    claimed = _claimed(out)
    if compression and claimed is not None and claimed != compression:
        raise InputError(str(out), f"the name says {claimed} but the output would be {compression}: name it "
                                   f"*{_SUFFIX[compression]}, or leave out the compression option (the name then decides)")
