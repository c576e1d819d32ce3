"""The model registry on disk: models/<version>/..., models/CURRENT, models/HISTORY.jsonl.

`promote` makes a version current only through the gate:
  0. the version loads (meta.json and every booster) and its feature schema is compatible with this
     code's (detect.ensemble.schema_compatible, the rule inference uses): else InputError, exit 2;
  1. real traces: the candidate's ensemble gets right every LABELS.yaml label that the rules or the
     current ensemble get right (it loses none); (trace, pattern) pairs either model trained on
     through a human verdict are left out;
  2. labels: the candidate has a booster for every label the current model has one for (unless
     allow_dropped_labels);
  3. corpus: on one common set of cases (the held-out part of the candidate's corpus and of the
     current model's corpus, deduplicated) and one label set (every label with both classes there),
     the candidate's macro-F1 is not below the current model's; a label a model has no booster for
     scores as the rules alone (what the ensemble does). No held-out case at all is a failure.
Promoting the version that is already current does nothing but check that it still loads (one
error naming what is broken otherwise, --force or not). `rollback` returns to the version
promoted before the current one (or to rules only).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from ..detect.ensemble import schema_compatible, schema_mismatch_reason
from ..errors import InputError
from .cases import LabelledCase, held_out
from .corpus import load_corpus
from .evaluate import DEFAULT_CACHE, evaluate_cases, evaluate_real, real_features
from .model import ModelBundle


class GateError(Exception):
    pass


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def current(root: Path) -> str | None:
    """The version models/CURRENT names (as written: one that is not a version here is the caller's to
    report; bytes that are not UTF-8 are replaced, never an error that would block `promote` mending it)."""
    try:
        v = (root / "CURRENT").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return v or None


def history(root: Path) -> list[dict[str, Any]]:
    f = root / "HISTORY.jsonl"
    if not f.is_file():
        return []
    out = []
    for lineno, line in enumerate(f.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{f}:{lineno}", f"not a history record ({str(exc).splitlines()[0]})") from None
        if not isinstance(rec, dict) or "action" not in rec:
            raise InputError(f"{f}:{lineno}", "not a history record (no 'action')")
        out.append(rec)
    return out


def _append_history(root: Path, rec: dict[str, Any]) -> None:
    with (root / "HISTORY.jsonl").open("a") as fh:
        fh.write(json.dumps(rec, sort_keys=True) + "\n")


def _set_current(root: Path, version: str | None) -> None:
    p = root / "CURRENT"
    if version is None:
        if p.exists():
            p.unlink()
        return
    tmp = root / ".CURRENT.tmp"
    tmp.write_text(version + "\n")
    tmp.replace(p)


def versions(root: Path) -> list[dict[str, Any]]:
    out = []
    cur = current(root)
    for d in sorted(root.glob("v*")):
        meta_f = d / "meta.json"
        if not meta_f.is_file():
            continue
        try:
            meta = json.loads(meta_f.read_text())
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            out.append({"version": d.name, "current": d.name == cur, "error": f"{meta_f}: unreadable ({str(exc).splitlines()[0]})"})
            continue
        mf = (meta.get("held_out") or {}).get("macro_f1", {})
        out.append({"version": d.name, "current": d.name == cur, "created": meta.get("created"),
                    "data_hash": meta.get("data", {}).get("hash", "")[:12], "cases": meta.get("data", {}).get("cases"),
                    "macro_f1_model": mf.get("model"), "macro_f1_rules": mf.get("rules"),
                    "macro_f1_ensemble": mf.get("ensemble"), "feature_schema_version": meta.get("feature_schema_version"),
                    "promotion": meta.get("promotion")})
    return out


def _stack(root: Path) -> list[str]:
    """Promoted versions, oldest first, with rolled-back ones removed."""
    st: list[str] = []
    for rec in history(root):
        if rec["action"] == "promote":
            st.append(rec["version"])
        elif rec["action"] == "rollback" and st:
            st.pop()
    return st


def load_version(root: Path, version: str) -> ModelBundle:
    """A version for promotion or evaluation: loads (ModelLoadError, one line, otherwise) and its feature schema
    is one this code can run (the same rule as inference); InputError otherwise."""
    d = Path(root) / version
    bundle = ModelBundle(d)
    if not schema_compatible(bundle.feature_schema_version):
        raise InputError(str(d), schema_mismatch_reason(version, bundle.feature_schema_version))
    return bundle


def _intact(root: Path, version: str) -> int:
    """The current version still loads as analyses load it (meta.json, every booster, a feature schema this
    code runs): its number of boosters; else one InputError naming what is broken (--force changes nothing:
    promoting it again would not mend it)."""
    try:
        return len(load_version(root, version).boosters)
    except InputError as exc:
        raise InputError(exc.path, f"{exc.reason}: {version} is the current model but does not load, so analyses "
                                   "use the rules alone; mend it, `models rollback`, or promote another version") from None


def _corpus_of(bundle: ModelBundle) -> Path:
    from .train import resolve_project_path

    return resolve_project_path(bundle.meta.get("data", {}).get("corpus", ""))


def common_held_out(bundles: list[ModelBundle], schema: str) -> tuple[list[LabelledCase], dict[str, Any]]:
    """The held-out cases of every bundle's corpus, deduplicated (same case id and features), of one feature
    schema: the common set two models are compared on. Also {corpus: cases taken} and missing corpora."""
    seen: set[tuple[str, str]] = set()
    out: list[LabelledCase] = []
    info: dict[str, Any] = {"corpora": {}, "missing": []}
    for b in bundles:
        corpus = _corpus_of(b)
        if str(corpus) in info["corpora"]:
            continue
        if not corpus.is_file():
            info["missing"].append(str(corpus))
            continue
        n = 0
        for c in load_corpus(corpus):
            if c.source == "verdict" or not held_out(c.group) or c.feature_schema_version != schema:
                continue
            key = (c.case_id, json.dumps(c.features, sort_keys=True, default=str))
            if key in seen:
                continue
            seen.add(key)
            out.append(c)
            n += 1
        info["corpora"][str(corpus)] = n
    return out, info


def _pairs(bundle: ModelBundle | None) -> set[tuple[str, str]]:
    if bundle is None:
        return set()
    return {(a, b) for a, b in (bundle.meta.get("data", {}).get("verdict_real_pairs") or [])}


def gate(root: Path, version: str, traces: Path, cache_dir: Path | None = DEFAULT_CACHE,
         allow_dropped_labels: bool = False) -> dict[str, Any]:
    """Check a candidate against the current model and the rules; returns the report (ok: bool, reasons).

    InputError (not a refusal) when the candidate cannot be loaded or is for another feature schema."""
    cand = load_version(root, version)
    cur_v = current(root)
    reasons: list[str] = []
    notes: list[str] = []
    cur = None
    if cur_v and cur_v != version:
        try:
            cur = load_version(root, cur_v)
        except InputError as exc:  # the current one is unusable: at inference it is the rules alone
            notes.append(f"current model {cur_v} is not usable ({exc.reason}): compared with the rules alone")
    report: dict[str, Any] = {"candidate": version, "current": cur_v if cur is not None else None}
    # label coverage
    cand_labels, cur_labels = sorted(cand.labels), sorted(cur.labels) if cur is not None else []
    dropped = [p for p in cur_labels if p not in cand.labels]
    report["coverage"] = {"candidate": cand_labels, "current": cur_labels if cur is not None else None,
                          "dropped": dropped, "added": [p for p in cand_labels if cur is not None and p not in cur.labels]}
    if dropped:
        msg = (f"drops {len(dropped)} label(s) the current model {cur_v} has a booster for: {', '.join(dropped)}"
               " (--allow-dropped-labels to accept: they fall back to the rules)")
        if allow_dropped_labels:
            notes.append("allowed: " + msg.split(" (--allow")[0])
        else:
            reasons.append(msg)
    # 1. real traces
    entries = real_features(traces, cache_dir)
    if not entries:
        reasons.append(f"no labelled real traces found at {traces}: cannot check the real-trace condition")
    else:
        exclude = _pairs(cand) | _pairs(cur)
        ev_c = evaluate_real(cand, traces, cache_dir, entries=entries, exclude=exclude)
        ev_cur = evaluate_real(cur, traces, cache_dir, entries=entries, exclude=exclude) if cur is not None else None
        lost = []
        for k, it in enumerate(ev_c["items"]):
            rules_ok = it["rules"]
            cur_ok = ev_cur["items"][k]["ensemble"] if ev_cur is not None else False
            if (rules_ok or cur_ok) and not it["ensemble"]:
                lost.append(f"{it['trace']}: {it['pattern']} ({it['label']}; right by "
                            f"{'rules' if rules_ok else 'current model'}, candidate p={it['probability']})")
        report["real"] = {"labelled": ev_c["labelled"], "candidate": ev_c["correct"],
                          "current": ev_cur["correct"] if ev_cur else None, "lost": lost,
                          "excluded": [f"{a}: {b}" for a, b in sorted(exclude)]}
        if exclude:
            notes.append(f"real-trace check leaves out {len(exclude)} (trace, pattern) pair(s) trained on through human verdicts")
        if lost:
            reasons.append(f"loses {len(lost)} real-trace label(s): " + "; ".join(lost[:5]))
    # 2. held-out corpus: one common set of cases, one label set
    held, info = common_held_out([cand] + ([cur] if cur is not None else []), cand.feature_schema_version)
    for m in info["missing"]:
        notes.append(f"corpus {m} not found: its held-out cases are not in the comparison")
    if not held:
        reasons.append("no held-out corpus cases to compare on (corpus missing, or none of feature schema "
                       f"{cand.feature_schema_version}): cannot check held-out macro-F1")
    else:
        ev_c = evaluate_cases(cand, held)
        f_c = ev_c["macro_f1"]["model"]
        report["held_out"] = {"cases": len(held), "corpora": info["corpora"], "labels": ev_c["coverage"]["scored"],
                              "candidate": ev_c["macro_f1"], "candidate_coverage": ev_c["coverage"]}
        if cur is not None:
            ev_cur = evaluate_cases(cur, held)
            f_cur = ev_cur["macro_f1"]["model"]
            report["held_out"]["current"] = ev_cur["macro_f1"]
            report["held_out"]["current_coverage"] = ev_cur["coverage"]
            if f_c is None or (f_cur is not None and f_c < f_cur - 1e-9):
                reasons.append(f"held-out macro-F1 drops: {f_cur} (current {cur_v}) -> {f_c} ({version}) on {len(held)} "
                               f"common cases, {ev_c['coverage']['scored']} labels")
        elif f_c is None:
            reasons.append(f"held-out macro-F1 undefined: no label has both classes among the {len(held)} held-out cases")
    report["notes"] = notes
    report["ok"] = not reasons
    report["reasons"] = reasons
    return report


GATE_KEYS = ("ok", "reasons", "notes", "coverage", "real", "held_out")


def promote(root: Path, version: str, traces: Path, cache_dir: Path | None = DEFAULT_CACHE, force: bool = False,
            allow_dropped_labels: bool = False) -> dict[str, Any]:
    if not (root / version / "meta.json").is_file():
        raise GateError(f"no model version {version} in {root}")
    if current(root) == version:  # nothing to do: no gate, no history record (a rollback must undo a real change)
        return {"candidate": version, "noop": True, "ok": True, "reasons": [], "boosters": _intact(root, version)}
    report = gate(root, version, traces, cache_dir, allow_dropped_labels)
    if not report["ok"] and not force:
        raise GateError("promotion refused: " + " | ".join(report["reasons"]))
    _set_current(root, version)
    _append_history(root, {"action": "promote", "version": version, "at": _now(), "forced": bool(force and not report["ok"]),
                           "gate": {k: report.get(k) for k in GATE_KEYS}})
    meta_f = root / version / "meta.json"
    meta = json.loads(meta_f.read_text())
    meta["promotion"] = {"at": _now(), "gate": {k: report.get(k) for k in GATE_KEYS}}
    from ..render.report import atomic_write

    atomic_write(meta_f, json.dumps(meta, indent=1, sort_keys=True) + "\n")  # whole or not at all: it is current now
    try:
        from .card import write_card

        write_card(root / version)
    except Exception:  # the card is documentation; never block a promotion on it
        pass
    return report


def rollback(root: Path) -> str | None:
    st = _stack(root)
    if not st:
        raise GateError("nothing to roll back: no promoted version")
    prev = st[-2] if len(st) >= 2 else None
    _set_current(root, prev)
    _append_history(root, {"action": "rollback", "version": st[-1], "to": prev, "at": _now()})
    return prev
