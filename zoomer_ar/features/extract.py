"""Feature extraction for a whole job: per-rank features, cross-rank features, evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..load import Job
from ..load.columns import RankTrace
from ..load.stub import RankStub
from ..models import EvidenceEvent, JobInfo, TimelineBin
from . import names as N
from .names import supports_tf32
from .phases import phases_of, rank_phases, trace_start_unix_s  # phases group (cost attribution)
from .rank import RankFeatures, rank_features
from .schema import FEATURE_SCHEMA_VERSION, FeatureVector


@dataclass
class JobFeatures:
    """The features stage's output: the feature vector plus the evidence behind it."""

    vector: FeatureVector
    evidence: dict[str, list[EvidenceEvent]] = field(default_factory=dict)
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[TimelineBin] = field(default_factory=list)
    schema_version: str = FEATURE_SCHEMA_VERSION


@dataclass
class RankSummary:
    """What the job's features need of one rank: the rank's own features and the few facts of its trace
    that the job's features read. Small and picklable: the streaming path computes it in the process
    that read the rank and sends it instead of the rank's rows (stream/load.py), so a job's memory does
    not grow with its number of ranks. A rank's summary is a function of its trace alone (each rank's
    times have their own base: load.job.rebase_times), so it is the same however the ranks are read."""

    features: RankFeatures
    phases: dict[str, Any]  # phases.rank_phases
    start_unix_s: float | None  # phases.trace_start_unix_s
    runtime_calls: bool  # a GPU-runtime category among the trace's categories (_device_not_recorded)

    def renumbered(self, rank: int) -> "RankSummary":
        """The summary of this rank under the rank number the job gave it (a folder's ranks are numbered
        once all are read: load/folder.py)."""
        rf = self.features
        if rf.rank != rank:
            for evs in rf.evidence.values():
                for e in evs:
                    if e.rank == rf.rank:
                        e.rank = rank
            rf.rank = rank
        return self


def summarise_rank(trace: RankTrace) -> RankSummary:
    return RankSummary(
        features=rank_features(trace),
        phases=rank_phases(trace),
        start_unix_s=trace_start_unix_s(trace),
        runtime_calls=bool(set(N.RUNTIME_CATS) & set(trace.cats)),
    )


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _sum(values: list[Any]) -> float:
    return float(sum(v for v in values if v is not None))


def _per_step(rfs: list[RankFeatures], key: str) -> float:
    """Mean over ranks of (rank total / rank steps)."""
    vals = [rf.v.get(key, 0.0) / rf.v["n_steps"] for rf in rfs if rf.v.get(key) is not None]
    return float(np.mean(vals)) if vals else 0.0


def _per_step_opt(rfs: list[RankFeatures], key: str) -> float | None:
    vals = [rf.v[key] / rf.v["n_steps"] for rf in rfs if rf.v.get(key) is not None]
    return float(np.mean(vals)) if vals else None


_MATCH_CHUNK = 65536


def _exposed_of(rf: RankFeatures, ctype: str) -> np.ndarray:
    """Each collective's time not overlapped by the rank's compute (us); where the summary does not say, the
    whole collective."""
    got = rf.collectives_exposed.get(ctype)
    return got if got is not None else rf.collectives[ctype][1]


def _cross_rank(rfs: list[RankFeatures], out: dict[str, Any]) -> dict[str, list[EvidenceEvent]]:
    evidence: dict[str, list[EvidenceEvent]] = {}
    if len(rfs) < 2:
        return evidence
    steps = np.array([rf.v["step_ms"] for rf in rfs])
    compute = np.array([rf.v.get("compute_ms_total", 0.0) / rf.v["n_steps"] for rf in rfs])
    ranks = [rf.rank for rf in rfs]
    if np.median(steps) > 0:
        out["rank_step_ms_max_over_median"] = float(steps.max() / np.median(steps))
    if compute.max() > 0:
        med = float(np.median(compute))
        out["rank_compute_ms_max_over_median"] = float(compute.max() / med) if med > 0 else None
        out["rank_compute_cv"] = float(compute.std() / compute.mean()) if compute.mean() > 0 else None
        out["compute_imbalance_ms_per_step"] = float(compute.max() - med)
        heavy = int(np.argmax(compute))
        evidence["imbalance"] = [
            EvidenceEvent(
                name=f"rank {ranks[j]} compute {compute[j]:,.3f} ms/step",
                rank=ranks[j], ts_ms=0.0, dur_ms=round(float(compute[j]), 4), category="rank",
                detail="most compute" if j == heavy else "",
            )
            for j in np.argsort(-compute)[:5]
        ]
        out["slowest_rank"] = ranks[heavy]  # until a straggler is found below
        out["most_compute_rank"] = ranks[heavy]
    # straggler: match the k-th collective of each type across ranks; the shortest one arrived last
    caused = np.zeros(len(rfs))  # wait the others spent because this rank was last
    caused_exposed = np.zeros(len(rfs))  # the part of it their own compute did not run alongside
    last_count = np.zeros(len(rfs))
    matched = 0
    worst: list[tuple[float, str, int, int, float]] = []
    for ctype in dict.fromkeys(c for rf in rfs for c in rf.collectives):
        if any(ctype not in rf.collectives for rf in rfs):
            continue
        n = min(rf.collectives[ctype][0].size for rf in rfs)
        for k0 in range(0, n, _MATCH_CHUNK):  # columns of collectives, bounded memory whatever their number
            k1 = min(n, k0 + _MATCH_CHUNK)
            durs = np.stack([rf.collectives[ctype][1][k0:k1] for rf in rfs])  # ranks x collectives
            cols = np.arange(k1 - k0)
            last = np.argmin(durs, axis=0)
            wait = durs - durs[last, cols]
            caused += np.bincount(last, weights=wait.sum(axis=0), minlength=len(rfs)) / max(len(rfs) - 1, 1)
            # a wait sits at the start of the kernel, the transfer after it: compute beside the kernel fills the
            # transfer first, and only what it does not hold there ran during the wait
            free = np.stack([_exposed_of(rf, ctype)[k0:k1] for rf in rfs])
            exposed = np.clip(np.minimum(wait, free), 0.0, None)
            caused_exposed += np.bincount(last, weights=exposed.sum(axis=0), minlength=len(rfs)) / max(len(rfs) - 1, 1)
            last_count += np.bincount(last, minlength=len(rfs))
            matched += k1 - k0
            wmax = wait.max(axis=0)
            for j in np.lexsort((last, cols, wmax))[-5:].tolist():  # this chunk's 5 worst, by the key below
                ts = float(rfs[int(last[j])].collectives[ctype][0][k0 + j])
                worst.append((float(wmax[j]), ctype, k0 + j, int(last[j]), ts))
    if matched:
        s = int(np.argmax(caused))
        out["slowest_rank"] = ranks[s]
        n_steps = np.mean([rf.v["n_steps"] for rf in rfs])
        out["straggler_wait_ms_per_step"] = float(caused[s] / 1000.0 / n_steps)
        out["straggler_exposed_wait_ms_per_step"] = float(caused_exposed[s] / 1000.0 / n_steps)
        out["straggler_last_share"] = float(last_count[s] / matched)
        worst.sort(key=lambda x: x[:4], reverse=True)
        evidence["straggler"] = [
            EvidenceEvent(  # at the late rank's own collective: where it arrived last
                name=f"{ctype} #{k}: others waited up to {w / 1000.0:,.3f} ms for rank {ranks[last]}",
                rank=ranks[last], ts_ms=round((ts - rfs[last].t0) / 1000.0, 4), dur_ms=round(w / 1000.0, 4),
                category="collective",
                detail=f"rank {ranks[last]} had the shortest {ctype}: it arrived last",
            )
            for w, ctype, k, last, ts in worst[:5]
        ]
    return evidence


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf are not measurements: report them as not measurable (None), or 0 where a number is required."""
    out = {}
    for k, v in values.items():
        if isinstance(v, float) and not np.isfinite(v):
            field = FeatureVector.model_fields.get(k)
            v = None if field is not None and field.default is None else 0.0
        out[k] = v
    return out


def _device_not_recorded(summaries: list[RankSummary], devices: list[str]) -> bool:
    """A device the job used (listed in deviceProperties, or called through the GPU runtime) with no
    device event in any rank: the host side alone was recorded."""
    if any(s.features.v.get("has_accelerator") for s in summaries):
        return False
    return bool(devices) or any(s.runtime_calls for s in summaries)


def _summary(trace: RankTrace | RankStub) -> RankSummary:
    if isinstance(trace, RankStub):  # summarised where it was read (stream/load.py)
        return trace.summary.renumbered(trace.rank)
    return summarise_rank(trace)


def extract(job: Job, devices: list[str] | None = None) -> JobFeatures:
    return combine(job.info, [_summary(tr) for tr in job.ranks], devices)


def combine(info: JobInfo, summaries: list[RankSummary], devices: list[str] | None = None) -> JobFeatures:
    """The job's features from its ranks' summaries (in the job's rank order)."""
    rfs = [s.features for s in summaries]
    first = rfs[0]
    devs = sorted({d for r in info.ranks for d in r.devices} | set(devices or []))
    accel = next((r.accelerator for r in info.ranks if r.accelerator not in ("none", "unknown")), "none")
    out: dict[str, Any] = {
        "world_size": info.world_size,
        "n_ranks": len(rfs),
        "has_gpu": any(rf.v.get("has_gpu") for rf in rfs),
        "has_accelerator": any(rf.v.get("has_accelerator") for rf in rfs),
        "accelerator": accel,
        "device_not_recorded": _device_not_recorded(summaries, devs),
        "tf32_capable": bool(devs) and all(supports_tf32(d) for d in devs),
        "has_python_stacks": any(rf.v.get("has_python_stacks") for rf in rfs),
        "profiler_steps": max(rf.v["profiler_steps"] for rf in rfs),
        "wall_ms": max(rf.v["wall_ms"] for rf in rfs),
        "step_ms": float(np.mean([rf.v["step_ms"] for rf in rfs])),
        "step_ms_p50": _mean([rf.v.get("step_ms_p50") for rf in rfs]),
        "step_ms_p95": _mean([rf.v.get("step_ms_p95") for rf in rfs]),
        "first_step_ms": _mean([rf.v.get("first_step_ms") for rf in rfs]),
        "first_profiled_step": min([rf.v["first_profiled_step"] for rf in rfs if rf.v.get("first_profiled_step") is not None],
                                   default=None),
        "step_ms_cv": _mean([rf.v.get("step_ms_cv") for rf in rfs]),
        "gpu_busy_pct": _mean([rf.v.get("gpu_busy_pct") for rf in rfs]),
        "gpu_busy_pct_steady": _mean([rf.v.get("gpu_busy_pct_steady") for rf in rfs]),
        "gpu_span_ms": max([rf.v["gpu_span_ms"] for rf in rfs if "gpu_span_ms" in rf.v], default=None),
        "kernel_count": int(_sum([rf.v.get("kernel_count", 0) for rf in rfs])),
        "kernel_dur_p50_us": _mean([rf.v.get("kernel_dur_p50_us") for rf in rfs]),
        "kernel_dur_p90_us": _mean([rf.v.get("kernel_dur_p90_us") for rf in rfs]),
        "short_kernel_share": _mean([rf.v.get("short_kernel_share") for rf in rfs]),
        "launch_count": int(_sum([rf.v.get("launch_count", 0) for rf in rfs])),
        "launch_dur_p50_us": _mean([rf.v.get("launch_dur_p50_us") for rf in rfs]),
        "kernel_to_launch_ratio": _mean([rf.v.get("kernel_to_launch_ratio") for rf in rfs]),
        "idle_short_gap_share": _mean([rf.v.get("idle_short_gap_share") for rf in rfs]),
        "host_idle_share": _mean([rf.v.get("host_idle_share") for rf in rfs]),
        "comm_overlap_pct": _mean([rf.v.get("comm_overlap_pct") for rf in rfs]),
        "slowest_rank": first.rank if len(rfs) == 1 else None,
        "dataloader_workers": (
            any(rf.v.get("dataloader_workers") for rf in rfs)
            if any(rf.v.get("dataloader_workers") is not None for rf in rfs) else None
        ),
        "memory_growth_bytes_per_step": max(
            [rf.v["memory_growth_bytes_per_step"] for rf in rfs if rf.v.get("memory_growth_bytes_per_step") is not None],
            default=None,
        ),
        "memory_growth_pct": max([rf.v["memory_growth_pct"] for rf in rfs if rf.v.get("memory_growth_pct") is not None], default=None),
        "memory_growth_monotonic": (
            all(rf.v["memory_growth_monotonic"] for rf in rfs if rf.v.get("memory_growth_monotonic") is not None)
            if any(rf.v.get("memory_growth_monotonic") is not None for rf in rfs) else None
        ),
        "memory_peak_bytes": max([rf.v["memory_peak_bytes"] for rf in rfs if rf.v.get("memory_peak_bytes") is not None], default=None),
        "fp32_gemm_share": _mean([rf.v.get("fp32_gemm_share") for rf in rfs]),
        "misaligned_gemm_share": _mean([rf.v.get("misaligned_gemm_share") for rf in rfs]),
    }
    for key in ("memcpy_htod_count", "memcpy_dtoh_count", "memcpy_dtod_count", "memcpy_pageable_count", "memset_count",
                "sync_calls", "item_calls", "optimizer_steps", "optimizer_single_tensor_frames",
                "optimizer_foreach_ops", "optimizer_per_param_ops", "zero_grad_calls", "zero_grad_fill_ops",
                "allocator_calls", "startup_calls", "captured_launches", "startup_compiles", "recompiles", "comm_kernel_count", "memory_events", "misaligned_gemm_ops", "conv_bias_bn_pairs"):
        out[key] = int(_sum([rf.v.get(key, 0) for rf in rfs]))
    has_gpu = out["has_gpu"]
    out["memcpy_dtod_pct_of_gpu_span"] = _mean([rf.v.get("memcpy_dtod_pct_of_gpu_span") for rf in rfs]) or 0.0
    per_step_keys = {
        "gpu_idle_ms_per_step": "gpu_idle_ms_total", "idle_host_ms_per_step": "idle_host_ms_total",
        "idle_sync_ms_per_step": "idle_sync_ms_total", "idle_data_ms_per_step": "idle_data_ms_total",
        "idle_other_ms_per_step": "idle_other_ms_total", "kernel_ms_per_step": "kernel_ms_total",
        "compute_ms_per_step": "compute_ms_total", "memory_exposed_ms_per_step": "memory_exposed_ms_total",
        "launch_ms_per_step": "launch_ms_total", "gpu_idle_outside_span_ms_per_step": "gpu_idle_outside_span_ms_total",
        "idle_startup_ms_per_step": "idle_startup_ms_total",
        "idle_startup_host_ms_per_step": "idle_startup_host_ms_total",
    }
    for out_key, key in per_step_keys.items():
        out[out_key] = _per_step_opt(rfs, key) if has_gpu else None
    kps = [rf.v["kernel_count"] / rf.v["n_steps"] for rf in rfs if "kernel_count" in rf.v]
    out["kernels_per_step"] = float(np.mean(kps)) if kps and has_gpu else None
    for out_key, key in {
        "memcpy_htod_ms_per_step": "memcpy_htod_ms_total", "memcpy_dtoh_ms_per_step": "memcpy_dtoh_ms_total",
        "memcpy_dtod_ms_per_step": "memcpy_dtod_ms_total", "memcpy_pageable_ms_per_step": "memcpy_pageable_ms_total",
        "memset_ms_per_step": "memset_ms_total", "sync_blocked_ms_per_step": "sync_blocked_ms_total",
        "dataloader_ms_per_step": "dataloader_ms_total", "optimizer_ms_per_step": "optimizer_ms_total",
        "zero_grad_fill_ms_per_step": "zero_grad_fill_ms_total",
        "zero_grad_fill_host_ms_per_step": "zero_grad_fill_host_ms_total", "comm_ms_per_step": "comm_ms_total",
        "exposed_comm_ms_per_step": "exposed_comm_ms_total", "gemm_ms_per_step": "gemm_ms_total",
        "fp32_gemm_ms_per_step": "fp32_gemm_ms_total", "misaligned_gemm_ms_per_step": "misaligned_gemm_ms_total",
        "conv_bias_ms_per_step": "conv_bias_ms_total", "cpu_copy_ms_per_step": "cpu_copy_ms_total",
        "cpu_copy_ops_per_step": "cpu_copy_ops", "factory_then_move_per_step": "factory_then_move",
        "sync_calls_per_step": "sync_calls", "item_calls_per_step": "item_calls",
        "recompile_ms_per_step": "recompile_ms_total",
    }.items():
        out[out_key] = _per_step(rfs, key)
    out["zero_grad_fill_gpu_ms_per_step"] = _per_step_opt(rfs, "zero_grad_fill_gpu_ms_total") if has_gpu else None
    out["allocator_calls_per_step"] = float(np.mean([rf.v.get("allocator_calls_per_step", 0.0) for rf in rfs]))
    out["allocator_ms_per_step"] = float(np.mean([rf.v.get("allocator_ms_per_step", 0.0) for rf in rfs]))
    out["dataloader_pct"] = 100.0 * out["dataloader_ms_per_step"] / out["step_ms"] if out["step_ms"] > 0 else 0.0
    out.update(phases_of([s.phases for s in summaries], [s.start_unix_s for s in summaries]))  # phases group
    evidence = _cross_rank(rfs, out)
    chosen_by: dict[int, float] = {}  # each event's ranking key across ranks: its duration unless chosen by another
    for rf in rfs:
        chosen_by.update(rf.evidence_keys)
        for key, evs in rf.evidence.items():
            evidence.setdefault(key, []).extend(evs)
    for key, evs in evidence.items():
        evs.sort(key=lambda e: -chosen_by.get(id(e), e.dur_ms * 1000.0))
        evidence[key] = evs[:8]
    vector = FeatureVector(**_finite(out))
    per_rank = [
        {k: (round(v, 6) if isinstance(v, float) else v) for k, v in rf.v.items() if not k.startswith("_")} | {"rank": rf.rank}
        for rf in rfs
    ]
    return JobFeatures(vector=vector, evidence=evidence, per_rank=per_rank, timeline=first.timeline())
