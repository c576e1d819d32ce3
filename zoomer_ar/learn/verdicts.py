"""Human verdicts (`zoomer-ar label`): ./training_data/labels.jsonl (from the current folder), one JSON object per line.

    {"trace": "/abs/path/job_or_trace", "job": "name", "trace_sha256": ["..."], "pattern": "sync-point",
     "verdict": "positive" | "negative", "note": "...", "at": "2026-01-01T00:00:00Z",
     "feature_schema_version": "1.0.0", "features": {...}}

The features are stored with the verdict, so the verdict stays usable when the trace moves; when
the trace is still there and the feature schema changed, `train` re-featurises it. The next
`train` turns the verdicts of one trace into one case (the latest verdict per pattern wins),
with weight VERDICT_WEIGHT, always on the training side.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..features import FEATURE_SCHEMA_VERSION, extract
from ..load import load_job
from ..models import PATTERN_IDS
from ..paths import PACKAGE_DIR
from .cases import LabelledCase, full_labels

#: Relative on purpose: resolved against the current working directory when used, so that `label`
#: run from any folder writes there (and `train` run from the same folder reads it), never into the
#: installed package or the tool's own checkout.
DEFAULT_LABELS = Path("training_data") / "labels.jsonl"
VERDICT_WEIGHT = 5.0


def labels_path(store: Path | None = None) -> Path:
    """The absolute verdict file: `store`, else DEFAULT_LABELS under the current working directory.

    InputError when it would land inside the installed package (its files belong to the install)."""
    path = (Path(store) if store is not None else DEFAULT_LABELS).expanduser().resolve()
    if path.is_relative_to(PACKAGE_DIR.resolve()):
        raise InputError(str(path), "inside the installed zoomer_ar package: run from another folder or give --store")
    return path


def _from_findings(path: Path) -> tuple[dict[str, Any], str, list[str], str] | None:
    f = path / "findings.json" if path.is_dir() else path
    if f.name != "findings.json" or not f.is_file():
        return None
    doc = json.loads(f.read_text())
    feats = {k: v for k, v in doc.get("features", {}).items() if k != "per_rank"}
    job = doc.get("job", {})
    return feats, job.get("path", str(path)), [r.get("sha256", "") for r in job.get("ranks", [])], doc.get(
        "feature_schema_version", FEATURE_SCHEMA_VERSION)


def record(target: Path, pattern: str, verdict: bool, note: str = "", store: Path = DEFAULT_LABELS) -> dict[str, Any]:
    """Append one verdict to `store` (see labels_path: a relative path is taken from the current folder)."""
    if pattern not in PATTERN_IDS:
        raise InputError(pattern, f"not an anti-pattern id ({', '.join(PATTERN_IDS)})")
    found = _from_findings(target) if target.exists() else None
    if found is not None:
        feats, trace, shas, version = found
        name = Path(trace).name
    else:
        job = load_job(target)
        feats = extract(job).vector.model_dump(mode="json")
        trace, shas, version, name = str(target.resolve()), [r.sha256 for r in job.info.ranks], FEATURE_SCHEMA_VERSION, job.info.name
    rec = {
        "trace": trace, "job": name, "trace_sha256": shas, "pattern": pattern,
        "verdict": "positive" if verdict else "negative", "note": note,
        "at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "feature_schema_version": version, "features": feats,
    }
    store = labels_path(store)
    store.parent.mkdir(parents=True, exist_ok=True)
    with store.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec, sort_keys=True) + "\n")
    return rec


def read(store: Path = DEFAULT_LABELS) -> list[dict[str, Any]]:
    if not store.is_file():
        return []
    out = []
    for line in store.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            out.append(json.loads(line))
    return out


def cases(store: Path = DEFAULT_LABELS) -> list[LabelledCase]:
    """One training case per labelled trace."""
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for r in read(store):
        key = ",".join(r.get("trace_sha256") or []) or r["trace"]
        by_trace.setdefault(key, []).append(r)
    out = []
    for key, recs in by_trace.items():
        recs.sort(key=lambda r: r["at"])
        last = recs[-1]
        feats, version = last["features"], last.get("feature_schema_version", FEATURE_SCHEMA_VERSION)
        if version != FEATURE_SCHEMA_VERSION and Path(last["trace"]).exists():
            try:
                feats = extract(load_job(Path(last["trace"]))).vector.model_dump(mode="json")
                version = FEATURE_SCHEMA_VERSION
            except Exception:
                pass
        labels = {r["pattern"]: r["verdict"] for r in recs}
        out.append(LabelledCase(
            case_id=f"verdict-{key[:16]}", source="verdict", group=f"verdict:{key[:16]}", weight=VERDICT_WEIGHT,
            feature_schema_version=version, features=feats, labels=full_labels(labels),
            provenance={"trace": last["trace"], "trace_sha256": last.get("trace_sha256"),
                        "verdicts": [{k: r[k] for k in ("pattern", "verdict", "note", "at")} for r in recs]},
        ))
    return out
