"""Start-up inside the profile: outlier runtime calls (at least 1 ms and 100x the typical call of their
API) and stream captures into CUDA/HIP graphs before the second profiled step are one-off work - a first
launch loading its module, context creation, a first cudaFree, launches recorded into a graph and not
run - not a per-step cost. idle-gpu and launch-bound leave the GPU idle time they
hold out of their impact, the analysis says so in a note, and the calls are evidence.

tracelens/perf_model/normalization (MI300X, a layer test profiled from the program's start): 8 of its
150 hipLaunchKernel calls take 8.6-331.6 ms against a typical 5.3 us; they hold 978.6 of the 1,067.8 ms
of GPU idle time. Both findings used to claim 90% of the step as avoidable launch overhead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_job, analyze_path
from zoomer_ar.features import extract
from zoomer_ar.load import load_job
from zoomer_ar.stream import load_job_streaming

NORMALIZATION = "tracelens/perf_model/normalization/normalization_layer_test.json.gz"


def _finding(analysis, pattern):
    return next(f for f in analysis.findings if f.pattern == pattern)


def test_start_up_launches_are_left_out_of_the_impact_on_the_real_trace(shared_traces):
    a = analyze_path(shared_traces / NORMALIZATION)
    fv = a.features
    assert fv["startup_calls"] >= 8
    assert 0.85 * fv["gpu_idle_ms_per_step"] < fv["idle_startup_ms_per_step"] < fv["gpu_idle_ms_per_step"]
    assert fv["idle_startup_host_ms_per_step"] <= fv["idle_host_ms_per_step"]
    idle, launch = _finding(a, "idle-gpu"), _finding(a, "launch-bound")
    step = fv["step_ms"]
    assert idle.impact.ms_per_step == pytest.approx(fv["gpu_idle_ms_per_step"] - fv["idle_startup_ms_per_step"], rel=1e-3)
    assert launch.impact.ms_per_step == pytest.approx(fv["idle_host_ms_per_step"] - fv["idle_startup_host_ms_per_step"],
                                                      rel=1e-3)
    assert idle.impact.pct_of_step < 10.0 < 100.0 * fv["gpu_idle_ms_per_step"] / step  # 90% before
    assert idle.severity != "critical"
    # the calls are evidence: the longest first, with its typical cost
    calls = [e for e in idle.evidence.events if e.name == "hipLaunchKernel"]
    assert calls and calls[0].dur_ms > 300 and "the typical hipLaunchKernel" in calls[0].detail
    assert ", for void at::native::batch_norm_collect_statistics_kernel<" in calls[0].detail
    (note,) = [n for n in a.notes if n.startswith("Start-up inside the profile")]
    assert "hipLaunchKernel for 331.6 ms" in note and "warmup" in note and "whether this work recurs" in note


def test_the_streaming_path_finds_the_same_start_up(shared_traces):
    path = shared_traces / NORMALIZATION
    ref, got = analyze_job(load_job(path)), analyze_job(load_job_streaming(path, workers=1))
    keys = ("startup_calls", "idle_startup_ms_per_step", "idle_startup_host_ms_per_step")
    assert [ref.features[k] for k in keys] == [got.features[k] for k in keys]
    assert [f.evidence.model_dump() for f in ref.findings] == [f.evidence.model_dump() for f in got.findings]


def _trace(tmp_path: Path, slow: list[tuple[int, float]], steps: int = 3, api: str = "cudaLaunchKernel",
           base: float = 5.0) -> Path:
    """`steps` ProfilerSteps of 10 ms on one thread, each launching two kernels: a `base` us launch at +1 us whose
    kernel runs 4 ms, then a call of `api` at +4,020 us lasting `slow`'s duration for that step (default `base`)
    whose kernel starts 3 us after it ends. A slow call leaves the GPU idle while the host sits in it."""
    events, corr = [], 0

    def x(name, cat, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0 if cat == "kernel" else 1,
                "tid": 7 if cat == "kernel" else 1, "args": args}

    slow_of = dict(slow)
    for s in range(steps):
        t0 = 1_000_000.0 + s * 10_000.0
        events.append(x(f"ProfilerStep#{s}", "user_annotation", t0, 9_990.0))
        corr += 1
        events += [x("cudaLaunchKernel", "cuda_runtime", t0 + 1, base, correlation=corr),
                   x("fast_kernel", "kernel", t0 + 10, 4_000, correlation=corr, stream=7, device=0)]
        d = slow_of.get(s, base)
        corr += 1
        events += [x(api, "cuda_runtime", t0 + 4_020, d, correlation=corr),
                   x("late_kernel", "kernel", t0 + 4_020 + d + 3, 100, correlation=corr, stream=7, device=0)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"name": "NVIDIA H100"}]}))
    return p


def _features(path: Path):
    return extract(load_job(path))


def test_an_outlier_in_the_first_step_is_start_up(tmp_path):
    jf = _features(_trace(tmp_path, [(0, 3_000.0)]))
    v = jf.vector
    assert v.startup_calls == 1
    assert v.idle_startup_ms_per_step == pytest.approx(3.0 / 3, rel=1e-9)  # the whole call, in one of 3 steps
    assert v.idle_startup_host_ms_per_step == pytest.approx(v.idle_startup_ms_per_step)
    (e,) = jf.evidence["startup_calls"]
    assert e.name == "cudaLaunchKernel" and e.dur_ms == 3.0
    # the kernel it launched: a first launch loads that kernel's module
    assert e.detail == "600x the typical cudaLaunchKernel (5.0 us), for late_kernel; the GPU was idle for 3.000 ms of it"


def test_an_outlier_in_a_later_step_recurs_and_stays_idle_time(tmp_path):
    v = _features(_trace(tmp_path, [(2, 3_000.0)])).vector
    assert v.startup_calls == 0 and v.idle_startup_ms_per_step == 0.0
    assert v.idle_host_ms_per_step > 0.9  # the 3 ms stall is ordinary host-bound idle time, 1 ms a step


@pytest.mark.parametrize("base, slow_us, outlier", [
    (5.0, 900.0, False),    # 180x the typical call, but under 1 ms
    (5.0, 1_200.0, True),   # 240x and over 1 ms
    (20.0, 3_000.0, True),  # 150x
    (50.0, 3_000.0, False),  # 60x: a slower call, not an outlier
])
def test_an_outlier_is_at_least_1_ms_and_100_times_the_typical_call(tmp_path, base, slow_us, outlier):
    assert _features(_trace(tmp_path, [(0, slow_us)], base=base)).vector.startup_calls == int(outlier)


def test_one_slow_call_among_two_stands_out_by_the_lower_median(tmp_path):
    # cudaMalloc called twice: 2 ms in the first step, 5 us in the second; their plain median would be ~1 ms
    jf = _features(_trace(tmp_path, [(0, 2_000.0)], steps=2, api="cudaMalloc"))
    assert jf.vector.startup_calls == 1
    assert jf.evidence["startup_calls"][0].detail.startswith("400x the typical cudaMalloc (5.0 us)")


def test_without_steps_every_outlier_counts(tmp_path):
    p = _trace(tmp_path, [(2, 3_000.0)])
    doc = json.loads(p.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    p.write_text(json.dumps(doc))
    v = _features(p).vector
    assert v.profiler_steps == 0 and v.startup_calls == 1 and v.idle_startup_ms_per_step == pytest.approx(3.0)


# --- graph capture --------------------------------------------------------------------------------------------

VLLM_CAPTURE = "tracelens/inference/vllm_decode_full/capture_traces"


def test_a_graph_capture_is_start_up_on_the_real_trace(shared_traces):
    """vLLM's CUDA-graph capture on MI300X: 421 launches between hipStreamBeginCapture and hipStreamEndCapture
    run nothing (recorded into the graph); the GPU idles 55 of the 59 ms. idle-gpu said 97.7% avoidable."""
    (path,) = sorted((shared_traces / VLLM_CAPTURE).iterdir())
    a = analyze_path(path)
    fv = a.features
    assert fv["captured_launches"] > 400 and fv["startup_calls"] == 0
    assert fv["idle_startup_ms_per_step"] > 0.9 * fv["gpu_idle_ms_per_step"]
    idle = _finding(a, "idle-gpu")
    assert idle.impact.pct_of_step < 10.0
    captures = [e for e in idle.evidence.events if e.category == "capture"]
    assert captures and captures[0].name.startswith("graph capture (hipStreamBeginCapture")
    assert "launches recorded into a graph, not run" in captures[0].detail
    (note,) = [n for n in a.notes if n.startswith("Start-up inside the profile")]
    assert "graph capture" in note
    ref, got = analyze_job(load_job(path)), analyze_job(load_job_streaming(path, workers=1))
    assert [ref.features[k] for k in ("captured_launches", "idle_startup_ms_per_step")] == \
        [got.features[k] for k in ("captured_launches", "idle_startup_ms_per_step")]


def _capture_trace(tmp_path: Path, capture_step: int, steps: int = 3) -> Path:
    """`steps` ProfilerSteps of 10 ms, each a launch whose 4 ms kernel runs, then 2 ms of host work; in step
    `capture_step` the host captures a graph from +5,000 to +9,000 us instead: 20 launches, no kernel runs."""
    events, corr = [], 0

    def x(name, cat, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0 if cat == "kernel" else 1,
                "tid": 7 if cat == "kernel" else 1, "args": args}

    for s in range(steps):
        t0 = 1_000_000.0 + s * 10_000.0
        events.append(x(f"ProfilerStep#{s}", "user_annotation", t0, 9_990.0))
        corr += 1
        events += [x("cudaLaunchKernel", "cuda_runtime", t0 + 1, 5, correlation=corr),
                   x("k", "kernel", t0 + 10, 4_000, correlation=corr, stream=7, device=0)]
        if s == capture_step:
            events.append(x("cudaStreamBeginCapture", "cuda_runtime", t0 + 5_000, 3))
            for j in range(20):
                corr += 1
                events.append(x("cudaLaunchKernel", "cuda_runtime", t0 + 5_100 + 150 * j, 5, correlation=corr))
            events.append(x("cudaStreamEndCapture", "cuda_runtime", t0 + 8_990, 10))
    corr += 1  # a last kernel after the steps, so every step's idle lies inside the GPU span
    events += [x("cudaLaunchKernel", "cuda_runtime", 1_000_000.0 + steps * 10_000.0, 5, correlation=corr),
               x("k", "kernel", 1_000_000.0 + steps * 10_000.0 + 10, 100, correlation=corr, stream=7, device=0)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"name": "NVIDIA H100"}]}))
    return p


def test_a_capture_in_the_first_step_is_start_up_and_a_later_one_recurs(tmp_path):
    first = _features(_capture_trace(tmp_path, 0)).vector
    assert first.captured_launches == 20
    assert first.idle_startup_ms_per_step == pytest.approx(4.0 / 3, rel=1e-6)  # the capture's 4 ms, in 3 steps
    later_dir = tmp_path / "later"
    later_dir.mkdir()
    later = _features(_capture_trace(later_dir, 2)).vector
    assert later.captured_launches == 0 and later.idle_startup_ms_per_step == 0.0
    assert later.gpu_idle_ms_per_step == pytest.approx(first.gpu_idle_ms_per_step)


# --- torch.compile ------------------------------------------------------------------------------------------

RECOMPILE = Path(__file__).parent / "data" / "compile" / "recompile.pt.trace.json.gz"


def test_compilation_and_a_recompilation_on_a_real_cpu_trace():
    """tests/data/compile/recompile.py: a torch.compile'd MLP profiled from the program's start (CPU, torch
    2.13); step 0 compiles (1.7 s: `_compile.compile_inner (dynamo_timed)`), step 2 gets a larger batch and
    recompiles. No GPU: no idle time to leave out, but the first step and the recompilation are named."""
    a = analyze_path(RECOMPILE)
    fv = a.features
    assert fv["profiler_steps"] == 5
    assert fv["startup_compiles"] == 1 and fv["recompiles"] == 1
    assert fv["recompile_ms_per_step"] > 0 and fv["first_step_ms"] > 100 * fv["step_ms_p50"]
    first = next(n for n in a.notes if n.startswith("The first profiled step took"))
    assert "torch.compile compiling in it" in first and "understated" in first
    again = next(n for n in a.notes if n.startswith("torch.compile compiled again"))
    assert "1 recompilation" in again and "TORCH_LOGS=recompiles" in again
    ref, got = analyze_job(load_job(RECOMPILE)), analyze_job(load_job_streaming(RECOMPILE, workers=1))
    keys = ("startup_compiles", "recompiles", "recompile_ms_per_step", "first_step_ms")
    assert [ref.features[k] for k in keys] == [got.features[k] for k in keys]


def _compile_gpu_trace(tmp_path: Path, compile_step: int | None, recompile_step: int | None) -> Path:
    """3 steps of 60 ms; each runs 5 kernels from +100 us; in `compile_step` the host first launches one kernel,
    then compiles for 30 ms (the lazy backward compile: GPU idle, inside the GPU span), then launches the rest;
    in `recompile_step` it compiles for 20 ms before launching."""
    events, corr = [], 0

    def x(name, cat, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0 if cat == "kernel" else 1,
                "tid": 7 if cat == "kernel" else 1, "args": args}

    def launch(ts, dur_us):
        nonlocal corr
        corr += 1
        return [x("cudaLaunchKernel", "cuda_runtime", ts, 5, correlation=corr),
                x("k", "kernel", ts + 8, dur_us, correlation=corr, stream=7, device=0)]

    t = 1_000_000.0
    for s in range(3):
        events.append(x(f"ProfilerStep#{s}", "user_annotation", t, 59_990.0))
        k = t + 100
        events += launch(k, 2_000)
        k += 2_100
        if s == compile_step:
            events.append(x("backward._backward_impl (dynamo_timed)", "cpu_op", k, 30_000))
            events.append(x("compile_fx_inner (dynamo_timed)", "cpu_op", k + 10, 29_000))
            k += 30_010
        if s == recompile_step:
            events.append(x("_compile.compile_inner (dynamo_timed)", "cpu_op", k, 20_000))
            k += 20_010
        for j in range(4):
            events += launch(k + 2_010 * j, 2_000)
        t += 60_000.0
    events += launch(t, 100)
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"name": "NVIDIA H100"}]}))
    return p


def test_gpu_idle_while_compiling_in_the_first_step_is_start_up(tmp_path):
    jf = _features(_compile_gpu_trace(tmp_path, 0, None))
    v = jf.vector
    assert v.startup_compiles == 1 and v.recompiles == 0  # the nested compile_fx_inner is not counted apart
    assert v.idle_startup_ms_per_step == pytest.approx(30.0 / 3, rel=1e-3)
    (e,) = [e for e in jf.evidence["startup_calls"] if e.name.endswith("(dynamo_timed)")]
    assert e.name == "backward._backward_impl (dynamo_timed)" and "torch.compile compiling" in e.detail


def test_a_recompilation_stays_idle_time_and_gets_a_note(tmp_path):
    path = _compile_gpu_trace(tmp_path, None, 2)
    a = analyze_path(path)
    assert a.features["recompiles"] == 1 and a.features["idle_startup_ms_per_step"] == 0.0
    assert a.features["recompile_ms_per_step"] == pytest.approx(20.0 / 3)
    assert any(n.startswith("torch.compile compiled again after the first profiled step: 1 recompilation")
               for n in a.notes)


def test_compare_says_when_a_run_holds_start_up():
    from zoomer_ar.compare import compare

    examples = Path(__file__).resolve().parent.parent / "examples" / "traces"
    startup, clean = analyze_path(RECOMPILE), analyze_path(examples / "clean")
    got = compare(startup, clean)
    (note,) = [n for n in got["notes"] if n.startswith("start-up inside the profile")]
    assert "before's (first step" in note and "after's" not in note and "median steps: before" in note
    assert not [n for n in compare(clean, clean)["notes"] if n.startswith("start-up")]


def _renumbered(path: Path, first: int) -> Path:
    """The same trace with its steps numbered from `first` (a schedule that skipped `first` steps)."""
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        if e["name"].startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'][13:]) + first}"
    out = path.with_name(f"from{first}.json")
    out.write_text(json.dumps(doc))
    return out


def test_a_profile_that_starts_after_the_program_holds_no_start_up(tmp_path):
    """ProfilerStep#3 first: the schedule's wait and warm-up steps ran the program's first iterations
    unrecorded, start-up included: an outlier call or a capture in the window is ordinary idle time, and a
    compilation there is a recompilation."""
    calls = _trace(tmp_path, [(0, 3_000.0)])
    assert _features(calls).vector.startup_calls == 1
    late = _features(_renumbered(calls, 3)).vector
    assert late.first_profiled_step == 3 and late.startup_calls == 0 and late.idle_startup_ms_per_step == 0.0
    cap_dir = tmp_path / "cap"
    cap_dir.mkdir()
    assert _features(_renumbered(_capture_trace(cap_dir, 0), 3)).vector.captured_launches == 0
    comp_dir = tmp_path / "comp"
    comp_dir.mkdir()
    v = _features(_renumbered(_compile_gpu_trace(comp_dir, 0, None), 3)).vector
    assert v.startup_compiles == 0 and v.recompiles == 1 and v.idle_startup_ms_per_step == 0.0
