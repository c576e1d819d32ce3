"""Generated Kineto documents -> the real load stage (files on disk -> `load_job`) -> a `Job`."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from ..load import Job, load_job


def _plain(obj: Any) -> Any:
    """numpy scalars -> Python numbers (msgspec does not encode them)."""
    if hasattr(obj, "item"):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def write_documents(docs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """One `rank-<r>.json` per document (what a per-rank profiler run leaves)."""
    folder.mkdir(parents=True, exist_ok=True)
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
