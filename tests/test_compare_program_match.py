"""`zoomer-ar compare A B` of two unrelated programs gave a before/after table (a speedup, findings
"resolved") without a word that the two sides were different programs. It now says so in one line, in
the text and the JSON output, from what the traces carry (nn.Module classes, GPU kernel families, CPU
operators: zoomer_ar/program_match.py), and still compares; real before/after pairs stay quiet."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from zoomer_ar.compare import compare_cmd
from zoomer_ar.load import load_job
from zoomer_ar.program_match import kernel_family, mismatch_note, program_names

REPO = Path(__file__).resolve().parents[1]
WARNING = "the two sides do not look like runs of the same program"


def _names(path: Path):
    return program_names(load_job(path).ranks)


def _run(before: Path, after: Path, *args: str) -> str:
    out = CliRunner().invoke(compare_cmd, [str(before), str(after), *args])
    assert out.exit_code == 0, out.output
    return out.output


def test_two_programs_are_said_to_be_two_in_text_and_json(shared_traces):
    """A recsys job on A100s and a ResNet-50 (kernel families: 6 of 101 shared)."""
    before = shared_traces / "hta/trace_diff/control"
    after = shared_traces / "kineto/resnet50_num_workers_4"
    text = _run(before, after).splitlines()
    assert text[0].startswith(f"warning     {WARNING}: they share ") and "GPU kernel families" in text[0]
    assert sum(WARNING in line for line in text) == 1
    assert any(line.startswith("step time ") for line in text)  # still compared
    result = json.loads(_run(before, after, "--format", "json"))
    assert result["program_warning"].startswith(WARNING) and "\n" not in result["program_warning"]
    assert result["step_ms"]["before"] and result["step_ms"]["after"]


@pytest.mark.parametrize(("before", "after", "basis"), [
    ("examples/gpu/sync_point", "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "nn.Module classes"),
    ("hta/mtia_trace_single_rank/mtia_rank_0.json.gz", "examples/traces/extra_copy", "CPU operators"),
])
def test_each_basis_tells_two_programs_apart(shared_traces, before, after, basis):
    side = lambda p: REPO / p if p.startswith("examples/") else shared_traces / p  # noqa: E731
    note = mismatch_note(_names(side(before)), _names(side(after)))
    assert note is not None and note.startswith(WARNING) and basis in note


def test_runs_of_one_program_on_other_gpus_are_not_warned_about(shared_traces):
    """hta/trace_diff: the same recsys program on an A100 (rank 3 of 8) and a V100 (rank 1 of 2), one side
    partly compiled; kineto's resnet50 with 0 and 4 DataLoader workers."""
    for a, b in (("hta/trace_diff/control", "hta/trace_diff/test"),
                 ("kineto/resnet50_num_workers_0", "kineto/resnet50_num_workers_4")):
        assert mismatch_note(_names(shared_traces / a), _names(shared_traces / b)) is None, (a, b)
    output = _run(shared_traces / "hta/trace_diff/control", shared_traces / "hta/trace_diff/test", "--format", "json")
    assert json.loads(output)["program_warning"] is None


@pytest.mark.parametrize("folder", ["examples/traces", "examples/gpu"])
def test_a_scenario_and_its_clean_twin_are_one_program(folder):
    twins = sorted(p for p in (REPO / folder).glob("*_clean") if p.is_dir())
    assert len(twins) >= 9
    for twin in twins:
        planted = twin.with_name(twin.name.removesuffix("_clean"))
        assert mismatch_note(_names(planted), _names(twin)) is None, planted.name
        assert mismatch_note(_names(twin), _names(planted)) is None, planted.name


def test_cpu_and_gpu_recordings_of_a_scenario_are_one_program():
    for cpu in sorted(p for p in (REPO / "examples/traces").iterdir() if p.is_dir()):
        gpu = REPO / "examples/gpu" / cpu.name
        assert mismatch_note(_names(cpu), _names(gpu)) is None, cpu.name


def test_the_text_output_of_a_real_pair_has_no_warning():
    out = _run(REPO / "examples/traces/sync_point", REPO / "examples/traces/sync_point_clean")
    assert WARNING not in out and "warning" not in out


def test_kernel_family_drops_arguments_and_architecture():
    assert kernel_family("void at::native::vectorized_elementwise_kernel<4, float>(int, float*)") == \
        "at::native::vectorized_elementwise_kernel"
    assert kernel_family("void at::native::(anonymous namespace)::reduce<float>(float*)") == "at::native::reduce"
    assert kernel_family("sm80_softmax_fwd<float>(float*)") == kernel_family("sm90_softmax_fwd<half>(half*)") == "softmax_fwd"
    # the GEMM kernel a library picks for the GPU, dtype and shape: one family (the fp32_matmul twins differ in these alone)
    gemms = ["volta_sgemm_128x64_nn", "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_execute_kernel__5x_cublas",
             "nvjet_sm90_tst_64x8_64x16_1x2_h_bz_NNT", "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm>(Params)",
             "Cijk_Ailk_Bljk_SB_MT64x64x8_SN", "cublasLt::splitKreduce_kernel<float>(float*)"]
    assert {kernel_family(k) for k in gemms} == {"<library matmul>"}
    assert kernel_family("cudnn::winograd_nonfused::winogradForwardData4x4<float>(...)") == "<library convolution>"


def test_a_twin_that_runs_other_gemm_kernels_shares_most_kernel_families():
    """examples/gpu fp32_matmul and its twin (TF32/bf16 GEMMs): every kernel that differs is a library GEMM;
    read as kernel names they shared 24%, a hair above the line, and a trace without module frames
    (torch.profiler's default) would be judged on kernels alone."""
    from zoomer_ar.program_match import MIN_KERNEL_SHARE, _share

    gpu = REPO / "examples" / "gpu"
    a, b = _names(gpu / "fp32_matmul"), _names(gpu / "fp32_matmul_clean")
    assert _share(a.kernels, b.kernels) >= 2 * MIN_KERNEL_SHARE


def test_an_mlp_and_a_cnn_are_two_programs_though_both_use_linear_and_relu():
    """Generic classes (Linear, ReLU, Sequential) are in every model: an MLP and a CNN shared 3 of their 7
    classes (43%), above the first threshold (25%), and were taken for one program."""
    traces = REPO / "examples" / "traces"
    mlp, cnn = _names(traces / "single_tensor_optimizer"), _names(traces / "dataloader_bound")
    assert {"Linear", "ReLU"} <= mlp.modules & cnn.modules and "Conv2d" in cnn.modules - mlp.modules
    note = mismatch_note(mlp, cnn)
    assert note is not None and "nn.Module classes" in note


def test_a_compiled_after_of_the_same_model_is_one_program():
    """torch.compile with a graph break (recorded here with aot_eager): the eager parts keep their module
    frames, the compiled ones record none and add GraphModule/OptimizedModule. Its classes are some of the
    eager run's, which shared under half with it and was taken for another program."""
    from zoomer_ar.program_match import ProgramNames

    ops = frozenset(f"aten::op{i}" for i in range(20))
    eager = ProgramNames(frozenset({"Block", "Attention", "Dropout", "LayerNorm", "Linear", "Sequential", "GELU"}),
                         frozenset(), ops, compiled=False)
    frames = [f"nn.Module: {c}_0" for c in ("Linear", "Sequential", "GraphModule", "OptimizedModule")]
    compiled = _program_of(frames, ops, compiled=True)
    assert compiled.modules == {"Linear", "Sequential"}  # the wrappers are not the model's classes
    assert mismatch_note(eager, compiled) is None and mismatch_note(compiled, eager) is None
    other = _program_of([f"nn.Module: {c}_0" for c in ("Conv2d", "BatchNorm2d", "Sequential", "OptimizedModule")],
                        ops, compiled=True)
    assert mismatch_note(eager, other) is not None  # a compiled CNN is still another program


def _program_of(frames: list[str], ops: frozenset[str], compiled: bool):
    """program_names of a real (tiny) column trace holding these python_function frames."""
    events = [{"ph": "X", "cat": "python_function", "name": n, "ts": i, "dur": 1, "pid": 1, "tid": 1}
              for i, n in enumerate(frames)]
    events += [{"ph": "X", "cat": "cpu_op", "name": n, "ts": 100 + i, "dur": 1, "pid": 1, "tid": 1}
               for i, n in enumerate(sorted(ops) + (["CompiledFunction"] if compiled else []))]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json.gz"
        path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
        return program_names(load_job(path).ranks)


def test_saved_findings_are_judged_as_their_traces(shared_traces, tmp_path):
    """findings.json keeps the names (`program`, schema 1.1): comparing two saved analyses, or a saved one with a
    trace, warns exactly as comparing the traces does; one of schema 1.0 (no `program`) says nothing."""
    from zoomer_ar.cli import main

    def saved(trace: Path, name: str) -> Path:
        out = tmp_path / name
        assert main(["analyze", str(trace), "--out", str(out), "--no-progress"]) == 0
        return out / "findings.json"

    mtia = shared_traces / "hta/mtia_trace_single_rank/mtia_rank_0.json.gz"
    copy, copy_clean = REPO / "examples/traces/extra_copy", REPO / "examples/traces/extra_copy_clean"
    a, b, c = saved(mtia, "mtia"), saved(copy, "copy"), saved(copy_clean, "copy_clean")
    doc = json.loads(b.read_text())
    assert doc["schema_version"] == "1.1" and doc["program"]["operators"] == sorted(doc["program"]["operators"])
    assert doc["program"]["modules"] and not doc["program"]["compiled"]
    by_traces = json.loads(_run(mtia, copy, "--format", "json"))["program_warning"]
    assert by_traces and by_traces.startswith(WARNING) and "CPU operators" in by_traces
    assert json.loads(_run(a, b, "--format", "json"))["program_warning"] == by_traces
    assert json.loads(_run(a, copy, "--format", "json"))["program_warning"] == by_traces
    assert json.loads(_run(b, c, "--format", "json"))["program_warning"] is None  # a scenario and its clean twin
    old = tmp_path / "old.json"  # as an earlier zoomer-ar wrote it
    doc.pop("program")
    doc["schema_version"] = "1.0"
    old.write_text(json.dumps(doc))
    assert json.loads(_run(a, old, "--format", "json"))["program_warning"] is None


@pytest.mark.parametrize("trace", ["kineto/resnet50_num_workers_0", "param/dlrm_8ranks", "hta/trace_diff/control",
                                   "hta/mtia_trace_single_rank"])
def test_a_streamed_run_keeps_the_names_the_in_memory_one_has(shared_traces, trace):
    """The streaming pass keeps a subset of the rows, but records the names of every row it reads (stream/compact.py):
    a streamed analysis's `program` equals the in-memory one's, so compare judges a large run too."""
    from zoomer_ar.analyze import analyze_path

    whole = analyze_path(shared_traces / trace, stream=False)
    streamed = analyze_path(shared_traces / trace, stream=True)
    assert any("streaming pass" in n for n in streamed.notes)
    assert whole.program is not None and (whole.program.operators or whole.program.kernel_families)
    assert streamed.program == whole.program


def test_two_streamed_programs_are_said_to_be_two(shared_traces, monkeypatch):
    monkeypatch.setenv("ZOOMER_STREAM_THRESHOLD", "0")  # every trace read in a streaming pass
    text = _run(shared_traces / "hta/trace_diff/control", shared_traces / "kineto/resnet50_num_workers_4").splitlines()
    assert text[0].startswith(f"warning     {WARNING}: they share ") and "GPU kernel families" in text[0]
