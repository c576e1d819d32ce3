"""Whether an earlier findings.json (its ``job`` object) was written for the input analysed now: the
default output folder (zoomer-out/<job>) is reused for the same input and never for another one.

findings.json records the input's path as it was given, relative to the folder the earlier run was
started from, which is not known now. zoomer-out/ is shared by runs started from different folders
(from inside a rank folder it goes beside it), so that path alone cannot say whether two runs read
the same input. The rank files recorded with it (their names, sizes and sha256) can: the input is
the same when its rank files are those, byte for byte. The files are hashed only when all names and
sizes already agree (a different trace of the same name costs a stat)."""

from __future__ import annotations

from pathlib import Path

from .load.job import rank_files
from .load.reader import file_sha256


def is_same_input(recorded: dict, path: Path) -> bool:
    """True when ``recorded`` (findings.json's ``job``) names this input: its path, resolved from the
    current folder, is the input's, or its rank files are the input's files (same_rank_files)."""
    if Path(str(recorded["path"])).resolve() == path.resolve():
        return True
    return same_rank_files(recorded, path)


def same_rank_files(recorded: dict, path: Path) -> bool:
    """True when the input (a trace file or a rank folder, as the earlier input was) holds exactly the
    recorded rank files, by name, size and sha256; a file that was skipped then may still be there.
    Anything unreadable or malformed answers False (a new folder, never another input's overwritten)."""
    try:
        ranks = _recorded_ranks(recorded)
        was_file = all(str(r["path"]) == str(recorded["path"]) for r in recorded["ranks"])
        if not ranks or was_file == path.is_dir():
            return False
        skipped = {Path(str(s["path"])).name for s in recorded.get("skipped") or []}
        files = {f.name: f for f in (rank_files(path) if path.is_dir() else [path])}
        if set(ranks) - set(files) or set(files) - set(ranks) - skipped:
            return False
        if any(files[name].stat().st_size != size for name, (size, _) in ranks.items()):
            return False
        return all(file_sha256(files[name]) == sha for name, (_, sha) in ranks.items())
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return False


def _recorded_ranks(recorded: dict) -> dict[str, tuple[int, str]]:
    """File name -> (size in bytes, sha256) of each recorded rank file (a merged trace's ranks share
    one file); a name recorded with two different contents raises ValueError."""
    out: dict[str, tuple[int, str]] = {}
    for r in recorded["ranks"]:
        name, facts = Path(str(r["path"])).name, (int(r["size_bytes"]), str(r["sha256"]))
        if out.setdefault(name, facts) != facts:
            raise ValueError(name)
    return out
