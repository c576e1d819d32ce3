"""examples/gpu/README.md says what `zoomer-ar analyze` reports on each GPU recording: its table is
checked against the analysis itself (rounded as printed), so a rule change that moves a finding shows
up here until the table is regenerated; and tests/test_gpu_scenarios.py's word on fp32-matmul (quiet
on the launch-bound recordings) is checked against the recordings."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "examples" / "gpu"
MODEL_ONLY = "†"  # the README's mark for a finding the learned model alone reported
ROW = re.compile(r"^\| `(?P<name>[a-z0-9_]+)` \| (?P<step>[\d.]+) \| (?P<busy>\d+) \| (?P<findings>.*) \|$")
FINDING = re.compile(rf"^(?P<pattern>[a-z0-9-]+) (?P<pct>[\d.]+)%(?P<model> {MODEL_ONLY})?$")


def _table() -> dict[str, tuple[float, float, dict[str, tuple[float, bool]]]]:
    """program -> (step ms, GPU busy %, {pattern: (impact %, found by the model alone)})."""
    rows = {}
    for line in (GPU / "README.md").read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        findings = {}
        for item in m["findings"].split(", "):
            f = FINDING.match(item)
            assert f is not None, f"unreadable finding {item!r} in {line!r}"
            findings[f["pattern"]] = (float(f["pct"]), f["model"] is not None)
        rows[m["name"]] = (float(m["step"]), float(m["busy"]), findings)
    return rows


@functools.lru_cache(maxsize=None)
def _analysis(name: str):
    return analyze_path(GPU / name)


def test_the_table_lists_every_recording():
    recorded = sorted(p.name for p in GPU.iterdir() if (p / "job.json").is_file())
    assert sorted(_table()) == recorded


@pytest.mark.parametrize("name", sorted(_table()))
def test_gpu_readme_row_is_what_analyze_reports(name):
    step, busy, findings = _table()[name]
    result = _analysis(name)
    feats = result.features
    assert round(feats["step_ms"], 1) == pytest.approx(step, abs=0.051), "step ms"
    assert round(feats["gpu_busy_pct"]) == pytest.approx(busy, abs=0.51), "GPU busy %"
    found = {f.pattern: (round(f.impact.pct_of_step, 1), "rules" not in f.detected_by) for f in result.findings}
    assert sorted(found) == sorted(findings), (
        "regenerate the table in examples/gpu/README.md from `zoomer-ar analyze examples/gpu/NAME --format json`")
    for pattern, (pct, model_only) in findings.items():
        assert found[pattern][0] == pytest.approx(pct, abs=0.051), pattern
        assert found[pattern][1] == model_only, f"{pattern}: the {MODEL_ONLY} mark"


def test_fp32_matmul_is_quiet_where_the_gpu_waits_for_launches():
    """Every recording but one runs FP32 GEMMs in a launch-bound step: the GPU's wait for the host
    exceeds half their time, so fp32-matmul (half the FP32 GEMM time less that wait) is quiet; only
    the CUDA-graph replay keeps the GPU busy and shows it."""
    shown = set()
    for name in _table():
        feats = _analysis(name).features
        if feats["fp32_gemm_share"] < 0.5:
            continue
        if any(f.pattern == "fp32-matmul" for f in _analysis(name).findings):
            shown.add(name)
        else:
            assert feats["idle_host_ms_per_step"] >= 0.5 * feats["fp32_gemm_ms_per_step"], name
    assert shown == {"launch_bound_clean"}
