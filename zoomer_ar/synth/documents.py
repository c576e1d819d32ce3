"""Generated Kineto documents -> the real load stage (files on disk -> `load_job`) -> a `Job`."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from ..errors import InputError
from ..load import Job, load_job
from ..load.job import rank_files


def _plain(obj: Any) -> Any:
    """numpy scalars -> Python numbers (msgspec does not encode them)."""
    if hasattr(obj, "item"):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def write_documents(docs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """One `rank-<r>.json` per document (what a per-rank profiler run leaves).

    A folder that already holds trace files (an earlier job's ranks, or anyone's traces) is refused
    (InputError): the new job's files would replace some of them and sit beside the rest, one
    folder that `analyze` reads as a single job of both."""
    folder.mkdir(parents=True, exist_ok=True)
    held = rank_files(folder)
    if held:
        shown = ", ".join(f.name for f in held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise InputError(str(folder), f"already holds trace files ({shown}): write the generated job to a new or "
                                      "empty folder")
    paths = []
    for i, doc in enumerate(docs):
        rank = (doc.get("distributedInfo") or {}).get("rank", i)
        p = folder / f"rank-{rank}.json"
        p.write_bytes(msgspec.json.encode(doc, enc_hook=_plain))
        paths.append(p)
    return paths


def load_documents(docs: list[dict[str, Any]], name: str, scratch: Path | None = None) -> Job:
    """Write the documents to a scratch folder and load them exactly as `zoomer-ar analyze` would."""
    tmp = Path(tempfile.mkdtemp(prefix="zoomer-synth-", dir=str(scratch) if scratch else None))
    try:
        write_documents(docs, tmp)
        job = load_job(tmp, name=name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return job
