"""Combined impact of several findings (zoomer_ar.detect.combine): parts of idle-gpu's idle time
count once, independent findings add up, the total stays within the step."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.compare import compare
from zoomer_ar.analyze import analyze_path
from zoomer_ar.detect.combine import combined_impact
from zoomer_ar.detect.rules import RuleError, load_rule, load_rules
from zoomer_ar.models import Evidence, Finding, Impact

REPO = Path(__file__).resolve().parents[1]
STEP_MS = 10.0


def _f(pattern: str, ms: float) -> Finding:
    pct = 100.0 * ms / STEP_MS
    return Finding(pattern=pattern, title=pattern, severity="high", confidence=0.9,
                   impact=Impact(ms_per_step=ms, pct_of_step=pct, gpu_hours_per_1000_steps=ms / 3600.0),
                   evidence=Evidence(), recommendation="")


def test_the_parts_of_idle_count_once():
    # launch-bound's host-bound idle is part of idle-gpu's idle: fixing both saves the idle once
    c = combined_impact([_f("idle-gpu", 9.0), _f("launch-bound", 8.5)])
    assert c.ms_per_step == pytest.approx(9.0) and c.pct_of_step == pytest.approx(90.0)
    c = combined_impact([_f("idle-gpu", 6.0), _f("launch-bound", 3.0), _f("sync-point", 2.0), _f("dataloader-bound", 0.5)])
    assert c.ms_per_step == pytest.approx(6.0)


def test_parts_without_their_whole_and_independent_findings_add_up():
    c = combined_impact([_f("launch-bound", 3.0), _f("sync-point", 2.0), _f("allocator-churn", 1.0)])
    assert c.ms_per_step == pytest.approx(6.0)
    c = combined_impact([_f("idle-gpu", 4.0), _f("launch-bound", 3.0), _f("pageable-memcpy", 1.5)])
    assert c.ms_per_step == pytest.approx(5.5)
    assert c.gpu_hours_per_1000_steps == pytest.approx(5.5 / 3600.0)


def test_total_is_capped_at_the_step():
    c = combined_impact([_f("idle-gpu", 8.0), _f("fp32-matmul", 3.0), _f("extra-copy", 2.0)])
    assert c.pct_of_step == pytest.approx(100.0)
    assert c.ms_per_step == pytest.approx(STEP_MS)
    assert combined_impact([]).ms_per_step == 0.0


def test_within_is_declared_by_the_rules_and_checked(tmp_path):
    within = {r.id: r.within for r in load_rules() if r.within}
    assert within == {"launch-bound": "idle-gpu", "sync-point": "idle-gpu", "dataloader-bound": "idle-gpu",
                      "single-tensor-optimizer": "idle-gpu", "allocator-churn": "idle-gpu"}
    text = (REPO / "rules" / "sync-point.yaml").read_text(encoding="utf-8")
    for bad, why in (("no-such-pattern", "not an anti-pattern id"), ("sync-point", "within itself")):
        (tmp_path / "sync-point.yaml").write_text(text.replace("within: idle-gpu", f"within: {bad}"), encoding="utf-8")
        with pytest.raises(RuleError, match=why):
            load_rule(tmp_path / "sync-point.yaml")


def test_predicted_gain_of_a_real_gpu_fix():
    """examples/gpu: launch_bound -> its CUDA-graph twin resolves idle-gpu and launch-bound. The
    prediction counts the idle once (the plain sum was 186% of the step) and lands near what the
    twin measured."""
    result = compare(analyze_path(REPO / "examples" / "gpu" / "launch_bound"),
                     analyze_path(REPO / "examples" / "gpu" / "launch_bound_clean"))
    assert set(result["resolved"]) >= {"idle-gpu", "launch-bound"}
    before = result["step_ms"]["before"]
    assert result["predicted_gain_ms"] <= before
    assert result["predicted_gain_ms"] == pytest.approx(result["measured_gain_ms"], rel=0.15)


def test_reports_say_which_findings_lie_within_another(tmp_path):
    from zoomer_ar.detect.combine import within_present
    from zoomer_ar.render import render_markdown, render_text

    analysis = analyze_path(REPO / "examples" / "gpu" / "sync_point")
    assert within_present(analysis.findings) == {"launch-bound": "idle-gpu", "sync-point": "idle-gpu"}
    text = render_text(analysis)
    by = {f.pattern: f"({f.impact.pct_of_step:.1f}% of step)" for f in analysis.findings}
    line = next(l for l in text.splitlines() if "impact" in l and by["launch-bound"] in l)
    assert line.endswith("part of idle-gpu's time")
    assert "part of idle-gpu" not in next(l for l in text.splitlines() if by["idle-gpu"] in l)
    assert render_markdown(analysis).count("part of `idle-gpu`'s time") == 2
    # without idle-gpu among the findings nothing is within anything
    assert within_present([f for f in analysis.findings if f.pattern != "idle-gpu"]) == {}


def test_a_rules_impact_never_exceeds_the_step():
    from zoomer_ar.detect.rules import load_rules
    from zoomer_ar.features import FeatureVector

    rule = next(r for r in load_rules() if r.id == "idle-gpu")
    features = FeatureVector(has_gpu=True, has_accelerator=True, gpu_busy_pct=0.6, step_ms=111.2,
                             gpu_idle_ms_per_step=136.4, profiler_steps=2).model_dump()
    result = rule.evaluate(features)
    assert result is not None
    assert result["impact_ms"] == 111.2 and result["impact_pct"] == 100.0


def test_host_side_findings_do_not_add_to_idle_gpu():
    """examples/gpu/single_tensor_optimizer: the optimizer's host time costs the GPU job only as GPU idle, which
    idle-gpu measures whole; the combination was capped at 100% of the step (idle 96.5% + optimizer 25.3%)."""
    a = analyze_path(REPO / "examples" / "gpu" / "single_tensor_optimizer")
    by = {f.pattern: f for f in a.findings}
    assert {"idle-gpu", "single-tensor-optimizer"} <= set(by)
    c = combined_impact(a.findings)
    assert c.pct_of_step < 100.0
    assert c.pct_of_step == pytest.approx(sum(f.impact.pct_of_step for f in a.findings
                                              if f.pattern not in ("single-tensor-optimizer", "launch-bound", "sync-point",
                                                                   "dataloader-bound", "allocator-churn")))
