"""Human verdicts (`zoomer-ar label`): ./training_data/labels.jsonl (from the current folder), one JSON object per line.

    {"trace": "/abs/path/job_or_trace", "job": "name", "trace_sha256": ["..."], "pattern": "sync-point",
     "verdict": "positive" | "negative", "note": "...", "at": "2026-01-01T00:00:00Z",
     "feature_schema_version": "1.0.0", "features": {...}}

The features are stored with the verdict, so the verdict stays usable when the trace moves; when
the trace is still there and the feature schema changed, `train` re-featurises it. The next
`train` turns the verdicts of one trace into one case (the latest verdict per pattern wins, and
`train` says how many earlier verdicts that overruled: `overruled`), with weight VERDICT_WEIGHT.

Grouping: a verdict joins the group of the trace it judges, whatever produced that group (one key per
trace): the corpus group of a case with the same trace sha256 (a real trace's augmentations `real:<rel>`,
a scenario's recordings `example:<name>`), else `real:<rel>` when the trace is a LABELS.yaml trace under
the real-traces folder, else its own group `verdict:<sha256[:16]>`. So a verdict on a held-out trace is
held out with its augmentations and never splits from them across CV folds.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Callable

from ..errors import InputError, OutputError
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
    """(features, trace path, rank sha256s, feature schema) of an analysed job's findings.json; None when
    `path` is not one. InputError (one line) for a findings.json that `zoomer-ar analyze` did not write."""
    f = path / "findings.json" if path.is_dir() else path
    if f.name != "findings.json" or not f.is_file():
        return None
    from ..features.schema import FeatureVector

    def bad(why: str) -> InputError:
        return InputError(str(f), f"not a findings.json written by `zoomer-ar analyze` ({why}); nothing recorded")

    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(f), f"cannot read it ({exc})") from None
    except ValueError as exc:
        raise bad(f"not valid JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise bad(f"a JSON {type(doc).__name__}, not an object")
    raw = doc.get("features")
    if not isinstance(raw, dict) or not raw:
        raise bad("no 'features' object")
    feats = {k: v for k, v in raw.items() if k != "per_rank"}
    known = [k for k in feats if k in FeatureVector.model_fields]
    if len(known) < max(1, len(FeatureVector.model_fields) // 2):
        raise bad(f"'features' holds {len(known)} of the {len(FeatureVector.model_fields)} feature-vector fields")
    job = doc.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("ranks"), list) or not job["ranks"]:
        raise bad("no 'job' with its 'ranks'")
    shas = [r.get("sha256") if isinstance(r, dict) else None for r in job["ranks"]]
    if not all(isinstance(x, str) and x for x in shas):
        raise bad("a rank without its sha256")
    version = doc.get("feature_schema_version", FEATURE_SCHEMA_VERSION)
    if not isinstance(version, str) or not version:
        raise bad("no feature_schema_version")
    trace = job.get("path") if isinstance(job.get("path"), str) and job.get("path") else str(path)
    return feats, trace, shas, version


def _refeaturised(feats: dict[str, Any], trace: str, shas: list[str], version: str,
                  warn: Callable[[str], None]) -> tuple[dict[str, Any], str]:
    """An analysed job's features in this code's feature schema: those of its findings.json when it has that
    schema, else extracted again from its trace when the trace is still there unchanged (same rank sha256s);
    otherwise the findings.json's, with a warning that `train` cannot use them."""
    if version == FEATURE_SCHEMA_VERSION:
        return feats, version
    why = f"its trace {trace} is gone"
    if Path(trace).exists():
        try:
            job = load_job(Path(trace))
        except InputError as exc:
            why = f"its trace cannot be read again ({exc})"
        else:
            if [r.sha256 for r in job.info.ranks] == shas:
                return extract(job).vector.model_dump(mode="json"), FEATURE_SCHEMA_VERSION
            why = f"its trace {trace} has changed since it was analysed"
    warn(f"this findings.json has feature schema {version}, `train` uses {FEATURE_SCHEMA_VERSION}, and {why}: the "
         "verdict is recorded, but `train` cannot use it until the trace is analysed again with this zoomer-ar and "
         "its new findings.json is labelled")
    return feats, version


def record(target: Path, pattern: str, verdict: bool, note: str = "", store: Path = DEFAULT_LABELS,
           warn: Callable[[str], None] = lambda _msg: None) -> dict[str, Any]:
    """Append one verdict to `store` (see labels_path: a relative path is taken from the current folder).

    A findings.json of another feature schema is featurised again from its trace where it can be (`warn`
    is told when it cannot: `train` skips such a verdict)."""
    if pattern not in PATTERN_IDS:
        raise InputError(pattern, f"not an anti-pattern id ({', '.join(PATTERN_IDS)})")
    found = _from_findings(target) if target.exists() else None
    if found is not None:
        feats, trace, shas, version = found
        feats, version = _refeaturised(feats, trace, shas, version, warn)
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
    if store.is_dir():
        raise OutputError(str(store), "it is a directory (--store names the verdict file)")
    read(store)  # appended to only when every line is a verdict: never to a findings.json or a database given by mistake
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        with store.open("a+b") as fh:
            fh.seek(0, 2)
            sep = b""
            if fh.tell():  # a file edited by hand may lack its last newline: the record would join that line
                fh.seek(-1, 2)
                sep = b"" if fh.read(1) == b"\n" else b"\n"
            fh.write(sep + (json.dumps(rec, sort_keys=True) + "\n").encode("utf-8"))
    except OSError as exc:
        raise OutputError(str(store), exc.strerror or str(exc)) from None
    return rec


def _check_record(r: Any) -> str | None:
    """Why a verdict record cannot be used (None when it can)."""
    if not isinstance(r, dict):
        return f"a JSON {type(r).__name__}, not a verdict object"
    for k, kind in (("trace", str), ("pattern", str), ("verdict", str), ("at", str), ("features", dict)):
        if not isinstance(r.get(k), kind):
            return f"'{k}' missing or not a {kind.__name__}"
    if r["pattern"] not in PATTERN_IDS:
        return f"unknown anti-pattern {r['pattern']!r}"
    if r["verdict"] not in ("positive", "negative"):
        return f"verdict {r['verdict']!r} (expected positive or negative)"
    shas = r.get("trace_sha256")
    if shas is not None and not (isinstance(shas, list) and all(isinstance(x, str) for x in shas)):
        return "'trace_sha256' is not a list of strings"
    return None


def read(store: Path = DEFAULT_LABELS) -> list[dict[str, Any]]:
    """The verdict records; InputError naming the file and line for a line that is not one."""
    store = Path(store)
    if not store.is_file():
        return []
    try:
        text = store.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(store), f"cannot read the verdict file ({exc})") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{store}:{lineno}", f"not a verdict record (invalid JSON: {str(exc).splitlines()[0]})") from None
        why = _check_record(rec)
        if why:
            raise InputError(f"{store}:{lineno}", f"not a verdict record ({why})")
        out.append(rec)
    return out


def trace_groups(corpus_cases: list[LabelledCase]) -> dict[str, str]:
    """rank-file sha256 -> the corpus group of the trace it belongs to (from the cases' provenance)."""
    out: dict[str, str] = {}
    for c in corpus_cases:
        for sha in (c.provenance or {}).get("trace_sha256") or []:
            if isinstance(sha, str) and sha:
                out.setdefault(sha, c.group)
    return out


def real_trace_of(trace: str, traces: Path | None, real_rels: list[str] | tuple[str, ...] = ()) -> str | None:
    """The LABELS.yaml entry (relative path) that the judged trace path is, or lies in; None if none."""
    if traces is None or not real_rels:
        return None
    try:
        rel = Path(trace).resolve().relative_to(Path(traces).resolve()).as_posix()
    except (ValueError, OSError):
        return None
    for r in real_rels:
        if rel == r or rel.startswith(r.rstrip("/") + "/"):
            return r
    return None


def cases(store: Path = DEFAULT_LABELS, groups: dict[str, str] | None = None, traces: Path | None = None,
          real_rels: list[str] | tuple[str, ...] = ()) -> list[LabelledCase]:
    """One training case per labelled trace, grouped with its trace (see the module docstring).

    groups: trace_groups() of the corpus; traces / real_rels: the real-traces folder and its LABELS.yaml
    entries. A case judged on a LABELS.yaml trace carries provenance["real_trace"] = its entry."""
    groups = groups or {}
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for r in read(store):
        key = ",".join(r.get("trace_sha256") or []) or r["trace"]
        by_trace.setdefault(key, []).append(r)
    out = []
    for key, recs in by_trace.items():
        recs.sort(key=lambda r: r["at"])
        last = recs[-1]
        feats, version = last["features"], last.get("feature_schema_version", FEATURE_SCHEMA_VERSION)
        stale = None
        if version != FEATURE_SCHEMA_VERSION:
            stale = f"its trace {last['trace']} is gone"
            if Path(last["trace"]).exists():
                try:
                    feats = extract(load_job(Path(last["trace"]))).vector.model_dump(mode="json")
                    version, stale = FEATURE_SCHEMA_VERSION, None
                except Exception as exc:  # noqa: BLE001 - reported by train with the verdict it drops
                    stale = f"its trace {last['trace']} cannot be read again ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
        labels = {r["pattern"]: r["verdict"] for r in recs}
        shas = sorted(last.get("trace_sha256") or [])
        rel = real_trace_of(last["trace"], traces, real_rels)
        group = next((groups[s] for s in shas if s in groups), None)
        if group is None:
            group = f"real:{rel}" if rel else f"verdict:{key[:16]}"
        if rel is None and group.startswith("real:"):
            rel = group[len("real:"):]
        prov = {"trace": last["trace"], "trace_sha256": last.get("trace_sha256"),
                "verdicts": [{k: r.get(k) for k in ("pattern", "verdict", "note", "at")} for r in recs]}
        if rel:
            prov["real_trace"] = rel
        if stale:
            prov["not_refeaturised"] = stale
        out.append(LabelledCase(
            case_id=f"verdict-{key[:16]}", source="verdict", group=group, weight=VERDICT_WEIGHT,
            feature_schema_version=version, features=feats, labels=full_labels(labels), provenance=prov,
        ))
    return out


def overruled(case: LabelledCase) -> list[dict[str, Any]]:
    """The verdicts of a verdict case that a later verdict on the same trace and pattern contradicts (the
    latest wins in cases()): what a user who labelled one trace twice, differently, should hear about."""
    recs = (case.provenance or {}).get("verdicts") or []  # oldest first, as cases() sorted them
    latest = {r.get("pattern"): r.get("verdict") for r in recs}
    return [r for r in recs if r.get("verdict") != latest[r.get("pattern")]]
