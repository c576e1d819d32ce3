"""Shape- and dtype-level features from cpu ops recorded with shapes: GEMM alignment and precision,
a convolution with bias feeding batch norm."""

from __future__ import annotations

import numpy as np

from . import names as N
from .context import RankContext, RankFeatures
from .relations import gpu_time_by_op, gpu_time_of, inside


def operator_features(c: RankContext, rf: RankFeatures) -> None:
    """Shape/dtype-level features from cpu ops with record_shapes (GEMM precision/alignment, conv+bn)."""
    t = c.t
    v = rf.v
    cpu_ops = t.mask_cat(*N.CPU_OP_CATS) & c.x
    gemm_ops = np.flatnonzero(cpu_ops & t.mask_name_in(N.GEMM_OPS))
    has_gpu = v.get("has_gpu", False)
    # op time: GPU kernel time when on a GPU, else host op time
    op_times = gpu_time_by_op(c, gemm_ops) if has_gpu else t.dur[gemm_ops]
    times = dict(zip(gemm_ops.tolist(), op_times.tolist()))
    misaligned, mis_time, gemm_time, fp32_time, fp32_ops = [], 0.0, 0.0, 0.0, []
    for i in gemm_ops.tolist():
        dims = t.input_dims.get(i)
        types = t.input_type.get(i) or []
        kn = gemm_kn(t.name_of(i), dims)
        dtype = next((x for x in types if isinstance(x, str) and x), "")
        el = 2 if ("Half" in dtype or "BFloat16" in dtype) else 8 if dtype == "double" else 4 if dtype else 0
        dur = times[i]
        gemm_time += dur
        if dtype == "float":
            fp32_time += dur
            fp32_ops.append(i)
        if kn and el:
            req = 16 // el
            if any(x % req for x in kn if x > 0):
                misaligned.append(i)
                mis_time += dur
    v["misaligned_gemm_ops"] = len(misaligned)
    if c.window is not None:  # the shares' numerators and denominator, for features/windows.py
        v["_w_gemm_ops"] = (int(gemm_ops.size), gemm_time, mis_time, fp32_time)
    if gemm_ops.size and gemm_time > 0:
        v["misaligned_gemm_share"] = mis_time / gemm_time
        v["misaligned_gemm_ms_total"] = mis_time / 1000.0
        mis = np.asarray(misaligned, dtype=np.int64)
        rf.evidence["misaligned_gemm"] = c.worst(  # the ops that cost most: GPU time on a GPU, as the impact counts
            mis, key=np.asarray([times[i] for i in misaligned], dtype=np.float64),
            detail=lambda i: f"shapes {t.input_dims.get(i)}" + (f", GPU time {times[i] / 1000.0:,.4f} ms" if has_gpu else ""),
        )
        if not has_gpu:  # CPU trace: precision from op dtypes
            v["gemm_ms_total"] = gemm_time / 1000.0
            v["fp32_gemm_ms_total"] = fp32_time / 1000.0
            v["fp32_gemm_share"] = fp32_time / gemm_time
            v["_gemm_source"] = "host ops"
            rf.evidence["fp32_gemm"] = c.worst(
                np.asarray(fp32_ops, dtype=np.int64), detail=lambda i: f"fp32 inputs, shapes {t.input_dims.get(i)}"
            )
    # conv (with bias) directly followed by batch norm
    convs = np.flatnonzero(cpu_ops & t.mask_name_in(N.CONV_OPS))
    pairs: list[int] = []
    bias_time = 0.0
    if convs.size:
        layer = np.flatnonzero(cpu_ops & t.mask_name_in(N.LAYER_OPS))
        for tid in np.unique(t.tid[convs]):
            lay = layer[t.tid[layer] == tid]
            lay = lay[np.argsort(t.ts[lay], kind="stable")]
            lay_ts = t.ts[lay]
            for i in convs[t.tid[convs] == tid]:
                dims = t.input_dims.get(int(i))
                if not (isinstance(dims, list) and len(dims) > 2 and dims[2]):
                    continue
                k = np.searchsorted(lay_ts, c.end[i] - 1e-6)
                # skip ops nested inside the convolution
                while k < lay.size and lay_ts[k] < c.end[i]:
                    k += 1
                if k < lay.size and t.name_of(int(lay[k])) in N.BN_OPS:
                    pairs.append(int(i))
        if pairs:
            adds = np.flatnonzero(cpu_ops & t.mask_name_in(("aten::add_", "aten::add")))
            bias_adds = inside(c, np.asarray(pairs), np.isin(np.arange(len(t)), adds))
            bias_time = (gpu_time_of(c, bias_adds) if has_gpu else float(t.dur[bias_adds].sum()))
    v["conv_bias_bn_pairs"] = len(pairs)
    v["conv_bias_ms_total"] = bias_time / 1000.0
    rf.evidence["conv_bias"] = c.worst(np.asarray(pairs, dtype=np.int64), detail=lambda i: "convolution with bias feeding batch norm")


def gemm_kn(name: str, dims) -> tuple[int, ...] | None:
    """(K, N) of a GEMM op from its Input Dims, or None when shapes are missing."""
    if not isinstance(dims, list):
        return None
    try:
        if name == "aten::mm" and len(dims) >= 2 and len(dims[0]) == 2 and len(dims[1]) == 2:
            return int(dims[0][1]), int(dims[1][1])
        if name == "aten::addmm" and len(dims) >= 3 and len(dims[1]) == 2 and len(dims[2]) == 2:
            return int(dims[1][1]), int(dims[2][1])
        if name == "aten::bmm" and len(dims) >= 2 and len(dims[0]) == 3 and len(dims[1]) == 3:
            return int(dims[0][2]), int(dims[1][2])
        if name == "aten::baddbmm" and len(dims) >= 3 and len(dims[1]) == 3 and len(dims[2]) == 3:
            return int(dims[1][2]), int(dims[2][2])
    except (TypeError, ValueError, IndexError):
        return None
    return None
