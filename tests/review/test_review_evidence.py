"""Measured cost on static findings: from a trace (--trace) and from the store (--db)."""

from __future__ import annotations

import json

import pytest
from review_testutil import make_analysis, must_hold_repo

from zoomer_ar.review import review
from zoomer_ar.review.render import render_markdown


@pytest.fixture(scope="module")
def sync_trace(tmp_path_factory):
    """A synthetic GPU trace whose analysis shows sync-point (zoomer_ar.synth)."""
    from zoomer_ar.analyze import analyze_path
    from zoomer_ar.synth.generator import generate

    folder = tmp_path_factory.mktemp("trace")
    for seed in range(3, 12):
        path = folder / "rank0.json"
        path.write_text(json.dumps(generate(seed, plants=["sync-point"]).documents[0]))
        if any(f.pattern == "sync-point" for f in analyze_path(path).findings):
            return path
    pytest.fail("no synthetic trace showed sync-point")


def test_trace_evidence_is_attached_to_the_same_pattern(tmp_path, sync_trace):
    repo = must_hold_repo(tmp_path / "r")
    result = review(repo.path, "main", "feature", trace=sync_trace)
    by_rule = {f.rule_id: f for f in result.findings}
    ev = by_rule["sync-point"].evidence
    assert len(ev) == 1 and ev[0].source == "trace"
    assert "ms per step" in ev[0].text and "% of the step" in ev[0].text and "GPU-hours per 1,000 steps" in ev[0].text
    assert ev[0].data["pct_of_step"] > 0
    assert by_rule["single-tensor-optimizer"].evidence == []
    assert any("measured cost from trace rank0.json" in n for n in result.notes)
    assert "📈 measured in this code's trace" in render_markdown(result)


def _record(url: str, job: str, findings: dict[str, float], week: str, gpu_hours: float, price: float | None = None,
            has_gpu: bool = True):
    from zoomer_ar.store import RecordOptions, record_analysis

    record_analysis(make_analysis(job, findings, has_gpu=has_gpu), RecordOptions(job=job, week=week, gpu_hours=gpu_hours, gpu_hour_cost=price), db=url)


def test_store_evidence_last_week(tmp_path):
    from zoomer_ar.store import weeks as W
    from zoomer_ar.store.db import dispose_engine

    url = "sqlite:///" + str(tmp_path / "store.db")
    last_week = W.shift(W.week_of(W.now()), -1)
    try:
        _record(url, "resnet", {"sync-point": 10.0, "dataloader-bound": 5.0}, last_week, 1000.0, price=2.0)
        _record(url, "bert", {"sync-point": 2.0}, last_week, 1000.0)
        _record(url, "old-job", {"single-tensor-optimizer": 50.0}, W.shift(last_week, -10), 1000.0)  # too old
        repo = must_hold_repo(tmp_path / "r")
        result = review(repo.path, "main", "feature", db=url)
    finally:
        dispose_engine(url)
    by_rule = {f.rule_id: f for f in result.findings}
    sync = [e.text for e in by_rule["sync-point"].evidence]
    assert sync == ["this pattern cost 100 GPU-hours ($200) in job resnet last week; 120 GPU-hours across 2 jobs"]
    assert [e.text for e in by_rule["dataloader-bound"].evidence] == ["this pattern cost 50 GPU-hours ($100) in job resnet last week"]
    assert by_rule["single-tensor-optimizer"].evidence == []
    assert by_rule["sync-point"].evidence[0].data["week"] == last_week


def test_store_evidence_for_a_given_week_and_an_older_week(tmp_path):
    from zoomer_ar.store.db import dispose_engine

    url = "sqlite:///" + str(tmp_path / "store.db")
    try:
        _record(url, "vit", {"dataloader-bound": 20.0}, "2026-W10", 500.0)
        repo = must_hold_repo(tmp_path / "r")
        result = review(repo.path, "main", "feature", db=url, db_week="2026-W12")
    finally:
        dispose_engine(url)
    ev = {f.rule_id: [e.text for e in f.evidence] for f in result.findings}
    assert ev["dataloader-bound"] == ["this pattern cost 100 GPU-hours in job vit in week 2026-W10"]


def test_store_evidence_names_accelerator_hours_for_mtia_jobs(tmp_path):
    """`review --db` said "GPU-hours" of every job; an MTIA job's hours are accelerator-hours, as the
    reports name them (features.names.device_noun); a total over GPU and MTIA jobs names both."""
    from zoomer_ar.store import weeks as W
    from zoomer_ar.store.db import dispose_engine

    url = "sqlite:///" + str(tmp_path / "store.db")
    last_week = W.shift(W.week_of(W.now()), -1)
    try:
        _record(url, "mtia-ranker", {"sync-point": 10.0, "dataloader-bound": 5.0}, last_week, 1000.0, has_gpu=False)
        _record(url, "mtia-ads", {"sync-point": 2.0}, last_week, 1000.0, has_gpu=False)
        _record(url, "resnet", {"dataloader-bound": 1.0}, last_week, 1000.0)
        repo = must_hold_repo(tmp_path / "r")
        result = review(repo.path, "main", "feature", db=url)
    finally:
        dispose_engine(url)
    ev = {f.rule_id: [e.text for e in f.evidence] for f in result.findings}
    assert ev["sync-point"] == ["this pattern cost 100 accelerator-hours in job mtia-ranker last week; "
                                "120 accelerator-hours across 2 jobs"]
    assert ev["dataloader-bound"] == ["this pattern cost 50 accelerator-hours in job mtia-ranker last week; "
                                      "60 GPU- and accelerator-hours across 2 jobs"]
    assert "this pattern cost 100 accelerator-hours in job mtia-ranker" in render_markdown(result)


def test_missing_store_is_a_note_not_an_error(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    missing = tmp_path / "nope.db"
    result = review(repo.path, "main", "feature", db=str(missing))
    assert len(result.findings) == 3 and all(not f.evidence for f in result.findings)
    assert any("no store at" in n for n in result.notes)
    assert not missing.exists()  # the store is read, never created


@pytest.mark.parametrize("url", ["://x", "postgresql://u:secret@[::1", "foo://bar"])
def test_store_url_that_does_not_parse_is_a_note_not_an_error(tmp_path, url):
    """A --db that SQLAlchemy cannot parse (no scheme, a port that is not a number) crashed the review
    (internal error, exit 1); like a missing store it is a note and the review goes on."""
    repo = must_hold_repo(tmp_path / "r")
    result = review(repo.path, "main", "feature", db=url)
    assert len(result.findings) == 3 and all(not f.evidence for f in result.findings)
    assert any("not a usable store URL" in n or "could not be read" in n for n in result.notes), result.notes
    assert not any("secret" in n for n in result.notes)


def test_trace_evidence_names_the_traces_device_hours(tmp_path, sync_trace, shared_traces):
    """The PR comment's trace evidence said "GPU-hours per 1,000 steps" of every trace: of an MTIA trace
    (the reports say accelerator-hours) and of a CPU-only one ("0 GPU-hours", where the reports show "-")."""
    from pathlib import Path

    from zoomer_ar.analyze import analyze_path
    from zoomer_ar.review.evidence import analysis_evidence, trace_text

    a = analyze_path(shared_traces / "hta/mtia_trace_single_rank/mtia_rank_0.json.gz")
    assert a.features["has_accelerator"] and not a.features["has_gpu"]
    # the MTIA trace shows no pattern of its own: a GPU trace's measured finding stands in for one
    a.findings = [f.model_copy(deep=True) for f in analyze_path(sync_trace).findings if f.pattern == "sync-point"]
    text = trace_text(analysis_evidence(a)["sync-point"])
    assert "accelerator-hours per 1,000 steps" in text and "GPU" not in text, text

    # a CPU-only trace (the bundled recording of the same loop): no device-hours to give
    repo = must_hold_repo(tmp_path / "r")
    cpu = Path(__file__).resolve().parents[2] / "examples" / "traces" / "single_tensor_optimizer"
    result = review(repo.path, "main", "feature", trace=cpu)
    ev = {f.rule_id: f.evidence for f in result.findings}["single-tensor-optimizer"]
    assert len(ev) == 1 and "% of the step)" in ev[0].text and "hours" not in ev[0].text, ev[0].text
    # a GPU trace keeps its GPU-hours
    result = review(repo.path, "main", "feature", trace=sync_trace)
    ev = {f.rule_id: f.evidence for f in result.findings}["sync-point"]
    assert "GPU-hours per 1,000 steps" in ev[0].text


def test_small_device_hours_have_no_exponent(tmp_path, shared_traces):
    """bert-small's sync-point (0.15 ms of a 4.4 ms step on an H100) read "4.3e-05 GPU-hours per 1,000
    steps" in the PR comment, where report.md writes 0.000043."""
    from zoomer_ar.render.filters import fmt_gh

    repo = must_hold_repo(tmp_path / "r")
    result = review(repo.path, "main", "feature",
                    trace=shared_traces / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz")
    [ev] = {f.rule_id: f.evidence for f in result.findings}["sync-point"]
    hours = ev.data["gpu_hours_per_1000_steps"]
    assert 0 < hours < 1e-4
    assert "e-0" not in ev.text and f"{fmt_gh(hours)} GPU-hours per 1,000 steps" in ev.text, ev.text
