"""The job feature vector: one documented, versioned record per analysed job.

Every field documents its unit and definition; `docs/features.md` is generated from this model
(`python -m zoomer_ar.features.docs`). Bump FEATURE_SCHEMA_VERSION when a definition changes.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

FEATURE_SCHEMA_VERSION = "1.6.0"


def F(description: str, unit: str = "", group: str = "", default=None):  # noqa: N802 - reads like a column spec
    return Field(default=default, description=description, json_schema_extra={"unit": unit, "group": group})


class FeatureVector(BaseModel):
    """Features of one job (all ranks). `None` means not measurable in this trace."""

    # --- job ---------------------------------------------------------------------------------
    world_size: int = F("Ranks in the job (distributedInfo.world_size, else files loaded).", "ranks", "job", 1)
    n_ranks: int = F("Rank files analysed.", "files", "job", 1)
    has_gpu: bool = F("Any GPU kernel, memcpy or memset events.", "", "job", False)
    has_accelerator: bool = F("Any accelerator work (GPU or MTIA).", "", "job", False)
    accelerator: str = F("nvidia, amd, mtia or none.", "", "job", "none")
    device_not_recorded: bool = F(
        "The job ran on a GPU or accelerator that the trace does not show at work: it lists one (deviceProperties) "
        "or holds GPU runtime calls, but no device events (kernels, copies, memsets, accelerator ops). Profiled "
        "without the device activity (ProfilerActivity.CUDA) or in CUPTI range-profiler mode: its host op times "
        "are dispatch times, not compute.", "", "job", False
    )
    tf32_capable: bool = F("Every GPU supports TF32 tensor cores (Ampere or newer).", "", "job", False)
    has_python_stacks: bool = F("Python frames recorded (with_stack).", "", "job", False)
    profiler_steps: int = F("CPU-side ProfilerStep#N annotations (per rank, max over ranks).", "steps", "job", 0)
    wall_ms: float = F("Profiled wall time: first to last CPU or GPU event (max over ranks).", "ms", "job", 0.0)
    step_ms: float = F(
        "Time per step: mean ProfilerStep duration, each step from the previous one's completion to its own "
        "(its CPU side over and the device done with the work it queued: GPU-side ProfilerStep ranges where "
        "recorded, else the device events its runtime calls queued), so a host running ahead of the GPU does "
        "not shorten it; else the profiled wall time (one step).", "ms", "job", 0.0
    )
    step_ms_p50: float | None = F("Median ProfilerStep duration.", "ms", "job")
    step_ms_p95: float | None = F("95th percentile ProfilerStep duration.", "ms", "job")
    step_ms_cv: float | None = F("Coefficient of variation of step durations across steps.", "", "job")
    first_profiled_step: int | None = F(
        "N of the first ProfilerStep#N recorded (the lowest over ranks). torch.profiler numbers a schedule's steps "
        "from 0, recorded or not: from 1 on, the iterations before the window (wait and warm-up steps) ran "
        "unrecorded, and the program's start-up with them, so nothing in the window counts as start-up work (see "
        "idle_startup_ms_per_step) and every torch.compile compilation in it is a recompilation.", "step", "job"
    )
    first_step_ms: float | None = F(
        "Duration of the first profiled step (as step_ms counts steps; mean over ranks). Far above step_ms_p50 when "
        "the profile starts with the program: compilation, first launches and allocations land in it.", "ms", "job"
    )

    # --- GPU utilisation ---------------------------------------------------------------------
    gpu_busy_pct: float | None = F(
        "Union of kernel/memcpy/memset intervals over first-to-last GPU event span (mean over ranks).", "%", "gpu"
    )
    gpu_busy_pct_steady: float | None = F(
        "Median per-step GPU busy % over steady-state steps (first step dropped when >= 3).", "%", "gpu"
    )
    gpu_span_ms: float | None = F("First to last GPU event (max over ranks).", "ms", "gpu")
    gpu_idle_ms_per_step: float | None = F("GPU idle time inside the GPU span, per step.", "ms", "gpu")
    gpu_idle_outside_span_ms_per_step: float | None = F(
        "Step time with no device work at all, per step: the profiled steps' time before the device's first op "
        "and after its last one (e.g. a CPU preprocess before the device starts). Not part of the GPU span, so "
        "not in gpu_busy_pct or the idle gaps; None without profiler steps.", "ms", "gpu"
    )
    idle_host_ms_per_step: float | None = F(
        "Idle while the GPU waited for the host to launch the next work (launch issued after the GPU went idle).",
        "ms",
        "gpu",
    )
    idle_sync_ms_per_step: float | None = F(
        "Idle after a host synchronisation drained the queue (gap starts where a sync call returns).", "ms", "gpu"
    )
    idle_data_ms_per_step: float | None = F("Idle overlapping DataLoader __next__ on the host.", "ms", "gpu")
    idle_other_ms_per_step: float | None = F("Idle with work already queued (dependencies, events).", "ms", "gpu")
    idle_short_gap_share: float | None = F("Share of idle time in gaps shorter than 50 us.", "ratio", "gpu")
    host_idle_share: float | None = F("Share of idle time that is host-bound (idle_host / idle).", "ratio", "gpu")
    idle_startup_ms_per_step: float | None = F(
        "GPU idle time, per step, while the host was in start-up work before the second profiled step (anywhere "
        "in a trace of fewer than two steps): an outlier runtime call - a launch, synchronisation, copy or "
        "allocation of at least 1 ms and at least 100 times its API's typical (lower-median) duration in the "
        "rank: a first launch loading its kernel's module, context creation, a first cudaMalloc/cudaFree -, a "
        "stream capture into a CUDA/HIP graph (Begin*Capture to End*Capture on a thread: kernels launched then "
        "are recorded, not run) or torch.compile compiling (its `... (dynamo_timed)` phases); none where the "
        "profile begins after the program did (first_profiled_step >= 1). One-off work recorded because the "
        "profile starts with the program, not a per-step cost, so idle-gpu and launch-bound leave it out of their "
        "impact. The same work in later steps "
        "recurs and stays ordinary idle time. Part of the idle split above (mostly of idle_host), not a fifth "
        "cause.", "ms", "gpu"
    )
    idle_startup_host_ms_per_step: float | None = F(
        "The part of idle_startup_ms_per_step in host-bound gaps (counted in idle_host_ms_per_step).", "ms", "gpu"
    )
    startup_calls: int = F(
        "Outlier runtime calls counted as start-up (see idle_startup_ms_per_step), all ranks, whether the GPU "
        "idled meanwhile or not.", "calls", "gpu", 0
    )
    startup_compiles: int = F(
        "torch.compile compilations counted as start-up (outermost `... (dynamo_timed)` phases on their thread that "
        "begin before the second profiled step), all ranks.", "compilations", "gpu", 0
    )
    recompiles: int = F(
        "torch.compile compilations that begin at or after the second profiled step: recompilation (new input "
        "shapes, failed guards), a cost each time it happens; all ranks.", "compilations", "compile", 0
    )
    recompile_ms_per_step: float = F(
        "Host time in those recompilations, per step (mean over ranks).", "ms", "compile", 0.0
    )
    captured_launches: int = F(
        "Launches recorded into CUDA/HIP graphs during the stream captures counted as start-up (see "
        "idle_startup_ms_per_step): they ran no kernel when the trace was recorded; all ranks.", "launches", "gpu", 0
    )

    # --- kernels and launches -------------------------------------------------------------------
    kernel_count: int = F("GPU kernels (all ranks).", "kernels", "kernels", 0)
    kernels_per_step: float | None = F("Kernels per step (mean over ranks).", "kernels", "kernels")
    kernel_ms_per_step: float | None = F("Kernel time per step (mean over ranks).", "ms", "kernels")
    compute_ms_per_step: float | None = F(
        "Time with at least one non-collective kernel running, per step (mean over ranks): kernels on several "
        "streams at once count once, unlike kernel_ms_per_step.", "ms", "kernels"
    )
    kernel_dur_p50_us: float | None = F("Median kernel duration.", "us", "kernels")
    kernel_dur_p90_us: float | None = F("90th percentile kernel duration.", "us", "kernels")
    short_kernel_share: float | None = F("Share of kernels shorter than 10 us.", "ratio", "kernels")
    launch_count: int = F("Kernel launch API calls (cudaLaunchKernel, hipLaunchKernel, ...).", "calls", "kernels", 0)
    launch_dur_p50_us: float | None = F("Median launch API call duration (CPU side).", "us", "kernels")
    launch_ms_per_step: float | None = F("CPU time in launch API calls per step.", "ms", "kernels")
    kernel_to_launch_ratio: float | None = F(
        "Median kernel duration / median launch cost per kernel: a launch call's duration over the kernels it "
        "launched, so a CUDA graph launch counts once for its whole graph (< 1: kernels finish faster than they launch).",
        "ratio",
        "kernels",
    )

    # --- memcpy / memset --------------------------------------------------------------------
    memcpy_htod_count: int = F("Host-to-device copies.", "copies", "memory-traffic", 0)
    memcpy_htod_ms_per_step: float = F("Host-to-device copy time per step.", "ms", "memory-traffic", 0.0)
    memcpy_dtoh_count: int = F("Device-to-host copies.", "copies", "memory-traffic", 0)
    memcpy_dtoh_ms_per_step: float = F("Device-to-host copy time per step.", "ms", "memory-traffic", 0.0)
    memcpy_dtod_count: int = F("Device-to-device copies (name says DtoD).", "copies", "memory-traffic", 0)
    memcpy_dtod_ms_per_step: float = F("Device-to-device copy time per step.", "ms", "memory-traffic", 0.0)
    memcpy_dtod_pct_of_gpu_span: float = F("DtoD copy time over the GPU span.", "%", "memory-traffic", 0.0)
    memcpy_pageable_count: int = F("Copies from/to pageable host memory.", "copies", "memory-traffic", 0)
    memcpy_pageable_ms_per_step: float = F("Pageable copy time per step.", "ms", "memory-traffic", 0.0)
    memset_count: int = F("GPU memsets.", "memsets", "memory-traffic", 0)
    memset_ms_per_step: float = F("GPU memset time per step.", "ms", "memory-traffic", 0.0)
    memory_exposed_ms_per_step: float | None = F(
        "Copy and memset time per step that compute kernels do not overlap (the union of memcpy and memset "
        "events less what non-collective kernels cover): the bottleneck's memory share.",
        "ms",
        "memory-traffic",
    )
    cpu_copy_ops_per_step: float = F(
        "Host-side tensor copies per step (aten::_to_copy, aten::clone, aten::copy_ not under the optimizer).",
        "ops",
        "memory-traffic",
        0.0,
    )
    cpu_copy_ms_per_step: float = F("Host-side time in those copies per step (exclusive of nesting).", "ms", "memory-traffic", 0.0)
    factory_then_move_per_step: float = F(
        "Tensors created on the host then moved (aten::zeros/ones/empty/rand* followed by aten::to).", "ops", "memory-traffic", 0.0
    )

    # --- host synchronisation ------------------------------------------------------------------
    sync_calls: int = F(
        "Host synchronisation API calls (cuda/hip Device/Stream/Event Synchronize, cudaMemcpy), without the stream "
        "syncs of host-to-device copies from pageable memory (counted under pageable-memcpy).",
        "calls", "sync", 0,
    )
    sync_calls_per_step: float = F("Synchronisation calls per step.", "calls", "sync", 0.0)
    sync_blocked_ms_per_step: float = F("Host time blocked in synchronisation calls per step.", "ms", "sync", 0.0)
    item_calls: int = F("aten::item / aten::_local_scalar_dense calls (tensor -> Python scalar).", "calls", "sync", 0)
    item_calls_per_step: float = F("item calls per step.", "calls", "sync", 0.0)

    # --- input pipeline --------------------------------------------------------------------------
    dataloader_ms_per_step: float = F(
        "Summed duration of enumerate(DataLoader)#...__next__ events divided by profiler_steps.", "ms", "input", 0.0
    )
    dataloader_pct: float = F("dataloader_ms_per_step over step_ms.", "%", "input", 0.0)
    dataloader_workers: bool | None = F("Multi-process DataLoader iterator seen (num_workers > 0).", "", "input")

    # --- optimizer -------------------------------------------------------------------------------
    optimizer_ms_per_step: float = F("Optimizer.step# time per step (host side).", "ms", "optimizer", 0.0)
    optimizer_steps: int = F("Optimizer.step# annotations.", "calls", "optimizer", 0)
    optimizer_single_tensor_frames: int = F("_single_tensor_* optimizer frames (with_stack).", "frames", "optimizer", 0)
    optimizer_foreach_ops: int = F("aten::_foreach_* / _fused_* ops under Optimizer.step.", "ops", "optimizer", 0)
    optimizer_per_param_ops: int = F(
        "Other aten ops under Optimizer.step (per-parameter math), except under the steps of fused optimizer classes "
        "(FusedAdam, FusedLAMB, ...: their aten ops are bookkeeping such as per-parameter step counters).",
        "ops", "optimizer", 0)
    zero_grad_calls: int = F("Optimizer.zero_grad# annotations.", "calls", "optimizer", 0)
    zero_grad_fill_ops: int = F("aten::zero_ (CPU) / aten::_foreach_zero_ (GPU) ops under zero_grad (grads kept and zeroed, not set to None).", "ops", "optimizer", 0)
    zero_grad_fill_ms_per_step: float = F(
        "Time of those fills per step: the longer of their host op time and, on a GPU, their kernels' time (the "
        "two overlap when the GPU runs behind the host, so removing the fills saves at most the longer).",
        "ms", "optimizer", 0.0)
    zero_grad_fill_host_ms_per_step: float = F("Host op time of those fills per step.", "ms", "optimizer", 0.0)
    zero_grad_fill_gpu_ms_per_step: float | None = F(
        "GPU time of the kernels those fills launched, per step (None without GPU events).", "ms", "optimizer")

    # --- allocator -------------------------------------------------------------------------------
    allocator_calls: int = F("cudaMalloc/cudaFree/hipMalloc/hipFree calls in steady-state steps (from the second profiler step on; 0 without two profiler steps: such a trace shows start-up, not churn).", "calls", "allocator", 0)
    allocator_calls_per_step: float = F("Allocator calls per steady-state step.", "calls", "allocator", 0.0)
    allocator_ms_per_step: float = F("Host time in allocator calls per step.", "ms", "allocator", 0.0)

    # --- communication ---------------------------------------------------------------------------
    comm_kernel_count: int = F("Collective kernels (nccl*/rccl*).", "kernels", "communication", 0)
    comm_ms_per_step: float = F("Union of collective kernel time per step (mean over ranks).", "ms", "communication", 0.0)
    comm_overlap_pct: float | None = F("Share of collective time overlapped by compute kernels.", "%", "communication")
    exposed_comm_ms_per_step: float = F("Collective time not overlapped by compute, per step.", "ms", "communication", 0.0)

    # --- ranks -------------------------------------------------------------------------------------
    rank_step_ms_max_over_median: float | None = F("Slowest rank's step time over the median rank's.", "ratio", "ranks")
    rank_compute_ms_max_over_median: float | None = F("Largest per-rank compute (non-collective kernel) time over the median.", "ratio", "ranks")
    rank_compute_cv: float | None = F("Coefficient of variation of per-rank compute time.", "", "ranks")
    compute_imbalance_ms_per_step: float = F("Max minus median per-rank compute time per step.", "ms", "ranks", 0.0)
    slowest_rank: int | None = F(
        "The rank the others wait for: last to arrive at collectives (shortest collective), else most compute.",
        "rank",
        "ranks",
    )
    most_compute_rank: int | None = F(
        "The rank with the most compute (non-collective kernel) time per step: the overloaded shard.", "rank", "ranks"
    )
    straggler_wait_ms_per_step: float = F(
        "Mean time per step the other ranks spend in collectives waiting for the slowest rank.", "ms", "ranks", 0.0
    )
    straggler_exposed_wait_ms_per_step: float = F(
        "The part of straggler_wait_ms_per_step the waiting ranks spent with no compute kernel of their own running: "
        "at each matched collective a rank's wait, at most its collective's time not overlapped by its compute (the "
        "wait opens the kernel and the transfer follows, so compute beside the kernel fills the transfer first). A "
        "rank late once in a step is waited for again at each later collective of it, while the others still "
        "compute (DDP's buckets): those waits cost nothing, and only the wait nothing hides does.", "ms", "ranks", 0.0
    )
    straggler_last_share: float | None = F("Share of matched collectives the slowest rank arrived last to.", "ratio", "ranks")

    # --- memory ------------------------------------------------------------------------------------
    memory_events: int = F("[memory] allocator events (profile_memory).", "events", "memory", 0)
    memory_growth_bytes_per_step: float | None = F("Slope of allocated memory at step ends.", "bytes", "memory")
    memory_growth_pct: float | None = F("Growth of allocated memory from first to last step end.", "%", "memory")
    memory_growth_monotonic: bool | None = F("Allocated memory at step ends never decreased.", "", "memory")
    memory_peak_bytes: float | None = F("Highest Total Allocated seen.", "bytes", "memory")

    # --- operators ---------------------------------------------------------------------------------
    gemm_ms_per_step: float = F("Matrix-multiply time per step (GPU kernels, else host ops).", "ms", "operators", 0.0)
    fp32_gemm_share: float | None = F("Share of GEMM time in plain FP32 (no TF32/half/bf16).", "ratio", "operators")
    fp32_gemm_ms_per_step: float = F("Plain-FP32 GEMM time per step.", "ms", "operators", 0.0)
    misaligned_gemm_ops: int = F("GEMM ops with K or N not a multiple of 16 bytes of elements.", "ops", "operators", 0)
    misaligned_gemm_share: float | None = F("Share of GEMM time in misaligned shapes.", "ratio", "operators")
    misaligned_gemm_ms_per_step: float = F("Misaligned GEMM time per step.", "ms", "operators", 0.0)
    conv_bias_bn_pairs: int = F("Convolutions with a bias directly followed by batch norm.", "ops", "operators", 0)
    conv_bias_ms_per_step: float = F("Time spent adding those biases (host ops, or kernels on GPU).", "ms", "operators", 0.0)

    # --- phases (zoomer_ar/features/phases.py; cost attribution, docs/store.md) -----------------------
    phase_basis: str | None = F(
        "What the phase split is measured on: gpu (device events by launching phase) or host (host ops only).", "", "phases"
    )
    phase_dataloader_pct: float | None = F(
        "Wall time in the DataLoader: GPU work launched inside __next__ plus GPU idle while the host is in it (mean over ranks).",
        "%", "phases",
    )
    phase_forward_pct: float | None = F(
        "Wall time running GPU work launched by host ops outside backward, optimizer and dataloader.", "%", "phases"
    )
    phase_backward_pct: float | None = F(
        "Wall time running GPU work launched from autograd::engine::evaluate_function ops or the backward thread.", "%", "phases"
    )
    phase_optimizer_pct: float | None = F(
        "Wall time running GPU work launched inside Optimizer.step# (and Optimizer.zero_grad#).", "%", "phases"
    )
    phase_communication_pct: float | None = F("Wall time running collective kernels (nccl*/rccl*).", "%", "phases")
    phase_idle_pct: float | None = F("Wall time with the GPU idle and the host not in the DataLoader.", "%", "phases")
    trace_start_unix_s: float | None = F(
        "Trace start, epoch seconds: the first timestamp when it is epoch microseconds, else baseTimeNanoseconds "
        "(the epoch time of the clock's zero) plus the first timestamp (min over ranks).",
        "s", "phases",
    )
