"""Store stage: recorded analyses in SQLite (embedded default) or PostgreSQL, weekly digests, job history.

    from zoomer_ar.store import record_analysis, RecordOptions, build_digest
    record_analysis(analysis, RecordOptions(job="resnet", team="vision", gpu_hours=1200, gpu_hour_cost=2.5))

Importing this package does not import SQLAlchemy; the functions below do, when called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RecordOptions", "build_digest", "job_history", "open_store", "record_analysis", "resolve_url"]


def __getattr__(name: str) -> Any:
    if name in ("RecordOptions", "record_analysis", "add_verdict"):
        from . import record

        return getattr(record, name)
    if name in ("open_store", "resolve_url"):
        from . import db

        return getattr(db, name)
    if name == "build_digest":
        from .digest import build_digest

        return build_digest
    if name == "job_history":
        from .history import job_history

        return job_history
    raise AttributeError(name)
