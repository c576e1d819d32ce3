"""The recorded run's trace folder on the replayed command line.

A program that records with ``zoomer_ar.capture`` is usually told where on its command line
(``python train.py traces/before``, ``--out traces/before``, ``out=traces/before``). The capture
helper refuses a folder that holds an earlier capture (``overwrite=False``; with ``overwrite=True``
it replaces it), so replaying that command as recorded stops with ``CaptureError`` at the folder the
relaunch was made from, or writes over the "before" trace ``zoomer-ar compare`` needs.

At spec time (:func:`retarget`) a word naming the analysed trace folder, in whatever form (a
positional argument, ``--opt=value``, ``key=value``, relative to the recorded cwd or absolute) is
pointed at a fresh sibling folder (``traces/before-relaunch``) and a note says so. At relaunch time
(:func:`captures_on_command_line`) a word naming a folder that holds a capture is found, and whether
it is the spec's own (one of its ``trace_sha256``).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..capture import trace_file_name  # no torch: the capture module imports it lazily
from ..load.job import recorded_job

#: a trace file's name after its rank ("rank-0" + TRACE_SUFFIX)
TRACE_SUFFIX = trace_file_name(0).removeprefix("rank-0")

#: what the sibling folder is called: NAME + SUFFIX, then NAME + SUFFIX-2 ... when that is taken
SUFFIX = "-relaunch"
#: sibling names tried before giving up on one that does not exist yet
MAX_SIBLINGS = 100
#: trace files hashed at relaunch time when looking for the spec's own capture in a folder
MAX_HASHED = 4
#: what identifies one run of the capture helper in its job.json
RUN_IDENTITY = ("hostname", "pid", "started_at")


@dataclass(frozen=True)
class FoundCapture:
    """A command-line word naming a folder that holds a capture (relaunch time)."""

    word: str
    folder: Path
    files: tuple[str, ...]
    own: bool  # the capture the spec was made from (a trace of its trace_sha256)


def _values(word: str) -> list[tuple[str, str]]:
    """(prefix, value) pairs a word may carry a path in: itself, and after its first '=' (``--out=X``,
    ``out=X``)."""
    out = [("", word)]
    if "=" in word:
        head, _, value = word.partition("=")
        out.append((head + "=", value))
    return [(p, v) for p, v in out if v]


def capture_files(folder: Path) -> list[str]:
    """The capture helper's files in ``folder`` (job.json, rank traces, a later cycle's, other ranks' job
    files), relative to it; [] when it is not a folder."""
    try:
        if not is_dir(folder):
            return []
        found = [p for p in (folder / "job.json",) if p.is_file()]
        found += sorted(folder.glob("rank-*.pt.trace.json.gz"))[:8]
        found += sorted(folder.glob("cycle-*/rank-*.pt.trace.json.gz"))[:4]
        found += sorted(folder.glob("job.ranks/rank-*.json"))[:4]
    except (OSError, ValueError):
        return []
    return [str(p.relative_to(folder)) for p in found]


def _run_identity(folder: Path) -> tuple | None:
    doc = recorded_job(folder)  # {} for a missing, unreadable or too deeply nested job.json
    ident = tuple(doc.get(k) for k in RUN_IDENTITY)
    return ident if all(v is not None for v in ident) else None


def _resolved(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, ValueError):  # pragma: no cover
        return p.absolute()


def _asks(p: Path, test) -> bool:  # noqa: ANN001 - Path.is_file, Path.is_dir, Path.exists
    """``test(p)``; False for a word that is no path this system can hold (a component past NAME_MAX,
    a JSON config given as an argument: ENAMETOOLONG)."""
    try:
        return test(p)
    except (OSError, ValueError):
        return False


def is_file(p: Path) -> bool:
    """A file is there; False for a path this system cannot hold."""
    return _asks(p, Path.is_file)


def is_dir(p: Path) -> bool:
    """A folder is there; False for a path this system cannot hold."""
    return _asks(p, Path.is_dir)


def _exists(p: Path) -> bool:
    return _asks(p, Path.exists)


def _name(value: str) -> str:
    return os.path.basename(value.rstrip("/"))


def _names_folder(value: str, trace: Path, cwd: Path | None, identity: tuple | None) -> bool:
    """``value`` names the analysed trace folder ``trace``: the same folder (or one holding the same run's
    job.json) where the recorded place is on this machine, else by its last component."""
    given = Path(value)
    where = given if given.is_absolute() else (cwd / given if cwd is not None else None)
    here = where is not None and (is_dir(where.parent) if given.is_absolute() else cwd is not None and is_dir(cwd))
    if where is not None and here:  # the recorded place is on this machine: compare folders
        if not is_dir(where):
            return False  # nothing there now: the replay does not meet the capture
        return _resolved(where) == trace or (identity is not None and _run_identity(where) == identity)
    # recorded elsewhere (analysed on another machine): by name, the folder the capture was copied from
    name = _name(value)
    return name not in ("", ".", "..") and name == trace.name


def _sibling(value: str, suffix: str) -> str | None:
    """``value`` with its last component renamed NAME + suffix, in the same form (relative, ./, trailing /)."""
    stripped = value.rstrip("/")
    trail = value[len(stripped):]
    head, sep, name = stripped.rpartition("/")
    if name in ("", ".", ".."):
        return None
    return f"{head}{sep}{name}{suffix}{trail}"


def _free_suffix(values: list[str], cwd: Path | None) -> str:
    """The first of -relaunch, -relaunch-2 ... under which no sibling exists here yet."""
    for n in range(1, MAX_SIBLINGS + 1):
        suffix = SUFFIX if n == 1 else f"{SUFFIX}-{n}"
        taken = False
        for v in values:
            new = _sibling(v, suffix)
            p = Path(new) if new else None
            if p is not None and not p.is_absolute():
                p = cwd / p if cwd is not None else None
            taken = taken or (p is not None and _exists(p))
        if not taken:
            return suffix
    return SUFFIX


def retarget(args: list[str], trace_folder: Path | None, cwd: str | None, job: dict
             ) -> tuple[list[str], list[str]]:
    """(``args`` with every word naming the recorded trace folder pointed at a fresh sibling, notes saying
    what changed); ``args`` unchanged and no note when none names it."""
    if trace_folder is None or not args:
        return list(args), []
    trace = _resolved(trace_folder)
    base = Path(cwd) if cwd else None
    identity = tuple(job.get(k) for k in RUN_IDENTITY) if job else None
    identity = identity if identity and all(v is not None for v in identity) else None
    hits: list[tuple[int, str, str]] = []  # (index, prefix, value)
    inside: list[str] = []
    holders: list[str] = []  # words naming a folder the trace folder lies in (an output root: runs/exp1)
    for i, word in enumerate(args):
        for prefix, value in _values(word):
            if _names_folder(value, trace, base, identity):
                hits.append((i, prefix, value))
                break
            if _inside(value, trace, base):
                inside.append(word)
                break
            if _holds(value, trace, base):
                holders.append(word)
                break
    if not hits:
        return list(args), [_holder_note(holders, trace)] if holders else []
    suffix = _free_suffix([v for _, _, v in hits], base)
    out = list(args)
    changed: list[str] = []
    unrenamable: list[str] = []
    for i, prefix, value in hits:
        new = _sibling(value, suffix)
        if new is None:
            unrenamable.append(args[i])
            continue
        out[i] = prefix + new
        changed.append(f"{args[i]} -> {out[i]}")
    notes = []
    if changed:
        before = hits[0][2]
        after = _sibling(before, suffix)
        notes.append(f"Records into a new folder: {'; '.join(changed)}. The recorded command wrote its trace to "
                     f"{before}, the capture this spec was made from; replayed as recorded, the program's "
                     "zoomer_ar.capture would stop with CaptureError there (or, with overwrite=True, replace the "
                     f"trace compare needs). Afterwards: zoomer-ar compare {shlex.quote(before)} {shlex.quote(str(after))}")
    if unrenamable:
        notes.append(f"{', '.join(unrenamable)} names the folder the recorded run's capture is in, which has no "
                     "name a sibling can be made from: point it at a new folder in command.args before relaunching "
                     "(zoomer_ar.capture refuses a folder holding an earlier capture).")
    if inside:
        notes.append(f"{', '.join(inside)} still point(s) into the recorded run's trace folder: the relaunch reads "
                     "or writes there as recorded.")
    return out, notes


def _holds(value: str, trace: Path, cwd: Path | None) -> bool:
    """``value`` names a folder the trace folder lies in, below the recorded cwd (``runs/exp1`` for a capture in
    ``runs/exp1/profile``; never the cwd itself or a folder above it, which hold everything)."""
    if cwd is None or not is_dir(cwd):
        return False
    given = Path(value)
    where = _resolved(given if given.is_absolute() else cwd / given)
    return where in trace.parents and _resolved(cwd) in where.parents


def _holder_note(holders: list[str], trace: Path) -> str:
    return (f"{', '.join(holders)} on the command line holds the folder the recorded run's capture is in ({trace}): "
            "a program recording under it meets that capture on a replay, and zoomer_ar.capture stops with "
            "CaptureError (with overwrite=True it replaces the trace compare needs): point it at a new folder in "
            "command.args, or move the capture, before relaunching.")


def _inside(value: str, trace: Path, cwd: Path | None) -> bool:
    given = Path(value)
    where = given if given.is_absolute() else (cwd / given if cwd is not None else None)
    if where is None:
        return False
    try:
        return trace in _resolved(where).parents
    except OSError:  # pragma: no cover
        return False


def captures_on_command_line(words: list[str], workdir: Path, own_sha256: list[str]) -> list[FoundCapture]:
    """The words (``--opt=VALUE`` values included) naming a folder, taken from ``workdir`` when relative, that
    holds a capture; ``own`` when one of its traces is one of ``own_sha256`` (the spec's recorded trace)."""
    from ..load.reader import file_sha256

    found: list[FoundCapture] = []
    seen: set[Path] = set()
    for word in words:
        for _, value in _values(word):
            folder = Path(value) if os.path.isabs(value) else workdir / value
            files = capture_files(folder)
            if not files:
                continue
            key = _resolved(folder)
            if key in seen:
                break
            seen.add(key)
            own = False
            traces = [f for f in files if f.endswith(TRACE_SUFFIX)]
            for rel in traces[:MAX_HASHED] if own_sha256 else []:
                try:
                    own = file_sha256(folder / rel) in own_sha256
                except OSError:
                    continue
                if own:
                    break
            found.append(FoundCapture(word, folder, tuple(files), own))
            break
    return found
