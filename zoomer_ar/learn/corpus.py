"""`zoomer-ar corpus build`: the labelled training corpus from three reproducible sources.

1. examples  - the scenario programs' recorded CPU traces (examples/traces/<name>, labels from
               training_data/scenarios/MANIFEST.yaml: the planted pattern positive, must_not_show
               negative, incidental unknown), plus step-window crops of each (same labels);
               grouped by scenario (a program and its clean twin share a group).
2. synth     - jobs from the trace generator (zoomer_ar.synth.generator): GPU and multi-rank,
               labelled from what was planted and the cost it caused; one group per job.
3. augment   - real traces from ../shared/traces with a pattern injected (sync gaps, dataloader
               stalls, DtoD copy storms, a delayed rank), labelled by construction; grouped by the
               source trace (its variants never sit on both sides of a split).
(4. human verdicts from `zoomer-ar label` are added by `train`, not stored here.)

Every case goes through the real load stage and feature extractor. Deterministic for a seed;
work is spread over `workers` processes (results kept in task order).
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..errors import InputError
from ..features import FEATURE_SCHEMA_VERSION, extract
from ..load import Job, load_job
from ..load.columns import PH_META, RankTrace
from ..models import PATTERN_IDS
from ..paths import PROJECT_DIR, TRAINING_DATA_DIR
from ..synth import augment as A
from ..synth.documents import load_documents
from ..synth.generator import GENERATOR_VERSION, generate
from ..load.reader import file_sha256
from .cases import LabelledCase, full_labels, read_cases, write_cases

DEFAULT_OUT = TRAINING_DATA_DIR / "corpus"
DEFAULT_TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", PROJECT_DIR.parent / "shared" / "traces"))
DEFAULT_EXAMPLES = PROJECT_DIR / "examples" / "traces"
DEFAULT_MANIFEST = TRAINING_DATA_DIR / "scenarios" / "MANIFEST.yaml"
WINDOWS = (None, (0, 3), (1, 4), (2, 5), (0, 4), (1, 5))
AUG_OPS = ("sync-point", "dataloader-bound", "extra-copy", "straggler")
# small, fast real backgrounds for the CI-sized corpus
SMALL_SOURCES = (
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens/h100/Falconsai_nsfw_image_detection__1016002.json.gz",
    "tracelens/inference/vllm_decode_full/graph_execution.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
)


@dataclass
class BuildConfig:
    n_synth: int = 4600
    augment_per_source: int = 24
    seed: int = 0
    workers: int = 2
    traces: str = str(DEFAULT_TRACES)
    examples: str = str(DEFAULT_EXAMPLES)
    manifest: str = str(DEFAULT_MANIFEST)
    small: bool = False
    sources: list[str] = field(default_factory=list)  # augmentation backgrounds (default: LABELS.yaml GPU traces)

    def command(self) -> str:
        parts = ["zoomer-ar corpus build", f"--n-synth {self.n_synth}", f"--augment {self.augment_per_source}",
                 f"--seed {self.seed}", f"--workers {self.workers}"]
        if self.small:
            parts.append("--small")
        return " ".join(parts)


# --- examples -----------------------------------------------------------------------------------------

def crop(t: RankTrace, t0: float, t1: float) -> RankTrace:
    """The events of a trace inside [t0, t1] (sparse per-event columns re-indexed)."""
    end = t.ts + t.dur
    keep = ((t.ts >= t0 - 0.5) & (end <= t1 + 0.5)) | (t.ph == PH_META)
    new_index = np.cumsum(keep) - 1
    c = A.clone_trace(t)
    for name in ("ts", "dur", "ph", "cat", "name", "pid", "tid", "correlation", "stream", "device", "external_id",
                 "nbytes", "total_allocated"):
        setattr(c, name, getattr(t, name)[keep])
    for name in ("input_dims", "input_type", "call_stack", "collective", "msg_nelems", "python_id"):
        d = getattr(t, name)
        setattr(c, name, {int(new_index[i]): v for i, v in d.items() if keep[i]})
    return c


def _example_case(task: tuple) -> LabelledCase | None:
    _, name, window, labels, group, folder = task
    job = load_job(Path(folder) / name, name=name)
    if window is not None:
        from ..features import names as N
        ranks = []
        for t in job.ranks:
            steps = np.flatnonzero(t.mask_names(N.is_profiler_step) & (t.ph == 1) & ~t.mask_cat("gpu_user_annotation"))
            steps = steps[np.argsort(t.ts[steps])]
            if steps.size < window[1]:
                return None
            ranks.append(crop(t, float(t.ts[steps[window[0]]]), float((t.ts + t.dur)[steps[window[1] - 1]])))
        job = Job(info=job.info, ranks=ranks)
    jf = extract(job)
    suffix = "" if window is None else f"@{window[0]}-{window[1]}"
    return LabelledCase(
        case_id=f"example-{name}{suffix}", source="example", group=group,
        feature_schema_version=FEATURE_SCHEMA_VERSION, features=jf.vector.model_dump(mode="json"),
        labels=full_labels(labels),
        provenance={"example": name, "window": list(window) if window else None,
                    "trace_sha256": [r.sha256 for r in job.info.ranks],
                    "manifest": "training_data/scenarios/MANIFEST.yaml"},
    )


def example_tasks(cfg: BuildConfig) -> list[tuple]:
    manifest = Path(cfg.manifest)
    folder = Path(cfg.examples)
    if not manifest.is_file() or not folder.is_dir():
        return []
    m = yaml.safe_load(manifest.read_text()) or {}
    tasks = []
    for name, s in (m.get("scenarios") or {}).items():
        if not (folder / name).is_dir():
            continue
        labels = {p: "negative" for p in s.get("must_not_show") or []}
        for p in s.get("incidental") or []:
            labels[p] = "unknown"
        if s.get("pattern") in PATTERN_IDS:
            labels[s["pattern"]] = "positive"
        group = "example:" + (s.get("twin_of") or name)
        for w in (WINDOWS[:2] if cfg.small else WINDOWS):
            tasks.append(("example", name, w, labels, group, str(folder)))
    return tasks


# --- synthetic --------------------------------------------------------------------------------------------

def _synth_case(task: tuple) -> LabelledCase:
    _, seed = task
    g = generate(seed)
    job = load_documents(g.documents, f"synth-{seed}")
    jf = extract(job)
    return LabelledCase(
        case_id=f"synth-{seed}", source="synth", group=f"synth:{seed}",
        feature_schema_version=FEATURE_SCHEMA_VERSION, features=jf.vector.model_dump(mode="json"),
        labels=full_labels(g.labels), costs=g.costs,
        provenance={"generator": {"version": GENERATOR_VERSION, "seed": seed, "spec": g.spec.to_dict()},
                    "trace_sha256": [r.sha256 for r in job.info.ranks], "truth": g.truth},
    )


# --- augmentation -----------------------------------------------------------------------------------------

_JOBS: dict[str, Job] = {}


def _source_job(traces: str, rel: str) -> Job:
    key = f"{traces}::{rel}"
    if key not in _JOBS:
        if len(_JOBS) > 3:
            _JOBS.clear()
        _JOBS[key] = load_job(Path(traces) / rel)
    return _JOBS[key]


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _augment_case(task: tuple) -> LabelledCase | None:
    _, traces, rel, k, base_labels, seed = task
    job = _source_job(traces, rel)
    rng = np.random.default_rng([seed, int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16), k])
    base = job.ranks[0]
    anat = A.anatomy(base)
    if anat is None:
        return None
    ops = [o for o in AUG_OPS if o != "straggler" or anat.collectives.size]
    op = ops[k % len(ops)]
    wall = A.wall_us(base)
    target = _loguniform(rng, 0.002, 0.6)  # injected cost as a share of the original wall time
    busy_before = float(np.mean([b for b in (A.busy_pct(t) for t in job.ranks) if b is not None]))
    params: dict[str, Any] = {"op": op, "target_share": round(target, 5)}
    if op == "straggler":
        world = int(rng.choice([2, 4]))
        per = target * wall / max(anat.collectives.size, 1)
        out = A.delay_rank(job, rng, world, per)
        if out is None:
            return None
        new_job, total_wait, late = out
        new_wall = A.wall_us(new_job.ranks[(late + 1) % world])
        cost = 100.0 * total_wait / new_wall
        params.update(world=world, delay_per_collective_us=round(per, 3), late_rank=late)
        inserted = total_wait
    else:
        ranks = []
        inserted = 0.0
        for t in job.ranks:
            c = A.clone_trace(t)
            r2 = np.random.default_rng([seed, k, 7])  # same injection on every rank
            steps = max(anat.n_steps, 1)
            if op == "sync-point":
                n = int(r2.integers(1, 5)) * steps
                ins = A.inject_sync(c, r2, n, target * wall / n)
                params.update(n=n)
            elif op == "dataloader-bound":
                workers = bool(r2.random() < 0.5)
                ins = A.inject_dataloader(c, r2, target * wall / steps, workers)
                params.update(workers=workers)
            else:
                n = int(r2.integers(5, 400))
                ins = A.inject_dtod(c, r2, n, target * wall / n)
                params.update(n=n)
            inserted = max(inserted, ins)
            ranks.append(c)
        new_job = Job(info=job.info, ranks=ranks)
        new_wall = max(A.wall_us(t) for t in ranks)
        cost = 100.0 * inserted / new_wall
    busy_after = [b for b in (A.busy_pct(t) for t in new_job.ranks) if b is not None]
    labels = A.relabel(base_labels, op, cost, inserted / max(wall, 1e-9), busy_before,
                       float(np.mean(busy_after)) if busy_after else None)
    if op != "straggler" and len(new_job.ranks) < 2:
        labels["straggler"] = base_labels.get("straggler", "unknown")
    if op == "straggler":
        labels["sharding-imbalance"] = "negative"  # identical clones
    jf = extract(new_job)
    return LabelledCase(
        case_id=f"augment-{rel}#{k}", source="augment", group=f"real:{rel}",
        feature_schema_version=FEATURE_SCHEMA_VERSION, features=jf.vector.model_dump(mode="json"),
        labels=full_labels(labels), costs={op: round(cost, 3)},
        provenance={"real_trace": rel, "trace_sha256": [r.sha256 for r in job.info.ranks],
                    "augmentation": {**params, "inserted_us": round(inserted, 3), "cost_pct": round(cost, 3)}},
    )


def real_sources(cfg: BuildConfig) -> list[tuple[str, dict[str, str]]]:
    labels_file = Path(cfg.traces) / "LABELS.yaml"
    if not labels_file.is_file():
        return []
    labels = yaml.safe_load(labels_file.read_text()) or {}
    out = []
    for rel, meta in labels.items():
        if meta.get("kind") not in ("trace", "rank-set"):
            continue
        if cfg.sources and rel not in cfg.sources:
            continue
        if cfg.small and not cfg.sources and rel not in SMALL_SOURCES:
            continue
        lab = {p: "positive" for p in meta.get("positive") or []}
        lab.update({p: "negative" for p in meta.get("negative") or []})
        out.append((rel, lab))
    return out


def augment_tasks(cfg: BuildConfig) -> list[tuple]:
    return [("augment", cfg.traces, rel, k, lab, cfg.seed)
            for rel, lab in real_sources(cfg) for k in range(cfg.augment_per_source)]


# --- build ------------------------------------------------------------------------------------------------------

def _run(task: tuple) -> LabelledCase | None:
    kind = task[0]
    if kind == "synth":
        return _synth_case(task)
    if kind == "example":
        return _example_case(task)
    return _augment_case(task)


def build(cfg: BuildConfig, out_dir: Path = DEFAULT_OUT, log=print) -> dict[str, Any]:
    t_start = time.time()
    ex = example_tasks(cfg)
    aug = augment_tasks(cfg)
    syn = [("synth", cfg.seed * 1_000_000 + i) for i in range(cfg.n_synth)]
    log(f"corpus: {len(ex)} example, {len(aug)} augmentation, {len(syn)} synthetic jobs on {cfg.workers} worker(s)")
    cases: list[LabelledCase] = []
    timings: dict[str, float] = {}
    ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
    with ctx.Pool(max(1, cfg.workers)) if cfg.workers > 1 else _Serial() as pool:
        for name, tasks, chunk in (("example", ex, 2), ("augment", aug, max(1, cfg.augment_per_source)),
                                   ("synth", syn, 25)):
            t0 = time.time()
            for c in pool.imap(_run, tasks, chunksize=chunk):
                if c is not None:
                    cases.append(c)
            timings[name] = round(time.time() - t0, 2)
            log(f"  {name}: {sum(1 for c in cases if c.source == name)} cases in {timings[name]:.1f} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "corpus.jsonl"
    write_cases(path, cases)
    manifest = {
        "command": cfg.command(),
        "config": asdict(cfg),
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "generator_version": GENERATOR_VERSION,
        "cases": len(cases),
        "by_source": {s: sum(1 for c in cases if c.source == s) for s in ("example", "synth", "augment")},
        "labels": label_counts(cases),
        "build_seconds": round(time.time() - t_start, 2),
        "seconds_by_source": timings,
        "sha256": file_sha256(path),
        "file": path.name,
    }
    (out_dir / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def label_counts(cases: list[LabelledCase]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {p: {"positive": 0, "negative": 0, "unknown": 0} for p in PATTERN_IDS}
    for c in cases:
        for p in PATTERN_IDS:
            out[p][c.label(p)] += 1
    return out


class _Serial:
    """Pool stand-in for workers=1 (no process start-up; easier to debug)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap(self, fn, tasks, chunksize=1):
        return map(fn, tasks)


def corpus_file(path: Path) -> Path:
    """The corpus JSONL of `path` (a corpus folder or the file itself); InputError when there is none."""
    path = Path(path)
    if path.is_dir():
        f = path / "corpus.jsonl"
        if not f.is_file():
            raise InputError(str(path), "no corpus.jsonl in this folder: build one with `zoomer-ar corpus build`")
        return f
    if not path.exists():
        raise InputError(str(path), "no such corpus file or folder: build one with `zoomer-ar corpus build`")
    if not path.is_file():
        raise InputError(str(path), "not a corpus file")
    return path


def load_corpus(path: Path) -> list[LabelledCase]:
    """Every case of a corpus (folder or JSONL file); InputError (one line) for a missing or malformed corpus."""
    return list(read_cases(corpus_file(path)))
