"""Whether raising DataLoader workers at relaunch is safe: the program's loaders, classified the way
the dataloader-workers fixer classifies them (zoomer_ar.fix.datasets.loader_verdict).

Every worker of a DataLoader over an iterable-style dataset iterates its own copy of the dataset:
unless its ``__iter__`` splits the stream with ``get_worker_info()``, N workers yield every sample N
times. The fixer leaves such loaders alone; a relaunch that sets ``--num-workers=4`` (or
``data.workers=4``) would do what the fixer refused. The loaders a command-line setting can reach
are those whose ``num_workers`` is not a literal (``num_workers=args.num_workers``, ``**loader_kw``);
when no loader has one, every loader of the program is considered. Files are parsed, never run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: keys of the DataLoader that only make sense with worker processes (DataLoader raises
#: "persistent_workers option needs num_workers > 0" and the like without them)
WORKER_LEAVES = ("num_workers", "workers", "persistent_workers", "prefetch_factor")
#: files larger than this are not parsed for loaders
MAX_BYTES = 2 << 20


@dataclass(frozen=True)
class Refused:
    """A DataLoader the fixer would not give workers: where, and why."""

    file: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.why})"  # "train.py:40 (over an iterable-style dataset)"


def _verdict_why(kind: str, why: str | None) -> str | None:
    """Why the fixer refuses workers for a loader of this verdict, None when it gives them."""
    from ..fix.datasets import ITERABLE, MAP

    if kind == MAP or (kind != ITERABLE and why is None):
        return None
    return "over an iterable-style dataset" if kind == ITERABLE else f"dataset of unknown kind, and {why}"


def refused_loaders(files: list[Path]) -> tuple[list[Refused], int]:
    """(the loaders a workers setting would reach that the fixer refuses, loaders found in all)."""
    from ..fix import helpers as h
    from ..fix.base import Context
    from ..fix.datasets import loader_verdict

    reach: list[Refused | None] = []
    rest: list[Refused | None] = []
    found = 0
    for path in files:
        try:
            if path.stat().st_size > MAX_BYTES:
                continue
            ctx = Context(path.read_text(encoding="utf-8", errors="replace"), str(path))
        except Exception:  # noqa: BLE001 - a file libcst cannot parse has no loaders we can judge
            continue
        for call in h.dataloader_calls(ctx):
            found += 1
            why = _verdict_why(*loader_verdict(ctx, call))
            item = Refused(path.name, ctx.pos(call).start.line, why) if why else None
            workers = h.arg_at(call, "num_workers", 5)
            settable = h.has_star(call) or (workers is not None and h.literal(workers.value) is h.MISSING)
            (reach if settable else rest).append(item)
    considered = reach if reach else rest
    return [r for r in considered if r is not None], found


def is_worker_key(key: str) -> bool:
    """A setting that raises workers or only works with them (``dataloader.num_workers``,
    ``num-workers``, ``data.persistent_workers``)."""
    leaf = key.rsplit(".", 1)[-1].lstrip("-").replace("-", "_").lower()
    return leaf in WORKER_LEAVES or leaf.endswith("_workers")
