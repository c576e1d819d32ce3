"""The model registry on disk: models/<version>/..., models/CURRENT, models/HISTORY.jsonl.

`promote` makes a version current only through the gate:
  1. real traces: the candidate's ensemble gets right every LABELS.yaml label that the rules or the
     current ensemble get right (it loses none);
  2. corpus: the candidate model's macro-F1 on the held-out part of its corpus is not below the
     current model's on the same cases.
`rollback` returns to the version promoted before the current one (or to rules only).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from .cases import held_out
from .corpus import load_corpus
from .evaluate import DEFAULT_CACHE, evaluate_cases, evaluate_real, real_features
from .model import ModelBundle


class GateError(Exception):
    pass


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def current(root: Path) -> str | None:
    try:
        v = (root / "CURRENT").read_text().strip()
    except OSError:
        return None
    return v or None


def history(root: Path) -> list[dict[str, Any]]:
    f = root / "HISTORY.jsonl"
    if not f.is_file():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


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
        meta = json.loads(meta_f.read_text())
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


def gate(root: Path, version: str, traces: Path, cache_dir: Path | None = DEFAULT_CACHE) -> dict[str, Any]:
    """Check a candidate against the current model and the rules; returns the report (ok: bool, reasons)."""
    cand = ModelBundle(root / version)
    cur_v = current(root)
    cur = ModelBundle(root / cur_v) if cur_v and cur_v != version and (root / cur_v / "meta.json").is_file() else None
    reasons: list[str] = []
    report: dict[str, Any] = {"candidate": version, "current": cur_v if cur is not None else None}
    # 1. real traces
    entries = real_features(traces, cache_dir)
    if not entries:
        reasons.append(f"no labelled real traces found at {traces}: cannot check the real-trace condition")
    else:
        ev_c = evaluate_real(cand, traces, cache_dir, entries=entries)
        ev_cur = evaluate_real(cur, traces, cache_dir, entries=entries) if cur is not None else None
        lost = []
        for k, it in enumerate(ev_c["items"]):
            rules_ok = it["rules"]
            cur_ok = ev_cur["items"][k]["ensemble"] if ev_cur is not None else False
            if (rules_ok or cur_ok) and not it["ensemble"]:
                lost.append(f"{it['trace']}: {it['pattern']} ({it['label']}; right by "
                            f"{'rules' if rules_ok else 'current model'}, candidate p={it['probability']})")
        report["real"] = {"labelled": ev_c["labelled"], "candidate": ev_c["correct"],
                          "current": ev_cur["correct"] if ev_cur else None, "lost": lost}
        if lost:
            reasons.append(f"loses {len(lost)} real-trace label(s): " + "; ".join(lost[:5]))
    # 2. held-out corpus
    from .train import resolve_project_path

    corpus = resolve_project_path(cand.meta["data"]["corpus"])
    if not corpus.is_file():
        reasons.append(f"corpus {corpus} not found: cannot compare held-out macro-F1")
    else:
        held = [c for c in load_corpus(corpus) if c.source != "verdict" and held_out(c.group)
                and c.feature_schema_version == cand.feature_schema_version]
        ev_c = evaluate_cases(cand, held)
        f_c = ev_c["macro_f1"]["model"]
        report["held_out"] = {"cases": len(held), "candidate": ev_c["macro_f1"]}
        if cur is not None:
            ev_cur = evaluate_cases(cur, held)
            f_cur = ev_cur["macro_f1"]["model"]
            report["held_out"]["current"] = ev_cur["macro_f1"]
            if f_c is None or (f_cur is not None and f_c < f_cur - 1e-9):
                reasons.append(f"held-out macro-F1 drops: {f_cur} (current {cur_v}) -> {f_c} ({version})")
    report["ok"] = not reasons
    report["reasons"] = reasons
    return report


def promote(root: Path, version: str, traces: Path, cache_dir: Path | None = DEFAULT_CACHE, force: bool = False) -> dict[str, Any]:
    if not (root / version / "meta.json").is_file():
        raise GateError(f"no model version {version} in {root}")
    report = gate(root, version, traces, cache_dir)
    if not report["ok"] and not force:
        raise GateError("promotion refused: " + " | ".join(report["reasons"]))
    _set_current(root, version)
    _append_history(root, {"action": "promote", "version": version, "at": _now(), "forced": bool(force and not report["ok"]),
                           "gate": {k: report.get(k) for k in ("ok", "reasons", "real", "held_out")}})
    meta_f = root / version / "meta.json"
    meta = json.loads(meta_f.read_text())
    meta["promotion"] = {"at": _now(), "gate": {k: report.get(k) for k in ("ok", "reasons", "real", "held_out")}}
    meta_f.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
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
