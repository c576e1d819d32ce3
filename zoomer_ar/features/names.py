"""Event-name and category vocabulary shared by the feature extractors (NVIDIA, AMD, MTIA, 2021 schema)."""

from __future__ import annotations

import re

KERNEL_CATS = ("kernel", "Kernel")
MEMCPY_CATS = ("gpu_memcpy", "Memcpy")
MEMSET_CATS = ("gpu_memset", "Memset")
GPU_CATS = KERNEL_CATS + MEMCPY_CATS + MEMSET_CATS
ACCEL_ONLY_CATS = ("mtia_ccp_events",)
RUNTIME_CATS = ("cuda_runtime", "Runtime", "cuda_driver", "mtia_runtime")
CPU_OP_CATS = ("cpu_op", "Operator")
ANNOTATION_CATS = ("user_annotation", "cpu_op", "Operator")
PYTHON_CATS = ("python_function",)
HOST_CATS = CPU_OP_CATS + ("user_annotation", "python_function") + RUNTIME_CATS

SYNC_APIS = frozenset(
    {
        "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
        "cudaMemcpyFromSymbol", "cudaMemcpyToSymbol", "cuCtxSynchronize", "cuStreamSynchronize",
        "cuEventSynchronize", "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
        "hipMemcpy", "hipMemcpyWithStream", "hipMemcpy2D", "hipMemcpyFromSymbol",
    }
)
ITEM_OPS = frozenset({"aten::_local_scalar_dense"})
ITEM_FALLBACK_OPS = frozenset({"aten::item"})
ALLOCATOR_APIS = frozenset(
    {
        "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaMallocHost", "cudaFreeHost",
        "cudaHostAlloc", "cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2", "hipMalloc", "hipFree",
        "hipMallocAsync", "hipFreeAsync", "hipHostMalloc", "hipHostFree", "hipExtMallocWithFlags",
    }
)
FACTORY_OPS = frozenset(
    {"aten::zeros", "aten::ones", "aten::empty", "aten::full", "aten::rand", "aten::randn", "aten::randint",
     "aten::arange", "aten::linspace", "aten::eye", "aten::zeros_like", "aten::ones_like", "aten::tensor",
     "aten::lift_fresh", "aten::scalar_tensor"}
)
COPY_OPS = frozenset({"aten::_to_copy", "aten::clone"})
# gradients zeroed instead of set to None: one aten::zero_ per tensor on a CPU, one
# aten::_foreach_zero_ per device and dtype group on a GPU (torch.optim groups the grads)
ZERO_FILL_OPS = frozenset({"aten::zero_", "aten::_foreach_zero_"})
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"})
CONV_OPS = frozenset({"aten::convolution"})
BN_OPS = frozenset({"aten::batch_norm"})
LAYER_OPS = frozenset(
    {"aten::convolution", "aten::batch_norm", "aten::linear", "aten::relu", "aten::relu_", "aten::max_pool2d",
     "aten::avg_pool2d", "aten::adaptive_avg_pool2d", "aten::layer_norm", "aten::gelu", "aten::silu",
     "aten::dropout", "aten::add", "aten::group_norm", "aten::instance_norm", "aten::sigmoid",
     "aten::tanh", "aten::hardtanh", "aten::leaky_relu", "aten::matmul", "aten::addmm", "aten::mm"}
)

_LAUNCH_RE = re.compile(r"(LaunchKernel|LaunchCooperativeKernel|GraphLaunch|ModuleLaunchKernel)")
_COLLECTIVE_TYPES = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("broadcast", "broadcast"), ("reduce", "reduce"),
    ("send", "send"), ("recv", "recv"),
)


def is_launch(name: str) -> bool:
    return bool(_LAUNCH_RE.search(name))


def is_launch_sync_or_alloc(name: str) -> bool:
    """A runtime call that launches device work, synchronises or allocates: the streaming reader
    keeps every such call (stream/compact.py) and pruning never drops one (stream/prune.py), so a
    feature may choose among them on either path (features/idle.py: the call a gap's host sat in)."""
    return is_launch(name) or name in SYNC_APIS or name in ALLOCATOR_APIS


# Stream capture into a CUDA/HIP graph: kernels launched on a capturing stream are recorded, not run.
CAPTURE_BEGIN_APIS = frozenset({"cudaStreamBeginCapture", "cudaStreamBeginCaptureToGraph", "hipStreamBeginCapture",
                                "hipStreamBeginCaptureToGraph"})
CAPTURE_END_APIS = frozenset({"cudaStreamEndCapture", "hipStreamEndCapture"})


def is_capture_bound(name: str) -> bool:
    """The runtime call that begins or ends a stream capture (kept by both readers, as above)."""
    return name in CAPTURE_BEGIN_APIS or name in CAPTURE_END_APIS


def is_compile_window(name: str) -> bool:
    """A torch.compile phase (Dynamo tracing, AOT autograd, Inductor codegen), as `dynamo_timed` records it:
    `_compile.compile_inner (dynamo_timed)`, `backward._backward_impl (dynamo_timed)`, ... The streaming
    reader keeps these host ops (stream/compact.py) and pruning never drops them (stream/prune.py)."""
    return name.endswith(" (dynamo_timed)")


def is_kept_runtime_call(name: str) -> bool:
    """Runtime calls every path keeps whatever their correlation: launches, synchronisations, allocations and
    the bounds of stream captures (stream/compact.py keeps them, stream/prune.py never drops them)."""
    return is_launch_sync_or_alloc(name) or is_capture_bound(name)


def is_comm_kernel(name: str) -> bool:
    head = name[:40].lower()
    return "nccl" in head or "rccl" in head


def collective_type(name: str) -> str:
    low = name.lower().replace("_", "")
    for key, label in _COLLECTIVE_TYPES:
        if key in low:
            return label
    return "other"


def is_profiler_step(name: str) -> bool:
    return name.startswith("ProfilerStep#")


def profiler_step_number(name: str) -> int | None:
    """N of `ProfilerStep#N` (torch.profiler counts the schedule's steps from 0, recorded or not)."""
    tail = name[len("ProfilerStep#"):] if is_profiler_step(name) else ""
    return int(tail) if tail.isdigit() else None


def is_dataloader_next(name: str) -> bool:
    return name.startswith("enumerate(DataLoader)#") and name.endswith("__next__")


def is_optimizer_step(name: str) -> bool:
    return name.startswith("Optimizer.step#")


def is_fused_optimizer_step(name: str) -> bool:
    """`Optimizer.step#FusedAdam.step` (apex, DeepSpeed, Transformer Engine: FusedAdam, FusedLAMB, FusedSGD,
    ...): an optimizer class that updates all parameters in fused multi-tensor kernels. The aten ops under
    its step are bookkeeping (a step counter per parameter), not the single-tensor loop."""
    return is_optimizer_step(name) and "Fused" in name[len("Optimizer.step#"):].split(".", 1)[0]


def is_zero_grad(name: str) -> bool:
    return name.startswith("Optimizer.zero_grad#")


def memcpy_kind(name: str) -> str:
    low = name.lower()
    if "dtod" in low or "ptop" in low or "device -> device" in low:
        return "dtod"
    if "htod" in low or "host -> device" in low or "pageable -> device" in low or "pinned -> device" in low:
        return "htod"
    if "dtoh" in low or "device -> host" in low or "device -> pageable" in low or "device -> pinned" in low:
        return "dtoh"
    return "other"


def is_pageable(name: str) -> bool:
    return "pageable" in name.lower()


_GEMM_KERNEL_RE = re.compile(r"(gemm|cutlass|xmma|cijk_|nvjet|matmul|_mm_|hgemm|sgemm|dgemm)", re.I)


# cuDNN / MIOpen convolutions run as implicit or explicit GEMMs (implicit_convolve_sgemm,
# sm80_xmma_fprop_implicit_gemm, ..._dgrad_/_wgrad_, FFT convolutions' complex gemms): their precision is
# cudnn.allow_tf32's (on by default), not the matmul precision's, so they are not matrix multiplies here
_CONV_KERNEL_RE = re.compile(r"(conv|fprop|dgrad|wgrad|implicit_gemm|implicit_precomp|gcgemm|fft|winograd|igemm)", re.I)


def is_gemm_kernel(name: str) -> bool:
    head = name[:200]
    return bool(_GEMM_KERNEL_RE.search(head)) and not _CONV_KERNEL_RE.search(head)


def is_fp32_gemm_kernel(name: str) -> bool:
    """Plain FP32 (SIMT or f32 xmma without TF32) GEMM kernel names, NVIDIA and AMD Tensile."""
    low = name[:300].lower()
    if "tf32" in low or "bf16" in low or "f16" in low or "fp16" in low or "half" in low or "int8" in low:
        return False
    if "sgemm" in low:
        return True
    if "f32f32_f32f32" in low:
        return True
    if low.startswith("cijk_") and "_sb_" in low:
        return True
    return False


TF32_GPUS = ("a100", "a10", "a30", "a40", "a6000", "h100", "h200", "h800", "b200", "b100", "gb200", "l40", "l4",
             "rtx 30", "rtx 40", "rtx 50", "geforce rtx 30", "geforce rtx 40", "a800", "rtx a")


def supports_tf32(device_name: str) -> bool:
    low = device_name.lower()
    if "v100" in low or "t4" in low or "p100" in low or "2080" in low or "k80" in low:
        return False
    return any(tag in low for tag in TF32_GPUS)


_FRAME_RE = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")
_ADDR_RE = re.compile(r" at 0x[0-9a-fA-F]+")


def parse_frame(name: str) -> tuple[str, int, str] | None:
    """`train.py(33): train_step` -> ("train.py", 33, "train_step"); None for non-file frames."""
    m = _FRAME_RE.match(name)
    if not m:
        return None
    return m.group("file"), int(m.group("line")), _ADDR_RE.sub("", m.group("func"))


_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python", "<frozen", "<built-in", "<string>")


def is_library_file(path: str) -> bool:
    if any(m in path for m in _LIBRARY_MARKERS):
        return True
    p = path.replace("\\", "/")
    return p.startswith(("torch/", "threading.py", "runpy.py", "contextlib.py", "<")) or "/torch/" in p


def normalise_frame_name(name: str) -> str:
    return _ADDR_RE.sub("", name)


GPU_NOUN = "GPU"
ACCELERATOR_NOUN = "accelerator"  # a device that is not a GPU (MTIA)
BOTH_NOUNS = "GPU/accelerator"  # hours of GPUs and of other accelerators added up (the store's digest and history)


def device_noun(features: dict) -> str:
    """What a job's devices are called in cost lines: "GPU", or "accelerator" where the trace's device is
    not a GPU (MTIA: no CUDA/ROCm events). The figures keep their `gpu_hours` keys either way (used by
    the reports and the store's cost attribution)."""
    return ACCELERATOR_NOUN if features.get("has_accelerator") and not features.get("has_gpu") else GPU_NOUN
