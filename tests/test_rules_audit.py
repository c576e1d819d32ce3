"""Rules audit: extra-copy, exposed-communication, sync-point, zero-grad-not-none and idle-gpu say
what they measure, count what they say, and recommend what works.

Where a rule's behaviour changed, the rule as it was (OLD_*) is kept here so the tests show the
examples that tell the two apart.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml

from conftest import SHARED_TRACES, shared_available
from zoomer_ar.analyze import analyze_path
from zoomer_ar.detect.rules import Rule, example_features, get_rule
from zoomer_ar.paths import RULES_DIR
from zoomer_ar.relaunch import spec_from_analysis

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "examples" / "gpu"

OLD_SYNC_CONDITION = ("(has_gpu and impact_pct >= 2 and sync_calls_per_step + item_calls_per_step >= 1)"
                      " or (not has_accelerator and item_calls_per_step >= 1 and profiler_steps >= 1)")
OLD_EXPOSED_RELAUNCH = {"env": {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1"},
                        "config_overrides": {"ddp.gradient_as_bucket_view": True, "ddp.bucket_cap_mb": 50}}


def _raw(rule_id: str) -> dict:
    return yaml.safe_load((RULES_DIR / f"{rule_id}.yaml").read_text(encoding="utf-8"))


def _variant(rule_id: str, **fields) -> Rule:
    return Rule(**{**_raw(rule_id), **fields})


@functools.lru_cache(maxsize=None)
def _features(name: str) -> dict:
    return analyze_path(GPU / name).features


def _text(rule: Rule) -> str:
    return " ".join((rule.summary + " " + rule.explanation + " " + rule.example + " " + rule.recommendation).split())


# -- 1. extra-copy ---------------------------------------------------------------------------------

def test_extra_copy_names_only_dtod_memcpy_sources_as_its_gpu_impact():
    text = _text(get_rule("extra-copy"))
    # the copy kernels that .contiguous(), .to(dtype) and cat/stack launch are named as kernels, not as DtoD
    for kernel in ("direct_copy_kernel", "CatArrayBatchedCopy"):
        assert kernel in text
    assert "`Memcpy DtoD` events" in text and "only that" in text
    # .to() with the dtype/device a tensor already has is a no-op, not a copy
    assert "already has a copy in" not in text and "copies nothing" in text
    assert "`.clone()` of a contiguous tensor" in text


def test_extra_copy_planted_gpu_case_is_signature_only_and_the_rule_says_so():
    """examples/gpu/extra_copy: one DtoD memcpy per step (its .clone()), 2 us of a 3.0 ms step; the
    0.25 ms of host copy-op time is not counted on a GPU, and the explanation says the case stays
    under the threshold."""
    feats = _features("extra_copy")
    assert feats["memcpy_dtod_count"] == feats["profiler_steps"] == 5
    assert feats["cpu_copy_ms_per_step"] / feats["step_ms"] > 0.08 and feats["factory_then_move_per_step"] == 1
    rule = get_rule("extra-copy")
    assert rule.evaluate(feats) is None
    assert rule.evaluate(_features("extra_copy_clean")) is None
    text = _text(rule)
    assert "examples/gpu/extra_copy" in text and "stay under the threshold" in text


def test_counting_host_copy_time_on_a_gpu_would_flag_needed_transfers():
    """Why extra-copy does not add cpu_copy_ms_per_step on a GPU: that figure holds the host-to-device
    transfers of the input (and waits on them), so the twins that fix other patterns, and the
    LABELS negative hta/trace_diff/control, would be reported."""
    naive = _variant("extra-copy", impact_ms="memcpy_dtod_ms_per_step + cpu_copy_ms_per_step if has_gpu "
                                             "else cpu_copy_ms_per_step")
    assert naive.evaluate(_features("extra_copy")) is not None  # the planted case...
    assert naive.evaluate(_features("pageable_memcpy_clean")) is not None  # ...and a clean twin's pinned input copies
    assert get_rule("extra-copy").evaluate(_features("pageable_memcpy_clean")) is None
    if shared_available():
        control = analyze_path(SHARED_TRACES / "hta/trace_diff/control/control.json.gz").features
        assert naive.evaluate(control) is not None  # a LABELS negative for extra-copy
        assert get_rule("extra-copy").evaluate(control) is None


# -- 2. exposed-communication ----------------------------------------------------------------------

def test_exposed_communication_recommends_what_creates_overlap():
    rule = get_rule("exposed-communication")
    rec = " ".join(rule.recommendation.split())
    for advice in ("bucket_cap_mb", "below the default 25", "backward_prefetch", "forward_prefetch", "no_sync()",
                   "compress_hook", "delays the first all-reduce"):
        assert advice in rec, advice
    # gradient_as_bucket_view and TORCH_NCCL_AVOID_RECORD_STREAMS are named as not overlap settings
    not_overlap = rec.split("Not overlap settings:")[1]
    assert "gradient_as_bucket_view" in not_overlap and "TORCH_NCCL_AVOID_RECORD_STREAMS" in not_overlap


def test_exposed_communication_relaunch_sets_nothing_it_cannot_back():
    relaunch = get_rule("exposed-communication").fix.relaunch
    assert not relaunch.get("env") and not relaunch.get("config_overrides")
    assert "bucket_cap_mb" in relaunch.get("notes", "")
    assert get_rule("exposed-communication").fix.fixers == []  # ddp-bucket-view saves a copy, adds no overlap


def _comm_fragment(path: Path) -> Path:
    """One NCCL kernel of 50 us in a 0.2 ms window and 30 host ops: exposed communication, 25%."""
    events = [{"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 0, "ts": 100, "dur": 50}]
    events += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 0, "tid": 1, "ts": 200 + i, "dur": 1}
               for i in range(30)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 0, "tid": 1, "ts": 200, "dur": 100})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_exposed_communication_is_not_credited_to_launch_settings(tmp_path):
    analysis = analyze_path(_comm_fragment(tmp_path / "comm.json"))
    assert "exposed-communication" in {f.pattern for f in analysis.findings}
    spec = spec_from_analysis(analysis)  # a template: it lists every setting
    assert "TORCH_NCCL_AVOID_RECORD_STREAMS" not in spec.env
    assert not any("bucket" in k for k in spec.config_overrides)
    assert "exposed-communication" not in spec.expected_gain.from_findings
    assert any(n.startswith("exposed-communication: no launch setting") for n in spec.notes)
    # the rule as it was: its three settings carried and the whole exposed time claimed as the gain
    old = [f.model_copy(update={"relaunch": OLD_EXPOSED_RELAUNCH}) if f.pattern == "exposed-communication" else f
           for f in analysis.findings]
    old_spec = spec_from_analysis(analysis.model_copy(update={"findings": old}))
    assert "exposed-communication" in old_spec.expected_gain.from_findings
    assert old_spec.env["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1" and old_spec.config_overrides["ddp.bucket_cap_mb"] == 50


# -- 3. sync-point ---------------------------------------------------------------------------------

def _example(rule: Rule, note_start: str, kind: str = "valid") -> dict:
    return example_features(next(e for e in getattr(rule, kind) if e.note.startswith(note_start)))


def test_sync_point_counts_one_gpu_item_once():
    new, old = get_rule("sync-point"), _variant("sync-point", condition=OLD_SYNC_CONDITION)
    every_other = _example(new, "one GPU .item() every two steps")
    cpu_items = _example(new, ".item() on CPU tensors")
    for feats in (every_other, cpu_items):
        assert old.evaluate(feats) is not None  # the old sum fired on them
        assert new.evaluate(feats) is None
    one_per_step = _example(new, "a sync per step", "invalid")
    assert new.evaluate(one_per_step) is not None


def test_sync_point_on_the_gpu_recording_one_sync_per_item():
    feats = _features("sync_point")
    assert feats["sync_calls_per_step"] == feats["item_calls_per_step"] == 4.0  # 4 .item() per step, not 8 syncs
    found = get_rule("sync-point").evaluate(feats)
    assert found is not None and found["impact_pct"] == pytest.approx(4.6, abs=0.3)
    text = _text(get_rule("sync-point"))
    assert "counted once, not twice" in text


# -- 4. zero-grad-not-none -------------------------------------------------------------------------

def test_zero_grad_wording_covers_foreach_and_the_overlapping_sum():
    text = _text(get_rule("zero-grad-not-none"))
    assert "a fill per parameter" not in text
    assert "`aten::_foreach_zero_` per device/dtype group" in text and "`foreach=True`" in text
    assert "upper bound" in text and "overlap" in text
    feats = _features("zero_grad_not_none")
    assert feats["zero_grad_fill_ops"] == feats["profiler_steps"]  # one _foreach_zero_ per step on the GPU
    assert get_rule("zero-grad-not-none").evaluate(feats) is not None


# -- 5. idle-gpu -----------------------------------------------------------------------------------

def test_idle_gpu_notes_describe_the_rule_it_is():
    rule = get_rule("idle-gpu")
    assert rule.condition.strip() == "gpu_busy_pct < 50"  # one threshold, no band
    for ex in rule.valid + rule.invalid:
        assert "undecided" not in ex.note and "90" not in ex.note, ex.note
    for ex in rule.valid:
        busy = ex.features.get("gpu_busy_pct")
        assert busy is None or busy >= 50
