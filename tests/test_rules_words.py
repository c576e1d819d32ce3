"""`zoomer-ar rules explain` says what each rule measures: where a rule's impact formula subtracts
something or switches its measure, the explanation (and each hardware wording of it) says so; and the
figures the words quote from a bundled recording are that recording's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.detect.pages import explain_text
from zoomer_ar.detect.rules import get_rule

GPU = Path(__file__).resolve().parents[1] / "examples" / "gpu"


def _why(rule_id: str) -> str:
    """The 'Why it costs time' section of the rule's page, on one line."""
    page = explain_text(rule_id)
    section = page.split("## Why it costs time", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())


def test_fp32_matmul_says_it_subtracts_the_gpus_wait_for_the_host_on_every_gpu():
    rule = get_rule("fp32-matmul")
    assert "idle_host_ms_per_step" in rule.impact_ms and "idle_startup_host_ms_per_step" in rule.impact_ms
    for text in (rule.explanation, rule.on_rocm.explanation):
        words = " ".join(text.split())
        assert "less the time the GPU already idles waiting for the host" in words
        assert "`idle_host_ms_per_step`, less the start-up calls' part of it, `idle_startup_host_ms_per_step`" in words
    # a CPU trace has no such wait: its wording keeps the plain half
    assert "idle" not in " ".join(rule.on_cpu.explanation.split())


def test_straggler_says_it_counts_the_exposed_wait_and_the_imbalance_once_per_step():
    rule = get_rule("straggler")
    assert "straggler_exposed_wait_ms_per_step" in rule.impact_ms and "n_ranks == 2" in rule.impact_ms
    words = _why("straggler")
    assert "only the waiting with no compute of their own beside it, `straggler_exposed_wait_ms_per_step`" in words
    assert "(between two ranks its whole lead over the other, twice it), once per step" in words
    assert "sharding-imbalance" in words


def test_exposed_communication_names_where_the_waiting_it_leaves_out_goes():
    # its impact subtracts the waiting for a late peer that no compute of the rank's own hides (the whole
    # wait, straggler_wait_ms_per_step, also counts waits at buckets while the rank still computes, which
    # were never exposed time); straggler keeps only the part a heavier rank's compute does not explain,
    # which is sharding-imbalance's
    assert "straggler_exposed_wait_ms_per_step" in get_rule("exposed-communication").impact_ms
    words = _why("exposed-communication")
    assert "with none of its own compute running, is left out here" in words
    assert "`straggler`'s, or `sharding-imbalance`'s where the peer is late because it computes more" in words


def test_dataloader_bound_says_what_it_measures_on_a_trace_without_steps():
    rule = get_rule("dataloader-bound")
    assert "phase_dataloader_pct" in rule.impact_ms and "profiler_steps == 0" in rule.impact_ms
    words = _why("dataloader-bound")
    assert "A trace without profiler steps" in words and "the DataLoader phase" in words
    assert "at most the time in `__next__`" in words
    assert "On a CPU-only trace the impact is the time in `__next__` itself" in words


def test_launch_bound_says_what_its_impact_is():
    for text in (get_rule("launch-bound").explanation, get_rule("launch-bound").on_rocm.explanation):
        assert "The impact is the GPU's idle time in host-bound gaps" in " ".join(text.split())


def test_extra_copy_quotes_its_gpu_recording_as_analyze_measures_it():
    """The extra-copy page quotes examples/gpu/extra_copy: the step, the host copy time's share of it,
    and how much shorter the twin's step is."""
    feats = analyze_path(GPU / "extra_copy").features
    twin = analyze_path(GPU / "extra_copy_clean").features
    words = " ".join(get_rule("extra-copy").explanation.split())
    step = re.search(r"takes 2 us of a ([\d.]+) ms step", words)
    share = re.search(r"The ([\d.]+) ms of host time in those ops \(([\d.]+)%\)", words)
    shorter = re.search(r"The step is ([\d.]+) ms shorter without them", words)
    assert step and share and shorter
    assert float(step[1]) == pytest.approx(round(feats["step_ms"], 1))
    assert float(share[1]) == pytest.approx(round(feats["cpu_copy_ms_per_step"], 2))
    assert float(share[2]) == pytest.approx(round(100 * feats["cpu_copy_ms_per_step"] / feats["step_ms"], 1))
    assert float(shorter[1]) == pytest.approx(round(feats["step_ms"] - twin["step_ms"], 2))
