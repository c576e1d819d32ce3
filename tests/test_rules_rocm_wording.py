"""An AMD (ROCm) job's findings in HIP's words, rule by rule.

sync-point ('one `cudaStreamSynchronize`'), misaligned-gemm ('Tensor-core GEMM kernels'),
conv-bias-before-bn ('cuDNN paths'), single-tensor-optimizer ('`fused=True` ... on CUDA') and
exposed-communication ('NVLink/InfiniBand in use') told an
AMD job about NVIDIA's runtime and libraries. None of them fires on the corpus's AMD traces, so their
findings are built on the MI300X trace's own features, as the engine builds them.
"""

from __future__ import annotations

import re

import pytest

from zoomer_ar.detect.engine import finding_from_rule
from zoomer_ar.detect.rules import get_rule, load_rules

ROCM_TRACE = "tracelens/perf_model/normalization/normalization_layer_test.json.gz"  # MI300X, ROCm
# NVIDIA-only runtime calls, libraries and hardware words (torch.cuda.* stays: PyTorch's ROCm build keeps it)
CUDA_ONLY = re.compile(r"\bcuda[A-Z]\w*|CUDA[ -]graph|Ampere|[Tt]ensor[- ]cores?|cuDNN|cuBLAS|\bon CUDA\b|NVLink")


@pytest.fixture(scope="module")
def amd_job(shared_traces):
    from zoomer_ar.features import extract
    from zoomer_ar.load import load_job

    jf = extract(load_job(shared_traces / ROCM_TRACE))
    features = jf.vector.model_dump()
    assert features["accelerator"] == "amd" and features["has_gpu"]
    return jf, features


def _finding(rule_id: str, amd_job):
    jf, features = amd_job
    result = {"impact_ms": 1.0, "impact_pct": 10.0, "confidence": 0.8}
    return finding_from_rule(get_rule(rule_id), result, jf, features)


def _words(f) -> str:
    return "\n".join((f.title, f.explanation, f.recommendation))


@pytest.mark.parametrize(("rule_id", "hip_words"), [
    ("sync-point", ["hipMemcpyWithStream", "hipDeviceSynchronize", "torch.cuda.synchronize()"]),
    ("misaligned-gemm", ["rocBLAS", "hipBLASLt", "matrix-core"]),
    ("conv-bias-before-bn", ["MIOpen"]),
    ("single-tensor-optimizer", ["PyTorch's ROCm build runs the\nfused kernels"]),
    ("exposed-communication", ["RCCL", "Infinity Fabric (xGMI)", "TORCH_NCCL_AVOID_RECORD_STREAMS=1"]),
])
def test_an_amd_job_reads_hip_names(amd_job, rule_id, hip_words):
    f = _finding(rule_id, amd_job)
    words = _words(f)
    assert not CUDA_ONLY.search(words), (rule_id, CUDA_ONLY.search(words))
    for w in hip_words:
        assert w in words, (rule_id, w)


def test_a_cuda_job_keeps_the_cuda_words():
    """The rules' own (NVIDIA) wording is what a CUDA GPU's finding still reads."""
    nvidia = {"accelerator": "nvidia", "has_accelerator": True, "has_gpu": True}
    assert "cudaStreamSynchronize" in get_rule("sync-point").text_for(nvidia).explanation
    assert "cuDNN" in get_rule("conv-bias-before-bn").text_for(nvidia).explanation
    assert get_rule("misaligned-gemm").text_for(nvidia).title == "Matrix dimensions are not tensor-core aligned"


def test_no_rule_names_a_cuda_only_api_to_an_amd_job():
    """Every rule, as an AMD GPU job reads it (torch.cuda.* and NCCL's environment variables, which
    RCCL reads too, are fine there)."""
    amd = {"accelerator": "amd", "has_accelerator": True, "has_gpu": True}
    for rule in load_rules():
        for field, text in rule.text_for(amd)._asdict().items():
            assert not CUDA_ONLY.search(text), (rule.id, field, CUDA_ONLY.search(text))
