"""Synthetic GPU and multi-rank training jobs with planted anti-patterns, labelled by their cost.

`sample_spec(seed)` draws a job: a timing profile fitted to one real trace (params.json), world
size, steps, architecture, precision, input pipeline, optimizer, communication schedule, and 0-3
planted anti-patterns with a severity; patterns forced by the caller shape the job so that each
can show (a multi-rank pattern gets ranks, an optimizer pattern a training job, conv-bias-before-bn
a CNN, a GEMM pattern a model with matmuls). `JobModel(spec).program(off)` turns it into the host program every
rank runs for the simulator (`sim.py`); `off` switches knobs off for the counterfactual runs.

Labels (`label_job`) follow LABELS.yaml: a planted pattern is *positive* when the time it costs
(wall time of the job with it minus without it, same random draws) is >= 5% of the wall time,
*negative* when absent or < 1%, *unknown* in between, or when the view cannot show it (a
single-rank file cannot show a straggler). idle-gpu and launch-bound are judged by utilisation as
LABELS.yaml says (GPU busy < 50% / > 90%; typical kernel shorter than its launch and the launch
path dominating the idle time / busy > 95%); exposed-communication by the collective transfer time
not hidden behind compute (waiting for late ranks excluded); memory-growth by the planted leak.
straggler's cost is that of every lagging rank: the planted host delay and any rank whose launch
latency or start is above the median rank's (every multi-rank job draws its ranks' latencies), both
switched off in its counterfactual, so a job is a straggler positive without the plant too.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..models import PATTERN_IDS
from . import sim

PARAMS_PATH = Path(__file__).with_name("params.json")
# 2: the fp32-matmul plant slows matmuls only (a CNN's FP32 convolutions were labelled fp32-matmul,
#    which analyze rightly does not count: cuDNN's precision is cudnn.allow_tf32's); CNNs draw no GEMM plant
# 3: straggler's counterfactual also brings every rank's launch latency and start down to the median rank's:
#    a rank whose kernels reach its GPU later (a launch-delay straggler, drawn with every multi-rank job) made the
#    others wait at every collective, up to 21% of the wall time, and was labelled by the planted delay alone
#    (negative where none was planted or the planted one was hidden)
GENERATOR_VERSION = "3"
POSITIVE_PCT = 5.0
NEGATIVE_PCT = 1.0
MIB = float(1 << 20)

# knobs whose cost is measured by a counterfactual run (pattern id -> knob switched off)
COUNTERFACTUAL = (
    "dataloader-bound", "pageable-memcpy", "extra-copy", "sync-point", "allocator-churn", "fp32-matmul",
    "misaligned-gemm", "single-tensor-optimizer", "zero-grad-not-none", "conv-bias-before-bn", "straggler",
    "sharding-imbalance",
)
PLANTABLE = COUNTERFACTUAL + ("exposed-communication", "memory-growth", "launch-bound", "idle-gpu")
MULTI_RANK = ("straggler", "sharding-imbalance", "exposed-communication")
# the ranks' own lag (launch latency and start above the median rank's): switched off with straggler's plant
# when labelling, never when calibrating (the unplanted step keeps the ranks as drawn)
RANK_LAG = "rank-lag"
TRAIN_ONLY = ("single-tensor-optimizer", "zero-grad-not-none", "memory-growth", "dataloader-bound", "allocator-churn")
GEMM_PLANTS = ("fp32-matmul", "misaligned-gemm")  # they change matmul kernels: a CNN here has none


class SpecError(InputError, ValueError):
    """A job the generator cannot draw: a seed that is not an int >= 0, a pattern it cannot plant,
    or forced patterns no one job can show together."""

    def __init__(self, reason: str):
        super().__init__(None, reason)

    def __reduce__(self):
        return (type(self), (self.reason,))


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SpecError(f"seed must be an integer >= 0, not {seed!r}")
    return int(seed)


def _check_plants(plants: list[str]) -> list[str]:
    unknown = sorted({str(p) for p in plants} - set(PLANTABLE))
    if unknown:
        raise SpecError(f"cannot plant {', '.join(unknown)}: the generator plants {', '.join(sorted(PLANTABLE))}")
    gemm = sorted(set(plants) & set(GEMM_PLANTS))
    if gemm and "conv-bias-before-bn" in plants:
        raise SpecError(f"conv-bias-before-bn needs a CNN and {', '.join(gemm)} a model with matmuls (the generated "
                        "CNNs have none): plant them in separate jobs")
    return sorted(set(plants))

GEMM_NAMES = {
    "fp32": {"volta": "volta_sgemm_128x64_nn", "ampere": "ampere_sgemm_128x64_tn", "hopper": "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "turing": "turing_sgemm_128x64_nn"},
    "fast": {"volta": "volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", "ampere": "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "hopper": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "turing": "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn"},
}
CONV_NAMES = {
    "fp32": "void cudnn::cnn::implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)",
    "fast": "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_stage4_warpsize2x2x1_g1_tensor16x8x16_kernel_cudnn",
}
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::{f}, at::detail::Array<char*, {n}> >(int, at::native::{f}, at::detail::Array<char*, {n}>)"
K_RELU = EW.format(f="(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}", n=2)
K_GELU = EW.format(f="GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(float)#1}", n=2)
K_ADD = EW.format(f="CUDAFunctor_add<float>", n=3)
K_MUL = EW.format(f="BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >", n=3)
K_FILL = EW.format(f="FillFunctor<float>", n=1)
K_LN = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)"
K_BN = "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, float)"
K_SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)"
K_NLL = "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)"
K_FOREACH = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, bool, float*, float*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, bool, float*, float*)"
K_REDUCE = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)"
NCCL_OLD = "ncclKernel_{C}_RING_LL_Sum_float(ncclWorkElem)"
NCCL_NEW = "ncclDevKernel_{C}_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SINGLE_TENSOR_OPS = ("aten::mul_", "aten::add_", "aten::addcmul_", "aten::sqrt", "aten::addcdiv_")


@lru_cache(maxsize=1)
def load_params() -> dict[str, Any]:
    return json.loads(PARAMS_PATH.read_text())


def _rng(seed: int, *keys: Any) -> np.random.Generator:
    return np.random.default_rng([seed] + [zlib.crc32(str(k).encode()) for k in keys])


def _arch_of(device: str) -> str:
    low = device.lower()
    if "v100" in low:
        return "volta"
    if "2080" in low or "t4" in low:
        return "turing"
    if "h100" in low or "h200" in low or "b200" in low:
        return "hopper"
    return "ampere"


class Dist:
    """Inverse-CDF sampler over a fitted quantile table of ln(us)."""

    def __init__(self, fit: dict[str, Any], lo: float = 0.0, hi: float = 1.0):
        self.q = np.asarray(fit["log_quantiles"], dtype=float)
        self.p = np.linspace(0.0, 1.0, self.q.size)
        self.lo, self.hi = lo, hi

    def sample(self, rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
        u = rng.uniform(self.lo, self.hi, size=n)
        return np.exp(np.interp(u, self.p, self.q)) * scale


class Draws:
    """Pre-drawn random streams of one program component (deterministic; Python floats from lists).

    Each component (forward, optimizer, a plant...) draws from its own streams, so switching one knob
    off for a counterfactual leaves every other component's draws exactly as they were."""

    CHUNK = 256

    def __init__(self, model: "JobModel", *key: Any):
        self.m = model
        self.key = key
        self.pools: dict[str, tuple[np.random.Generator, list[float], int]] = {}

    def _next(self, kind: str) -> float:
        rng, vals, i = self.pools.get(kind) or (_rng(self.m.s.seed, kind, *self.key), [], 0)
        if i >= len(vals):
            if kind == "gap":
                vals = self.m.gap.sample(rng, self.CHUNK).tolist()
            elif kind == "launch":
                vals = self.m.launch.sample(rng, self.CHUNK).tolist()
            elif kind == "kern":
                vals = self.m.kern.sample(rng, self.CHUNK).tolist()
            elif kind == "jit":
                vals = np.clip(rng.normal(1.0, 0.03, self.CHUNK), 0.9, 1.1).tolist()
            else:
                vals = rng.uniform(0.0, 1.0, self.CHUNK).tolist()
            i = 0
        self.pools[kind] = (rng, vals, i + 1)
        return vals[i]

    def gap(self) -> float:
        return self._next("gap")

    def launch(self) -> float:
        return self._next("launch")

    def kern(self) -> float:
        return self._next("kern")

    def jit(self) -> float:
        return self._next("jit")

    def uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self._next("unif")


@dataclass
class JobSpec:
    seed: int
    profile: str
    device: str
    world: int = 1
    emit_ranks: list[int] = field(default_factory=lambda: [0])
    steps: int = 4
    mode: str = "train"
    arch: str = "mlp"
    layers: int = 8
    kscale: float = 1.0
    gemm_mult: float = 6.0
    host_scale: float = 1.0
    precision: str = "fast"
    fp32_factor: float = 1.0
    misaligned_frac: float = 0.0
    misaligned_factor: float = 1.0
    dataloader: bool = True
    workers: bool = True
    dl_base_us: float = 100.0
    dl_stall_us: float = 0.0
    input_bytes: float = 4 * MIB
    pageable: bool = False
    dtod_natural: int = 0
    dtod_plant: int = 0
    dtod_plant_bytes: float = 0.0
    step_end_item: bool = False
    sync_items: int = 0
    sync_host_us: float = 0.0
    alloc_pairs: int = 0
    alloc_us: float = 0.0
    optimizer: str = "foreach"
    zero_grad_fill: bool = False
    conv_bias: bool = False
    profile_memory: bool = False
    leak_bytes: float = 0.0
    base_mem_bytes: float = 1e9
    with_stack: bool = False
    buckets: int = 0
    comm_ratio: float = 0.0
    comm_schedule: str = "overlap"
    nccl_new: bool = False
    straggler_rank: int = -1
    straggler_us: float = 0.0
    imbalance_rank: int = -1
    imbalance_factor: float = 1.0
    planted: list[str] = field(default_factory=list)
    tags: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def sample_spec(seed: int, plants: list[str] | None = None) -> JobSpec:
    """Draw a job. `plants` forces the planted patterns (else 0-3 drawn at random) and shapes the job
    so that each can show; SpecError for a bad seed, an unknown pattern or patterns that conflict."""
    seed = _check_seed(seed)
    forced = set(_check_plants(plants)) if plants is not None else set()
    fit = _rng(seed, "fit")  # draws for the forced patterns' needs: the unforced draws stay as they were
    params = load_params()
    rng = _rng(seed, "spec")
    names = sorted(params["profiles"])
    profile = names[int(rng.integers(len(names)))]
    dev = params["profiles"][profile].get("device") or "NVIDIA A100-SXM4-80GB"
    world = int(rng.choice([1, 1, 1, 1, 2, 2, 2, 4, 4, 8]))
    mode = "train" if rng.random() < 0.85 else "infer"
    if forced & set(MULTI_RANK + TRAIN_ONLY):
        mode = "train"
    if forced & set(MULTI_RANK) and world == 1:
        world = int(fit.choice([2, 4, 8]))
    if mode == "infer":
        world = 1
    s = JobSpec(seed=seed, profile=profile, device=dev, world=world, mode=mode)
    s.emit_ranks = list(range(world)) if (world == 1 or rng.random() < 0.75) else [0]
    if forced & {"straggler", "sharding-imbalance"}:  # one rank's file cannot show another rank's lag
        s.emit_ranks = list(range(world))
    s.steps = int(rng.choice([0, 1, 3, 3, 4, 4, 5])) if mode == "train" else int(rng.choice([0, 1, 1, 3]))
    if "memory-growth" in forced:
        s.steps = max(s.steps, 3)  # growth shows over three steps or more
    s.arch = str(rng.choice(["mlp", "transformer", "cnn"]))
    if "conv-bias-before-bn" in forced:
        s.arch = "cnn"
    elif forced & set(GEMM_PLANTS) and s.arch == "cnn":
        s.arch = str(fit.choice(["mlp", "transformer"]))
    max_layers = {1: 24, 2: 16, 4: 10, 8: 6}[world]
    s.layers = int(rng.integers(3, max_layers + 1))
    s.kscale = float(np.clip(rng.lognormal(0.4, 0.9), 0.05, 30.0))
    s.gemm_mult = float(np.clip(rng.lognormal(1.6, 0.6), 1.5, 40.0))
    s.host_scale = float(np.clip(rng.lognormal(0.0, 0.45), 0.3, 5.0))
    s.nccl_new = bool(rng.random() < 0.4)
    s.dataloader = mode == "train" and rng.random() < 0.85
    s.workers = bool(rng.random() < 0.7)
    s.dl_base_us = _loguniform(rng, 20, 400)
    s.input_bytes = _loguniform(rng, 64 << 10, 64 * MIB)
    s.dtod_natural = int(rng.choice([0, 0, 0, 1, 2, 4, 8]))
    s.step_end_item = mode == "train" and rng.random() < 0.7  # loss.item() for logging: a per-step sync
    s.profile_memory = mode == "train" and rng.random() < 0.35
    s.base_mem_bytes = _loguniform(rng, 2e8, 2e10)
    s.with_stack = bool(rng.random() < 0.4)
    if world > 1:
        s.buckets = int(rng.integers(1, 6))
        s.comm_ratio = _loguniform(rng, 0.02, 0.5)
    # the launch-bound regime: tiny kernels, a slow host
    if rng.random() < 0.18:
        s.kscale = float(rng.uniform(0.05, 0.4))
        s.gemm_mult = float(rng.uniform(1.5, 4.0))
        s.host_scale = float(rng.uniform(1.0, 4.0))
        s.tags["regime"] = "small-kernels"
    if plants is None:
        k = int(rng.choice([0, 1, 1, 2, 2, 2, 3]))
        pool = [p for p in PLANTABLE if p not in ("launch-bound", "idle-gpu")]
        if world == 1:
            pool = [p for p in pool if p not in MULTI_RANK]
        if mode == "infer":
            pool = [p for p in pool if p not in ("single-tensor-optimizer", "zero-grad-not-none", "memory-growth",
                                                 "dataloader-bound", "allocator-churn")]
        if s.arch != "cnn":
            pool = [p for p in pool if p != "conv-bias-before-bn"]
        else:
            pool = [p for p in pool if p not in GEMM_PLANTS]
        w = np.array([3.0 if (p in MULTI_RANK and world > 1) else 2.0 if p == "conv-bias-before-bn" else 1.0 for p in pool])
        plants = list(rng.choice(pool, size=min(k, len(pool)), replace=False, p=w / w.sum())) if k else []
    s.planted = sorted(str(p) for p in plants)
    prng = _rng(seed, "plants")
    for p in s.planted:
        _plant(s, p, prng)
    return s


def _plant(s: JobSpec, p: str, rng: np.random.Generator) -> None:
    """Severity knobs. Time-valued knobs are fractions of the unplanted step (scaled in JobModel)."""
    frac = _loguniform(rng, 0.003, 0.8)
    if p == "dataloader-bound":
        s.dataloader = True
        s.tags["dl_frac"] = frac
    elif p == "pageable-memcpy":
        s.pageable = True
        s.input_bytes = _loguniform(rng, 1 * MIB, 256 * MIB)
    elif p == "extra-copy":
        s.dtod_plant = int(rng.integers(1, 60))
        s.tags["dtod_frac"] = frac
    elif p == "sync-point":
        s.sync_items = int(rng.integers(1, 9))
        s.tags["sync_frac"] = frac
    elif p == "allocator-churn":
        s.alloc_pairs = int(rng.integers(1, 12))
        s.tags["alloc_frac"] = frac
    elif p == "fp32-matmul":
        s.precision = "fp32"
        s.fp32_factor = float(rng.uniform(1.3, 6.0))
    elif p == "misaligned-gemm":
        s.misaligned_frac = float(rng.uniform(0.3, 1.0))
        s.misaligned_factor = float(rng.uniform(1.05, 2.5))
    elif p == "single-tensor-optimizer":
        s.optimizer = "single"
    elif p == "zero-grad-not-none":
        s.zero_grad_fill = True
    elif p == "conv-bias-before-bn":
        s.conv_bias = True
        s.tags["bias_mult"] = _loguniform(rng, 0.02, 1.5)
    elif p == "memory-growth":
        s.profile_memory = True
        s.leak_bytes = s.base_mem_bytes * _loguniform(rng, 0.0005, 0.2)
    elif p == "straggler":
        s.straggler_rank = int(rng.integers(0, s.world))
        s.tags["straggler_frac"] = frac
    elif p == "sharding-imbalance":
        s.imbalance_rank = int(rng.integers(0, s.world))
        s.imbalance_factor = float(1.0 + _loguniform(rng, 0.01, 1.5))
    elif p == "exposed-communication":
        s.comm_schedule = "end" if rng.random() < 0.6 else "overlap"
        s.comm_ratio = _loguniform(rng, 0.01, 1.2)


class JobModel:
    """Builds the per-rank programs of a JobSpec; `off` switches knobs off (counterfactuals)."""

    def __init__(self, spec: JobSpec):
        self.s = spec
        params = load_params()
        prof = params["profiles"][spec.profile]
        pooled = params["pooled"]
        pick = lambda key: prof.get(key) or pooled[key]  # noqa: E731
        self.kern = Dist(pick("kernel_us"))
        self.launch = Dist(pick("launch_us"), 0.02, 0.98)
        self.gap = Dist(pick("host_gap_us"), 0.02, 0.9)
        self.lat = Dist(pick("launch_latency_us"), 0.02, 0.35)
        bw = {**pooled.get("bandwidth_gbps", {}), **prof.get("bandwidth_gbps", {})}
        self.bw_htod = bw.get("htod", 8.0)
        self.bw_dtod = bw.get("dtod", 300.0)
        self.garch = _arch_of(spec.device)
        self.iters = max(1, spec.steps)
        self.step_us = 0.0  # unplanted step estimate, set by calibrate()
        self._layers: list | None = None
        self._rank_params: list[dict] | None = None

    # --- structure draws (rank-independent, so all ranks run the same model) ----------------------
    def _layer_kernels(self) -> list[list[tuple[str, str, list[tuple[str, float]], dict, list[str]]]]:
        """Per layer: ops [(kind, opname, [(kernel, dur)], args, children)], drawn once per job."""
        s = self.s
        rng = _rng(s.seed, "layers")
        layers = []
        for li in range(s.layers):
            size = float(np.exp(rng.normal(0.0, 0.5)))
            base = self.kern.sample(rng, 4, s.kscale * size)
            hidden = int(rng.choice([64, 128, 256, 512, 768, 1024, 2048, 4096]))
            ops = []
            if s.arch == "cnn":
                ops.append(("conv", "aten::conv2d", [("conv", base[0] * s.gemm_mult)], {"C": hidden // 4}, []))
                ops.append(("bn", "aten::batch_norm", [(K_BN, base[1])], {}, ["aten::cudnn_batch_norm"]))
                ops.append(("ew", "aten::relu_", [(K_RELU, base[2])], {}, []))
            else:
                ops.append(("gemm", "aten::linear", [("gemm", base[0] * s.gemm_mult)], {"M": 64 * int(rng.integers(1, 65)), "K": hidden, "N": hidden}, ["aten::addmm"]))
                if s.arch == "transformer":
                    ops.append(("ew", "aten::layer_norm", [(K_LN, base[1])], {}, ["aten::native_layer_norm"]))
                    ops.append(("ew", "aten::gelu", [(K_GELU, base[2])], {}, []))
                else:
                    ops.append(("ew", "aten::relu", [(K_RELU, base[2])], {}, []))
            layers.append(ops)
        return layers

    def _gemm_name(self, fp32: bool) -> str:
        return GEMM_NAMES["fp32" if fp32 else "fast"][self.garch]

    def calibrate(self) -> None:
        """Time-valued plant severities are fractions of the unplanted step: simulate it once."""
        runs = self.simulate(off=frozenset(PLANTABLE), emit=False)
        self.step_us = job_wall(runs) / self.iters

    # --- programs -------------------------------------------------------------------------------------
    def program(self, off: frozenset[str] = frozenset()) -> list[tuple]:
        """The host program every rank runs (per-rank differences are applied by the simulator)."""
        s = self.s
        s = self.s
        on = lambda p: p in s.planted and p not in off  # noqa: E731
        if self._layers is None:
            self._layers = self._layer_kernels()
        layers = self._layers
        # every component draws from its own streams (rank-independent: all ranks run the same model)
        R = {k: Draws(self, k) for k in ("host", "bias", "dnat", "dplant", "sync", "zero", "opt1", "optN", "alloc",
                                         "straggler", "dl", "stepend")}
        host = R["host"]
        mis_rng = _rng(s.seed, "misaligned")
        misaligned = [bool(mis_rng.random() < s.misaligned_frac) for _ in range(s.layers)]
        fp32 = s.precision == "fp32" and "fp32-matmul" not in off
        step = self.step_us  # 0 while calibrating: time-valued plants add nothing
        prog: list[tuple] = []
        n_params = min(2 * s.layers, 24)
        act_bytes = s.base_mem_bytes * 0.02
        sync_rng = _rng(s.seed, "sync")
        sync_at = sorted(int(x) for x in sync_rng.integers(0, s.layers, size=s.sync_items))
        dtod_rng = _rng(s.seed, "dtod")
        dtod_nat_at = [int(x) for x in dtod_rng.integers(0, s.layers, size=s.dtod_natural)]
        dtod_plant_at = [int(x) for x in dtod_rng.integers(0, s.layers, size=s.dtod_plant)]
        dtod_plant_us = s.tags.get("dtod_frac", 0.0) * step / max(s.dtod_plant, 1)
        comm = s.world > 1 and s.mode == "train" and s.buckets > 0
        coll_name = (NCCL_NEW if s.nccl_new else NCCL_OLD).format(C="AllReduce")
        if comm and "exposed-communication" in off:
            schedule = "overlap"
        else:
            schedule = s.comm_schedule
        bwd_compute_est = None

        def gap(rng: Draws = host) -> float:
            return max(1.5, rng.gap() * s.host_scale)

        def kop(opname: str, kernels: list[tuple[str, float]], args: dict | None = None, children: list[str] | None = None,
                rng: Draws = host) -> tuple:
            return ("K", opname, [(k, float(d), rng.launch()) for k, d in kernels], gap(rng),
                    args or {}, children or [])

        if s.profile_memory:
            prog.append(("MEM", s.base_mem_bytes))

        for it in range(self.iters):
            if s.steps:
                prog.append(("B", f"ProfilerStep#{it + 2}", "user_annotation", None))
            if s.dataloader:
                dl = s.dl_base_us if s.workers else s.dl_base_us * 4
                if "dataloader-bound" in off:  # the counterfactual: batches already prefetched
                    dl = 15.0
                elif on("dataloader-bound"):
                    dl += s.tags.get("dl_frac", 0.0) * step * float(R["dl"].uniform(0.7, 1.3))
                prog.append(("DL", dl, s.workers))
            if s.mode == "train" or it == 0:
                bw = self.bw_htod * (0.45 if (s.pageable and "pageable-memcpy" not in off) else 1.0)
                prog.append(("C", "htod", s.input_bytes, s.input_bytes / (bw * 1e3),
                             bool(s.pageable and "pageable-memcpy" not in off), "aten::to"))
            if s.profile_memory:
                prog.append(("MEM", s.input_bytes))
            if s.with_stack:
                prog.append(("B", "train.py(41): train_step", "python_function", {"Python id": 1}))
            # forward
            for li, ops in enumerate(layers):
                for kind, opname, kernels, args, children in ops:
                    if kind == "gemm":
                        dur = kernels[0][1] * (s.fp32_factor if fp32 else 1.0)
                        if misaligned[li] and "misaligned-gemm" not in off:
                            dur *= s.misaligned_factor
                            k_dim, n_dim = args["K"] + 1, args["N"] - 3
                        else:
                            k_dim, n_dim = args["K"], args["N"]
                        dtype = "float" if fp32 else "c10::BFloat16"
                        gargs = {"Input Dims": [[n_dim], [args["M"], k_dim], [k_dim, n_dim]], "Input type": [dtype, dtype, dtype]}
                        prog.append(kop(opname, [(self._gemm_name(fp32), dur)], gargs, children))
                    elif kind == "conv":  # fp32-matmul leaves convolutions alone (cudnn.allow_tf32 sets theirs)
                        dur = kernels[0][1]
                        bias = s.conv_bias and "conv-bias-before-bn" not in off
                        c = args["C"]
                        prog.append(("B", "aten::conv2d", "cpu_op", None))
                        prog.append(("B", "aten::convolution", "cpu_op",
                                     {"Input Dims": [[32, c, 56, 56], [c, c, 3, 3], [c] if s.conv_bias else []],
                                      "Input type": ["c10::BFloat16"] * 3}))
                        prog.append(kop("aten::cudnn_convolution", [(CONV_NAMES["fast"], dur)]))
                        if bias:
                            prog.append(kop("aten::add_", [(K_ADD, kernels[0][1] * s.tags.get("bias_mult", 0.1))], rng=R["bias"]))
                        prog.append(("E",))
                        prog.append(("E",))
                    else:
                        prog.append(kop(opname, kernels, None, children))
                if s.profile_memory:
                    prog.append(("MEM", act_bytes / s.layers))
                for _ in range(dtod_nat_at.count(li)):
                    nb = float(R["dnat"].uniform(4e3, 2e6))
                    prog.append(("C", "dtod", nb, 2.0 + nb / (self.bw_dtod * 1e3), False, "aten::clone"))
                if "extra-copy" not in off:
                    for _ in range(dtod_plant_at.count(li)):
                        us = dtod_plant_us * float(R["dplant"].uniform(0.5, 1.5))
                        prog.append(("C", "dtod", us * self.bw_dtod * 1e3, us, False, "aten::contiguous"))
                for _ in range(sync_at.count(li)):
                    if "sync-point" not in off:
                        prog.append(("ITEM",))
                    prog.append(("H", s.tags.get("sync_frac", 0.0) * step / max(s.sync_items, 1) * float(R["sync"].uniform(0.5, 1.5)), False))
            prog.append(kop("aten::cross_entropy", [(K_SOFTMAX, host.kern() * s.kscale), (K_NLL, host.kern() * s.kscale)],
                            None, ["aten::log_softmax"]))
            if s.mode == "train":
                # zero_grad
                prog.append(("B", "Optimizer.zero_grad#AdamW.zero_grad", "user_annotation", None))
                if s.zero_grad_fill and "zero-grad-not-none" not in off:
                    zr = R["zero"]
                    for _ in range(n_params):
                        prog.append(kop("aten::zero_", [(K_FILL, zr.kern() * s.kscale * 0.5)], None, ["aten::fill_"], rng=zr))
                prog.append(("E",))
                if s.straggler_rank >= 0 and "straggler" not in off:
                    prog.append(("H", s.tags.get("straggler_frac", 0.0) * step * float(R["straggler"].uniform(0.7, 1.3)), True,
                                 "straggler"))
                # backward (with DDP buckets)
                bucket_every = max(1, math.ceil(s.layers / s.buckets)) if comm else 0
                for j, ops in enumerate(reversed(layers)):
                    li = s.layers - 1 - j
                    for kind, opname, kernels, args, children in reversed(ops):
                        name = {"gemm": "AddmmBackward0", "conv": "ConvolutionBackward0", "bn": "CudnnBatchNormBackward0"}.get(kind, "MulBackward0")
                        prog.append(("B", f"autograd::engine::evaluate_function: {name}", "cpu_op", None))
                        dur = kernels[0][1] * (s.fp32_factor if (fp32 and kind == "gemm") else 1.0)
                        if kind == "gemm" and misaligned[li] and "misaligned-gemm" not in off:
                            dur *= s.misaligned_factor
                        kname = kernels[0][0]
                        if kind == "gemm":
                            kname = self._gemm_name(fp32)
                        elif kind == "conv":
                            kname = CONV_NAMES["fast"]
                        prog.append(kop(name, [(kname, dur), (kname, dur)]))
                        prog.append(("E",))
                    if s.profile_memory:
                        prog.append(("MEM", -act_bytes / s.layers))
                    if comm and schedule == "overlap" and ((j + 1) % bucket_every == 0 or j == s.layers - 1):
                        prog.append(("COLL", "allreduce", 0.0, 0.0, coll_name))
                if comm and schedule == "end":
                    for _ in range(s.buckets):
                        prog.append(("COLL", "allreduce", 0.0, 0.0, coll_name))
                if comm:
                    prog.append(("WAITCOMM",))
                # optimizer
                prog.append(("B", "Optimizer.step#AdamW.step", "user_annotation", None))
                if s.optimizer == "single" and "single-tensor-optimizer" not in off:
                    orng = R["opt1"]
                    if s.with_stack:
                        prog.append(("B", "torch/optim/adamw.py(512): _single_tensor_adamw", "python_function", {"Python id": 2}))
                    for _ in range(n_params):
                        for op in SINGLE_TENSOR_OPS:
                            prog.append(kop(op, [(K_MUL, orng.kern() * s.kscale * 0.5)], rng=orng))
                    if s.with_stack:
                        prog.append(("E",))
                else:
                    orng = R["optN"]
                    if s.with_stack:
                        prog.append(("B", "torch/optim/adamw.py(640): _multi_tensor_adamw", "python_function", {"Python id": 2}))
                    chunks = max(1, n_params // 24)
                    for op in ("aten::_foreach_mul_", "aten::_foreach_add_", "aten::_foreach_addcdiv_"):
                        prog.append(kop(op, [(K_FOREACH, orng.kern() * s.kscale * 2.0) for _ in range(chunks)], rng=orng))
                    if s.with_stack:
                        prog.append(("E",))
                prog.append(("E",))
                if s.alloc_pairs and "allocator-churn" not in off:
                    each = s.tags.get("alloc_frac", 0.0) * step / (2 * s.alloc_pairs)
                    for _ in range(s.alloc_pairs):
                        prog.append(("ALLOC", "cudaFree", each * float(R["alloc"].uniform(0.5, 1.5))))
                    for _ in range(s.alloc_pairs):
                        prog.append(("ALLOC", "cudaMalloc", each * float(R["alloc"].uniform(0.5, 1.5))))
                if s.profile_memory:
                    prog.append(("MEM", -s.input_bytes))
                    if s.leak_bytes and "memory-growth" not in off:
                        prog.append(("MEM", s.leak_bytes))
            if s.step_end_item and "sync-point" not in off:
                prog.append(kop("aten::sum", [(K_REDUCE, R["stepend"].kern() * s.kscale)], rng=R["stepend"]))
                prog.append(("ITEM",))
            prog.append(("H", gap() * 4, False))
            if s.with_stack:
                prog.append(("E",))
            if s.steps:
                prog.append(("E",))
            prog.append(("MARK",))
        # collectives: the same transfer time on every rank
        if comm:
            crng = _rng(s.seed, "coll")
            bwd_compute_est = self._bwd_compute_us(layers)
            per = bwd_compute_est * s.comm_ratio / max(s.buckets, 1)
            out = []
            for op in prog:
                if op[0] == "COLL":
                    t = per * float(crng.uniform(0.8, 1.2))
                    out.append(("COLL", op[1], t, t * 25e3, op[4]))
                else:
                    out.append(op)
            prog = out
        return prog

    def _bwd_compute_us(self, layers) -> float:
        s = self.s
        tot = 0.0
        for ops in layers:
            for kind, _, kernels, _, _ in ops:
                tot += 2 * kernels[0][1] * (s.fp32_factor if (s.precision == "fp32" and kind == "gemm") else 1.0)
        return tot

    # --- running -----------------------------------------------------------------------------------------
    def simulate(self, off: frozenset[str] = frozenset(), emit: bool = False) -> list[sim.RankRun]:
        s = self.s
        prog = self.program(off)
        if self._rank_params is None:
            self._rank_params = []
            for r in range(s.world):
                rng = _rng(s.seed, "rank", r)
                self._rank_params.append({
                    "lat": self.lat.sample(rng, 1),
                    "t0": 1.7e12 + (s.seed % 100000) * 1e6 + float(rng.uniform(0, 50)),
                    "jitter": float(rng.uniform(0.995, 1.005)),
                    "hjit": np.clip(rng.normal(1.0, 0.03, 97), 0.9, 1.1).tolist(),
                })
        params = []
        for r, p in enumerate(self._rank_params):
            imb = s.imbalance_factor if (r == s.imbalance_rank and "sharding-imbalance" not in off) else 1.0
            params.append({"kmul": p["jitter"] * imb, "hjit": p["hjit"], "straggler": r == s.straggler_rank})
        lats = [p["lat"] for p in self._rank_params]
        t0s = [p["t0"] for p in self._rank_params]
        if RANK_LAG in off:  # no rank behind the median one: its kernels reach the GPU as soon, it starts as early
            lat_med = float(np.median([float(np.mean(x)) for x in lats]))
            t0_med = float(np.median(t0s))
            lats = [np.minimum(x, lat_med) for x in lats]
            t0s = [min(t, t0_med) for t in t0s]
        return sim.simulate([prog] * s.world, lats, t0s, emit=emit, devices=[r % 8 for r in range(s.world)], rank_params=params)

    def rank_lag_us(self) -> float:
        """How far the most lagging rank's launch latency and start sit above the median rank's (us)."""
        if self._rank_params is None or len(self._rank_params) < 2:
            return 0.0
        lats = [float(np.mean(p["lat"])) for p in self._rank_params]
        t0s = [p["t0"] for p in self._rank_params]
        return max(0.0, max(lats) - float(np.median(lats))) + max(0.0, max(t0s) - float(np.median(t0s)))


def job_wall(runs: list[sim.RankRun]) -> float:
    """Time per the steady state: from the end of the first iteration (its host work and the GPU work
    it queued, slowest rank) to the end of the job; the whole wall time for one or two iterations."""
    end = max(r.t_last for r in runs)
    if all(len(r.marks) >= 3 for r in runs):
        return end - max(r.marks[0] for r in runs)
    return end - min(r.t_first for r in runs)


@dataclass
class GeneratedJob:
    spec: JobSpec
    documents: list[dict[str, Any]]  # Kineto JSON documents, one per emitted rank
    labels: dict[str, str]
    costs: dict[str, float]  # percent of wall time, where measured
    truth: dict[str, Any]


def _label_from_cost(pct: float) -> str:
    if pct >= POSITIVE_PCT:
        return "positive"
    if pct < NEGATIVE_PCT:
        return "negative"
    return "unknown"


def label_job(model: JobModel, runs: list[sim.RankRun]) -> tuple[dict[str, str], dict[str, float], dict[str, Any]]:
    s = model.s
    wall = job_wall(runs)
    labels = {p: "negative" for p in PATTERN_IDS}
    costs: dict[str, float] = {}
    active = set(s.planted)
    if s.dataloader:
        active.add("dataloader-bound")
    if s.dtod_natural:
        active.add("extra-copy")
    if s.step_end_item:
        active.add("sync-point")
    lag_us = model.rank_lag_us()
    if s.world > 1 and s.mode == "train" and s.buckets > 0 and lag_us > 0:
        active.add("straggler")  # a rank that lags by its launch latency or start is waited for at collectives
    iters = model.iters
    bounds = {  # an upper bound of the cost of an unplanted knob: skip the counterfactual when it is < 1%
        "dataloader-bound": iters * (s.dl_base_us * (1 if s.workers else 4) + 5.0),
        "extra-copy": iters * s.dtod_natural * (20.0 + 2e6 / (model.bw_dtod * 1e3)),
    }
    for p in COUNTERFACTUAL:
        if p not in active:
            continue
        if p not in s.planted and p in bounds and wall > 0 and 100.0 * bounds[p] / wall < NEGATIVE_PCT:
            costs[p] = round(100.0 * bounds[p] / wall, 3)
            labels[p] = "negative"
            continue
        cf = model.simulate(off=frozenset({p, RANK_LAG} if p == "straggler" else {p}))
        pct = max(0.0, 100.0 * (wall - job_wall(cf)) / wall) if wall > 0 else 0.0
        costs[p] = round(float(pct), 3)
        labels[p] = _label_from_cost(pct)
    view = [runs[r] for r in s.emit_ranks]
    if len(view) < 2:  # a single rank file cannot show what other ranks do
        for p in ("straggler", "sharding-imbalance"):
            if labels[p] != "negative":
                labels[p] = "unknown"
    # exposed communication: transfer not hidden behind compute, mean over the emitted ranks
    if s.world > 1 and s.buckets and s.mode == "train":
        exp = float(np.mean([sim.exposed_transfer_us(r) / max(r.t_last - r.t_first, 1e-9) for r in view])) * 100.0
        costs["exposed-communication"] = round(exp, 3)
        labels["exposed-communication"] = _label_from_cost(exp)
    # memory growth: judged by the planted leak, visible only with profile_memory and >= 3 steps
    if s.leak_bytes and "memory-growth" in s.planted:
        growth = 100.0 * s.leak_bytes * (s.steps - 1) / s.base_mem_bytes if s.steps else 0.0
        costs["memory-growth"] = round(growth, 3)
        if s.steps < 3:
            labels["memory-growth"] = "unknown"
        elif s.leak_bytes >= MIB and growth >= 5.0:
            labels["memory-growth"] = "positive"
        elif growth < 1.0 or s.leak_bytes < 64 << 10:
            labels["memory-growth"] = "negative"
        else:
            labels["memory-growth"] = "unknown"
    # utilisation-judged labels
    busy = [b for b in (sim.busy_pct(r) for r in view) if b is not None]
    busy_m = float(np.mean(busy)) if busy else None
    truth: dict[str, Any] = {"wall_us": round(float(wall), 3), "gpu_busy_pct": None if busy_m is None else round(busy_m, 3),
                             "rank_lag_us": round(lag_us, 3)}
    if busy_m is not None:
        labels["idle-gpu"] = "positive" if busy_m < 50 else "negative" if busy_m > 90 else "unknown"
        li = [sim.launch_idle_us(r) for r in view]
        walls = [max(r.t_last - r.t_first, 1e-9) for r in view]
        launch_pct = float(np.mean([100.0 * a / w for (a, _), w in zip(li, walls)]))
        launch_share = float(np.mean([a / t if t > 0 else 0.0 for a, t in li]))
        kd = np.median(np.concatenate([np.asarray(r.kernel_durs) for r in view])) if any(r.kernel_durs for r in view) else None
        ld = np.median(np.concatenate([np.asarray(r.launch_durs) for r in view])) if any(r.launch_durs for r in view) else None
        short = kd is not None and ld is not None and kd < ld
        costs["launch-bound"] = round(launch_pct, 3)
        truth.update(launch_idle_pct=round(launch_pct, 3), launch_idle_share=round(launch_share, 3),
                     kernel_p50_us=None if kd is None else round(float(kd), 3), launch_p50_us=None if ld is None else round(float(ld), 3))
        if busy_m > 95 or launch_pct < NEGATIVE_PCT:
            labels["launch-bound"] = "negative"
        elif short and launch_share > 0.5 and launch_pct >= POSITIVE_PCT:
            labels["launch-bound"] = "positive"
        else:
            labels["launch-bound"] = "unknown"
    return labels, costs, truth


def documents(model: JobModel, runs: list[sim.RankRun]) -> list[dict[str, Any]]:
    s = model.s
    out = []
    for r in s.emit_ranks:
        run = runs[r]
        dev = r % 8
        doc: dict[str, Any] = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": dev, "name": s.device, "computeMajor": 8, "numSms": 108}],
            "traceEvents": run.events + [
                {"ph": "M", "name": "process_name", "pid": sim.HOST_PID, "tid": 0, "args": {"name": "python"}},
                {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
                 "ts": round(run.t_first - 5.0, 3), "dur": round(run.t_last - run.t_first + 10.0, 3), "args": {"Op count": 0}},
            ],
            "baseTimeNanoseconds": 1700000000000000000,
            "displayTimeUnit": "ms",
            "traceName": f"synth-{s.seed}-rank{r}",
        }
        if s.world > 1:
            doc["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": s.world}
        out.append(doc)
    return out


def generate(seed: int, plants: list[str] | None = None) -> GeneratedJob:
    spec = sample_spec(seed, plants)
    model = JobModel(spec)
    model.calibrate()
    runs = model.simulate(emit=True)
    labels, costs, truth = label_job(model, runs)
    return GeneratedJob(spec=spec, documents=documents(model, runs), labels=labels, costs=costs, truth=truth)
