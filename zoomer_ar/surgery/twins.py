"""Files of a job folder that hold one trace twice (a trace beside its decompressed copy, a file
downloaded twice): `analyze` reads such a pair once (load/folder.py skips the copy: "the same trace
as X"), and the job commands (merge, sample, filter) do the same here, where they refused the folder
for two files that claim one rank.

Two files are compared only where nothing tells them apart before reading them: no rank claim differs
(distributedInfo, the file name) and their top-level keys are the same. They are then read side by
side, decompressed, and the comparison stops at the first difference (pieces of one trace, such as
`trace split`'s per-step files, differ within their first megabyte); only a true copy is read whole.
A copy must hold the same JSON bytes: a re-encoded one (pretty-printed, say) is left as a file of its
own, and the rank clash it makes is refused as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..load.folder import rank_from_name
from ..stream.source import StreamError, iter_chunks

COMPARE_CHUNK = 1 << 20


def same_trace(a: Path, b: Path) -> bool:
    """Whether a and b decompress to the same bytes; False where either cannot be read (it is then
    read, and skipped or refused, as any rank file)."""
    left, right = _chunks(a), _chunks(b)
    try:
        pending = b""  # bytes of `a` read ahead of `b`
        for data in right:
            while len(pending) < len(data):
                more = next(left, None)
                if more is None:
                    return False
                pending += more
            if pending[: len(data)] != data:
                return False
            pending = pending[len(data):]
        return not pending and next(left, None) is None
    except (StreamError, OSError):
        return False
    finally:
        left.close()
        right.close()


def _chunks(path: Path) -> Iterator[bytes]:
    for data, _ in iter_chunks(path, COMPARE_CHUNK):
        yield data


def without_twins(files: list[Path], tops: dict[Path, dict[str, Any]],
                  dist_ranks: list[int | None]) -> tuple[list[Path], list[str]]:
    """`files` less those that hold the same trace as another one (a file naming its rank is kept
    before one that does not, else the first in order), and a "path: the same trace as NAME" line
    for each left out."""
    claims = [(d, rank_from_name(f)) for f, d in zip(files, dist_ranks)]

    def other_rank(i: int, j: int) -> bool:
        return any(x is not None and y is not None and x != y for x, y in zip(claims[i], claims[j]))

    kept: list[int] = []
    skipped: list[str] = []
    for i in sorted(range(len(files)), key=lambda i: claims[i] == (None, None)):
        twin = next((j for j in kept if not other_rank(i, j) and tops[files[i]] == tops[files[j]]
                     and same_trace(files[j], files[i])), None)
        if twin is None:
            kept.append(i)
        else:
            skipped.append(f"{files[i]}: the same trace as {files[twin].name}")
    return [files[i] for i in sorted(kept)], skipped
