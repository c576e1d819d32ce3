"""Fit the generator's timing distributions to the real traces and write `params.json`.

    python -m zoomer_ar.synth.fit [--traces ../shared/traces] [--out zoomer_ar/synth/params.json]

For every labelled GPU trace (LABELS.yaml kinds `trace` and `rank-set`) it measures, on the
columnar trace from the real loader:

- compute-kernel durations (collectives excluded): log-normal fit (mu, sigma of ln us) and a
  21-point quantile table of ln(duration) used for inverse-CDF sampling;
- kernel-launch API call durations (cudaLaunchKernel & co): log-normal + quantiles;
- host time between consecutive launch calls on one thread (< 2 ms: per-operator dispatch cost);
- launch-to-start latency of kernels that found their stream idle;
- memcpy bandwidth (bytes / duration) by kind (HtoD, DtoH, DtoD), memset durations;
- collective (NCCL) kernel durations; kernels per step; GPU idle-gap lengths; the GPU model.

Each trace becomes one "profile"; `pooled` fits everything together. The generator draws a
profile per synthetic job, so synthetic timings follow the real hardware/software mixes.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..features import intervals as iv
from ..features import names as N
from ..load import load_job
from ..load.columns import INT_NONE, PH_COMPLETE

PARAMS_PATH = Path(__file__).with_name("params.json")
QUANTILES = np.linspace(0, 100, 21)


def _lognormal(values: np.ndarray) -> dict[str, Any] | None:
    v = values[np.isfinite(values) & (values > 0)]
    if v.size < 5:
        return None
    lv = np.log(v)
    return {
        "mu": round(float(lv.mean()), 4),
        "sigma": round(float(lv.std()), 4),
        "n": int(v.size),
        "log_quantiles": [round(float(q), 4) for q in np.percentile(lv, QUANTILES)],
    }


def measure_trace(path: Path) -> dict[str, Any] | None:
    """Timing figures of one trace file or rank folder (None when it has no GPU kernels)."""
    job = load_job(path)
    kern_d, launch_d, gaps, lat, comm_d, idle_gaps, memset_d = [], [], [], [], [], [], []
    bw: dict[str, list[np.ndarray]] = {"htod": [], "dtoh": [], "dtod": []}
    kernels = steps = 0
    for t in job.ranks:
        x = t.ph == PH_COMPLETE
        kern = np.flatnonzero(t.mask_cat(*N.KERNEL_CATS) & x)
        if kern.size == 0:
            continue
        comm_codes = t.name_codes(N.is_comm_kernel)
        is_comm = np.isin(t.name[kern], comm_codes) if comm_codes.size else np.zeros(kern.size, bool)
        kern_d.append(t.dur[kern[~is_comm]])
        comm_d.append(t.dur[kern[is_comm]])
        kernels += int((~is_comm).sum())
        steps += max(1, int((t.mask_names(N.is_profiler_step) & ~t.mask_cat("gpu_user_annotation") & x).sum()))
        runtime = t.mask_cat(*N.RUNTIME_CATS) & x
        launch = np.flatnonzero(runtime & t.mask_names(N.is_launch))
        launch_d.append(t.dur[launch])
        for tid in np.unique(t.tid[launch]):
            ls = np.sort(t.ts[launch[t.tid[launch] == tid]])
            le = np.sort((t.ts + t.dur)[launch[t.tid[launch] == tid]])
            if ls.size > 1:
                g = ls[1:] - le[:-1]
                gaps.append(g[(g > 0) & (g < 2000)])
        # launch latency for kernels that started on an idle stream
        corr_l = t.correlation[launch]
        order = np.argsort(corr_l)
        corr_sorted, launch_sorted = corr_l[order], launch[order]
        for s in np.unique(t.stream[kern]):
            ks = kern[t.stream[kern] == s]
            ks = ks[np.argsort(t.ts[ks])]
            prev_end = np.concatenate([[-np.inf], (t.ts + t.dur)[ks][:-1]])
            idle_start = t.ts[ks] > prev_end + 1.0
            want = t.correlation[ks]
            pos = np.clip(np.searchsorted(corr_sorted, want), 0, max(corr_sorted.size - 1, 0))
            if corr_sorted.size:
                hit = (corr_sorted[pos] == want) & (want != INT_NONE) & idle_start
                d = t.ts[ks][hit] - t.ts[launch_sorted[pos[hit]]]
                lat.append(d[(d > 0) & (d < 5000)])
        mc = np.flatnonzero(t.mask_cat(*N.MEMCPY_CATS) & x)
        for i in mc:
            kind = N.memcpy_kind(t.name_of(int(i)))
            if kind in bw and t.dur[i] > 0 and np.isfinite(t.nbytes[i]) and t.nbytes[i] > 1 << 16:
                bw[kind].append(np.array([t.nbytes[i] / (t.dur[i] * 1e3)]))  # GB/s
        ms = np.flatnonzero(t.mask_cat(*N.MEMSET_CATS) & x)
        memset_d.append(t.dur[ms])
        gpu = np.flatnonzero(t.mask_cat(*N.GPU_CATS) & x)
        us, ue = iv.union(t.ts[gpu], t.ts[gpu] + t.dur[gpu])
        g0, g1 = iv.gaps(us, ue)
        idle_gaps.append(g1 - g0)
    if not kern_d:
        return None
    cat = lambda xs: np.concatenate(xs) if xs else np.empty(0)  # noqa: E731
    devices = sorted({d for r in job.info.ranks for d in r.devices})
    out = {
        "device": devices[0] if devices else "",
        "kernels_per_step": round(kernels / max(steps, 1), 1),
        "kernel_us": _lognormal(cat(kern_d)),
        "launch_us": _lognormal(cat(launch_d)),
        "host_gap_us": _lognormal(cat(gaps)),
        "launch_latency_us": _lognormal(cat(lat)),
        "comm_us": _lognormal(cat(comm_d)),
        "idle_gap_us": _lognormal(cat(idle_gaps)),
        "memset_us": _lognormal(cat(memset_d)),
        "bandwidth_gbps": {k: round(float(np.median(cat(v))), 2) for k, v in bw.items() if v},
    }
    return out


def _pool(profiles: dict[str, dict[str, Any]], key: str) -> dict[str, Any] | None:
    fits = [p[key] for p in profiles.values() if p.get(key)]
    if not fits:
        return None
    n = np.array([f["n"] for f in fits], dtype=float)
    w = n / n.sum()
    mu = float((w * np.array([f["mu"] for f in fits])).sum())
    var = float((w * (np.array([f["sigma"] for f in fits]) ** 2 + (np.array([f["mu"] for f in fits]) - mu) ** 2)).sum())
    q = np.array([f["log_quantiles"] for f in fits])
    return {"mu": round(mu, 4), "sigma": round(math.sqrt(var), 4), "n": int(n.sum()),
            "log_quantiles": [round(float(v), 4) for v in (w[:, None] * q).sum(axis=0)]}


def fit(traces: Path) -> dict[str, Any]:
    labels = yaml.safe_load((traces / "LABELS.yaml").read_text())
    profiles: dict[str, dict[str, Any]] = {}
    for rel, meta in labels.items():
        if meta.get("kind") not in ("trace", "rank-set"):
            continue
        m = measure_trace(traces / rel)
        if m is None or not m.get("kernel_us") or not m.get("launch_us"):
            continue
        profiles[rel] = m
    pooled = {key: _pool(profiles, key) for key in
              ("kernel_us", "launch_us", "host_gap_us", "launch_latency_us", "comm_us", "idle_gap_us", "memset_us")}
    bws: dict[str, list[float]] = {}
    for p in profiles.values():
        for k, v in p["bandwidth_gbps"].items():
            bws.setdefault(k, []).append(v)
    pooled["bandwidth_gbps"] = {k: round(float(np.median(v)), 2) for k, v in bws.items()}
    return {
        "about": "Timing distributions fitted to the real traces by `python -m zoomer_ar.synth.fit`; "
                 "times in microseconds, log-normal (mu, sigma of ln us) plus 21 quantiles of ln(us).",
        "source": "LABELS.yaml traces of kind trace / rank-set with GPU kernels",
        "profiles": profiles,
        "pooled": pooled,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_traces = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
    ap.add_argument("--traces", type=Path, default=default_traces)
    ap.add_argument("--out", type=Path, default=PARAMS_PATH)
    args = ap.parse_args(argv)
    params = fit(args.traces)
    args.out.write_text(json.dumps(params, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {len(params['profiles'])} profiles")
    for rel, p in params["profiles"].items():
        k, lch = p["kernel_us"], p["launch_us"]
        print(f"  {rel[:60]:60s} kernel p50 {math.exp(k['log_quantiles'][10]):8.1f} us  launch p50 "
              f"{math.exp(lch['log_quantiles'][10]):6.1f} us  kernels/step {p['kernels_per_step']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
