"""Rules alone vs model alone vs the ensemble: on the corpus's held-out part and on the real traces.

Real traces (../shared/traces, LABELS.yaml kinds trace / rank-set) are never trained on directly
(only through augmentations, grouped by trace). Their feature vectors are cached by file hash and
feature-schema version (training_data/cache/, not committed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..detect.ensemble import decide, guard
from ..detect.rules import Rule, load_rules
from ..features import FEATURE_SCHEMA_VERSION, extract
from ..load import load_job
from ..models import PATTERN_IDS
from ..paths import TRAINING_DATA_DIR
from .cases import LabelledCase
from .featurize import full_features
from .metrics import coverage, macro_f1, pr_auc, prf

DEFAULT_CACHE = TRAINING_DATA_DIR / "cache"


# --- rule and ensemble verdicts on feature dicts ---------------------------------------------------------------

def rule_matrix(features: list[dict[str, Any]], rules: list[Rule]) -> tuple[np.ndarray, np.ndarray]:
    """(fires, guard) boolean matrices [n cases x PATTERN_IDS]."""
    by_id = {r.id: r for r in rules}
    fires = np.zeros((len(features), len(PATTERN_IDS)), dtype=bool)
    guards = np.zeros_like(fires)
    for i, f in enumerate(features):
        for j, p in enumerate(PATTERN_IDS):
            r = by_id.get(p)
            if r is None:
                continue
            fires[i, j] = r.evaluate(f) is not None
            guards[i, j] = guard(r, f)
    return fires, guards


def label_matrix(cases: list[LabelledCase]) -> np.ndarray:
    """+1 positive, 0 negative, NaN unknown."""
    y = np.full((len(cases), len(PATTERN_IDS)), np.nan)
    for i, c in enumerate(cases):
        for j, p in enumerate(PATTERN_IDS):
            lab = c.label(p)
            if lab == "positive":
                y[i, j] = 1.0
            elif lab == "negative":
                y[i, j] = 0.0
    return y


def score_labels(y: np.ndarray, rules: np.ndarray, prob: dict[str, np.ndarray], guards: np.ndarray,
                 meta_labels: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-label metrics of rules, model and ensemble on rows with known labels."""
    out: dict[str, dict[str, Any]] = {}
    for j, p in enumerate(PATTERN_IDS):
        known = ~np.isnan(y[:, j])
        yy = y[known, j].astype(int)
        m: dict[str, Any] = {"support_pos": int((yy == 1).sum()), "support_neg": int((yy == 0).sum())}
        r = rules[known, j]
        m["rules"] = prf(yy, r)
        info = meta_labels.get(p)
        if info is not None and p in prob:
            q = prob[p][known]
            m["model"] = prf(yy, q >= info["threshold"])
            m["model"]["pr_auc"] = pr_auc(yy, q)
            ens = np.array([decide(bool(a), float(b), info.get("add_threshold", 1.01), bool(g))
                            for a, b, g in zip(r, q, guards[known, j])], dtype=bool)
            m["ensemble"] = prf(yy, ens)
        else:  # no model for this label: model abstains, the ensemble is the rules
            m["model"] = None
            m["ensemble"] = dict(m["rules"])
        m["rules"]["pr_auc"] = pr_auc(yy, r.astype(float))
        out[p] = m
    return out


def summarize(per_label: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Macro-F1 of rules, model and ensemble over one label set (the labels with both classes in the cases):
    a label without a booster scores as the rules there (what inference does). `model_covered` is the
    model's mean over its own labels only (informative, not comparable across models)."""
    out: dict[str, Any] = {k: macro_f1(per_label, k) for k in ("rules", "model", "ensemble")}
    out["model_covered"] = macro_f1(per_label, "model", fallback=None)
    return out


def evaluate_cases(bundle, cases: list[LabelledCase], rules: list[Rule] | None = None) -> dict[str, Any]:
    rules = rules if rules is not None else load_rules()
    feats = [full_features(c.features) for c in cases]
    fires, guards = rule_matrix(feats, rules)
    y = label_matrix(cases)
    prob = bundle.probabilities(feats) if (bundle is not None and cases) else {}
    per = score_labels(y, fires, prob, guards, bundle.labels if bundle is not None else {})
    return {"per_label": per, "macro_f1": summarize(per), "coverage": coverage(per), "n": len(cases)}


# --- real traces -----------------------------------------------------------------------------------------------

def _sha_of(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def real_entries(traces: Path) -> list[dict[str, Any]]:
    labels_file = traces / "LABELS.yaml"
    if not labels_file.is_file():
        return []
    out = []
    for rel, meta in (yaml.safe_load(labels_file.read_text()) or {}).items():
        if meta.get("kind") not in ("trace", "rank-set"):
            continue
        lab = {p: "positive" for p in meta.get("positive") or []}
        lab.update({p: "negative" for p in meta.get("negative") or []})
        out.append({"rel": rel, "labels": lab})
    return out


def extractor_fingerprint() -> str:
    """A hash of the load and features stages' source: cached features are stale when either changes."""
    import zoomer_ar.features as features_pkg
    import zoomer_ar.load as load_pkg

    h = hashlib.sha256()
    for pkg in (load_pkg, features_pkg):
        for f in sorted(Path(pkg.__file__).parent.glob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def real_features(traces: Path, cache_dir: Path | None = DEFAULT_CACHE) -> list[dict[str, Any]]:
    """LABELS.yaml traces with their feature vectors (cached by content hash, schema version and the
    extractor's source fingerprint)."""
    entries = real_entries(traces)
    cache: dict[str, Any] = {}
    cache_file = (cache_dir / f"real-features-{FEATURE_SCHEMA_VERSION}-{extractor_fingerprint()}.jsonl"
                  if cache_dir else None)
    if cache_file and cache_file.is_file():
        for line in cache_file.read_text().splitlines():
            rec = json.loads(line)
            cache[rec["key"]] = rec["features"]
    new = []
    for e in entries:
        path = traces / e["rel"]
        if not path.exists():
            continue
        key = f"{e['rel']}::{_sha_of(path)}"
        if key not in cache:
            cache[key] = extract(load_job(path)).vector.model_dump(mode="json")
            new.append({"key": key, "features": cache[key]})
        e["features"] = cache[key]
    if cache_file and new:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        with cache_file.open("a") as fh:
            for rec in new:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
    return [e for e in entries if "features" in e]


def evaluate_real(bundle, traces: Path, cache_dir: Path | None = DEFAULT_CACHE, rules: list[Rule] | None = None,
                  entries: list[dict[str, Any]] | None = None, exclude: set[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Every labelled (trace, pattern): is each of rules / model / ensemble right?

    Where the model has no booster for a pattern it abstains and the rules stand in (what inference does):
    the item's `model` is the rules' verdict and `model_abstained` is true. Pairs in `exclude` (trained on
    through a human verdict, see train.verdict_real_pairs) are left out of the counts and listed in `excluded`."""
    rules = rules if rules is not None else load_rules()
    entries = entries if entries is not None else real_features(traces, cache_dir)
    feats = [full_features(e["features"]) for e in entries]
    fires, guards = rule_matrix(feats, rules)
    prob = bundle.probabilities(feats) if (bundle is not None and entries) else {}
    items = []
    excluded = []
    exclude = exclude or set()
    for i, e in enumerate(entries):
        for p, lab in sorted(e["labels"].items()):
            if p not in PATTERN_IDS:
                continue
            if (e["rel"], p) in exclude:
                excluded.append({"trace": e["rel"], "pattern": p, "label": lab})
                continue
            j = PATTERN_IDS.index(p)
            want = lab == "positive"
            info = bundle.labels.get(p) if bundle is not None else None
            q = float(prob[p][i]) if info is not None else None
            model = (q >= info["threshold"]) if info is not None else bool(fires[i, j])  # no booster: the rules
            ens = decide(bool(fires[i, j]), q, info.get("add_threshold", 1.01) if info else 1.01, bool(guards[i, j]))
            items.append({"trace": e["rel"], "pattern": p, "label": lab, "probability": None if q is None else round(q, 4),
                          "rules": bool(fires[i, j]) == want, "model": model == want, "model_abstained": info is None,
                          "ensemble": ens == want})
    per: dict[str, dict[str, Any]] = {}
    for it in items:
        m = per.setdefault(it["pattern"], {"positive": 0, "negative": 0, "rules": 0, "model": 0, "ensemble": 0})
        m[it["label"]] += 1
        for k in ("rules", "model", "ensemble"):
            m[k] += int(bool(it[k]))
    total = len(items)
    return {
        "items": items, "per_label": per, "labelled": total,
        "correct": {k: sum(int(bool(it[k])) for it in items) for k in ("rules", "model", "ensemble")},
        "model_abstained": sum(int(it["model_abstained"]) for it in items),
        "excluded": excluded,
        "ensemble_holds_all": all(it["ensemble"] for it in items),
    }


# --- tables -------------------------------------------------------------------------------------------------------

def format_corpus_table(ev: dict[str, Any], title: str) -> str:
    lines = [title, f"{'label':25s} {'pos':>5s} {'neg':>5s} | {'rules P/R/F1':>17s} | {'model P/R/F1':>17s} {'PR-AUC':>6s} | {'ensemble P/R/F1':>17s}"]
    for p, m in ev["per_label"].items():
        def f(x, pos=m["support_pos"]):
            if not x:
                return "        -        "
            # undefined where there is nothing to divide by: no positive case (recall, F1), nothing fired (precision)
            prec = f"{x['precision']:.2f}" if x.get("tp", 0) + x.get("fp", 0) > 0 else "-"
            rec, f1 = (f"{x['recall']:.2f}", f"{x['f1']:.2f}") if pos > 0 else ("-", "-")
            return f"{prec}/{rec}/{f1}".rjust(17)
        auc = m["model"]["pr_auc"] if m.get("model") and m["model"].get("pr_auc") is not None else None
        lines.append(f"{p:25s} {m['support_pos']:5d} {m['support_neg']:5d} | {f(m['rules'])} | {f(m.get('model'))} "
                     f"{('%.2f' % auc) if auc is not None else '-':>6s} | {f(m['ensemble'])}")
    mf = ev["macro_f1"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    cov = ev.get("coverage")
    lines.append(f"macro-F1 over {cov['scored'] if cov else '?'} labels: rules {fmt(mf['rules'])}  model {fmt(mf['model'])}  "
                 f"ensemble {fmt(mf['ensemble'])}"
                 + (f"  (model - rules: {mf['model'] - mf['rules']:+.3f})" if mf["model"] is not None and mf["rules"] is not None else ""))
    if cov:
        lines.append(f"model coverage: a booster for {len(cov['covered'])} of {cov['scored']} scored labels"
                     + (f"; scored as the rules (no booster): {', '.join(cov['rules_fallback'])}" if cov["rules_fallback"] else ""))
    return "\n".join(lines)


def format_real_table(ev: dict[str, Any]) -> str:
    lines = ["Real traces (LABELS.yaml): labels right / labelled",
             f"{'label':25s} {'pos':>4s} {'neg':>4s} | {'rules':>6s} {'model':>6s} {'ensemble':>8s}"]
    for p in PATTERN_IDS:
        m = ev["per_label"].get(p)
        if not m:
            continue
        n = m["positive"] + m["negative"]
        lines.append(f"{p:25s} {m['positive']:4d} {m['negative']:4d} | {m['rules']:3d}/{n:<2d} {m['model']:3d}/{n:<2d} {m['ensemble']:5d}/{n:<2d}")
    c = ev["correct"]
    lines.append(f"total {ev['labelled']}: rules {c['rules']}  model {c['model']}  ensemble {c['ensemble']}"
                 f"  -> ensemble holds every label: {'yes' if ev['ensemble_holds_all'] else 'NO'}")
    if ev.get("model_abstained"):
        lines.append(f"(model: {ev['model_abstained']} label(s) with no booster, counted as the rules' verdict)")
    if ev.get("excluded"):
        lines.append(f"left out: {len(ev['excluded'])} (trace, pattern) pair(s) the model trained on through human verdicts: "
                     + "; ".join(f"{x['trace']}: {x['pattern']}" for x in ev["excluded"][:5])
                     + (" ..." if len(ev["excluded"]) > 5 else ""))
    bad = [f"{it['trace']}: {it['pattern']} ({it['label']}, p={it['probability']})" for it in ev["items"] if not it["ensemble"]]
    if bad:
        lines += ["ensemble wrong on:"] + [f"  {b}" for b in bad]
    return "\n".join(lines)
