"""Bottleneck type of a job (input-, host-, compute-, memory- or communication-bound) with its shares."""

from __future__ import annotations

from decimal import Decimal

from ..features import FeatureVector
from ..models import Bottleneck


NON_COMPUTE_SHARE = 20.0


def _ms(v: float) -> str:
    """Milliseconds to two decimals, or three significant digits below 0.01 ms (a 0.00013 ms trace is
    not "0.00 ms"); no thousands separators: the reports add them (render.filters.thousands)."""
    if v != 0 and abs(v) < 0.01:
        return format(Decimal(f"{v:.3g}"), "f") + " ms"
    return f"{v:.2f} ms"


def _per_step(ms: float, profiler_steps: int) -> str:
    """The bottleneck's time per step; a trace without ProfilerStep markers is one step, and says so."""
    if profiler_steps > 0:
        return f"{_ms(ms)} per profiled step"
    return f"{_ms(ms)} in the whole trace: no ProfilerStep markers, so it counts as one step"


def classify(fv: FeatureVector) -> Bottleneck:
    step = fv.step_ms or 0.0
    if step <= 0:
        return Bottleneck(type="unknown", shares={}, summary="no measurable time in this trace")
    if fv.device_not_recorded:  # host op times of a GPU job are dispatch times: they say nothing of the device
        return Bottleneck(type="unknown", shares={}, summary=(
            "not measurable: the job ran on a device this trace does not show at work (no kernel, copy or "
            "memset events), so its host op times are dispatch times, not compute"))
    if fv.has_gpu:
        input_ms = fv.idle_data_ms_per_step or 0.0
        # the device also waits on the host before its first op and after its last one inside the steps (a CPU
        # preprocess before the GPU starts): outside the GPU span, so not in the idle gaps
        host_ms = ((fv.idle_host_ms_per_step or 0.0) + (fv.idle_sync_ms_per_step or 0.0)
                   + (fv.gpu_idle_outside_span_ms_per_step or 0.0))
        comm_ms = fv.exposed_comm_ms_per_step
        # copies and memsets that kernels do not hide: a copy overlapping compute on another stream costs no time
        memory_ms = fv.memory_exposed_ms_per_step if fv.memory_exposed_ms_per_step is not None else (
            fv.memcpy_htod_ms_per_step + fv.memcpy_dtoh_ms_per_step + fv.memcpy_dtod_ms_per_step + fv.memset_ms_per_step)
        # the union of non-collective kernels: kernels overlapping on several streams count once,
        # so compute never claims more than the GPU was busy (a plain sum can exceed the step)
        compute_ms = fv.compute_ms_per_step if fv.compute_ms_per_step is not None else max(
            0.0, (fv.kernel_ms_per_step or 0.0) - fv.comm_ms_per_step)
        basis, aside = "accounted GPU time", ""
    elif fv.has_accelerator and fv.phase_basis == "gpu":
        # a non-GPU accelerator (MTIA): its device timeline gives the phases (% of the wall time); the device
        # idle while the host is not in the DataLoader is host-bound time, as on a GPU
        def part(pct: float | None) -> float:
            return (pct or 0.0) * step / 100.0

        input_ms = part(fv.phase_dataloader_pct)
        host_ms = part(fv.phase_idle_pct)
        comm_ms = part(fv.phase_communication_pct)
        memory_ms = 0.0  # not told apart from compute on these devices' timelines
        compute_ms = part((fv.phase_forward_pct or 0.0) + (fv.phase_backward_pct or 0.0) + (fv.phase_optimizer_pct or 0.0))
        basis, aside = "accelerator time", "from its device timeline's phases"
    else:
        input_ms = fv.dataloader_ms_per_step
        host_ms = 0.0
        comm_ms = 0.0
        memory_ms = fv.cpu_copy_ms_per_step
        compute_ms = max(0.0, step - input_ms - memory_ms)
        basis = "host time"
        aside = "no CUDA/ROCm GPU events: an accelerator trace" if fv.has_accelerator else "no GPU in this trace"
    parts = {"input": input_ms, "host": host_ms, "communication": comm_ms, "memory": memory_ms, "compute": compute_ms}
    total = sum(parts.values()) or 1.0
    shares = {k: round(100.0 * v / total, 2) for k, v in parts.items()}
    # The device is the bottleneck only when nothing else holds it back: the largest
    # non-compute share names the bottleneck once it reaches NON_COMPUTE_SHARE of the time.
    waiting = {k: v for k, v in parts.items() if k != "compute"}
    worst = max(waiting, key=lambda k: waiting[k])
    kind = worst if shares[worst] >= NON_COMPUTE_SHARE else "compute"
    label = {"input": "input-bound", "host": "host-bound", "communication": "communication-bound",
             "memory": "memory-bound", "compute": "compute-bound"}[kind]
    # per-step figures are the trace's totals over its profiled steps: GPU work that runs past the
    # last CPU step still counts, so they are not compared with the mean step here
    figure = _per_step(parts[kind], fv.profiler_steps) + (f"; {aside}" if aside else "")
    summary = f"{label}: {shares[kind]:.0f}% of the {basis} ({figure})"
    return Bottleneck(type=label, shares=shares, summary=summary)  # type: ignore[arg-type]
