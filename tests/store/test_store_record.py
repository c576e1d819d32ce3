"""Recording analyses: idempotent by content, job upserts, GPU-hours, prices, weeks, refresh, verdicts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from zoomer_ar.store.db import StoreError, open_store, read_session
from zoomer_ar.store.orm import Analysis, Finding, Job, Model, Trace, Verdict
from zoomer_ar.store.record import RecordOptions, add_verdict, content_hash, record_analysis

from store_support import make_analysis, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures


def counts(url: str) -> dict[str, int]:
    engine = open_store(url)
    with read_session(engine) as s:
        return {t.__tablename__: s.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (Job, Trace, Analysis, Finding, Verdict, Model)}


def test_record_then_rerecord_is_idempotent(store_url):
    a = make_analysis("resnet", findings={"dataloader-bound": 20.0, "fp32-matmul": 5.0})
    r1 = record_analysis(a, RecordOptions(team="vision", gpu_hours=100, gpu_hour_cost=2.0, week="2026-W48"), db=store_url)
    assert r1.status == "recorded" and r1.created
    before = counts(store_url)
    assert before["analyses"] == 1 and before["findings"] == 2 and before["jobs"] == 1 and before["traces"] == 1
    # same content again, even with other options: nothing changes
    r2 = record_analysis(a, RecordOptions(gpu_hours=999, week="2026-W49"), db=store_url)
    assert r2.status == "exists" and r2.analysis_id == r1.analysis_id
    assert (r2.week, r2.gpu_hours) == ("2026-W48", 100)
    assert counts(store_url) == before
    # the same findings.json content under another job name is still the same trace
    r3 = record_analysis(a.model_copy(deep=True), RecordOptions(job="other-name"), db=store_url)
    assert r3.status == "exists" and r3.job == "resnet"


def test_waste_is_pct_times_gpu_hours(store_url):
    a = make_analysis("j", findings={"launch-bound": 12.5, "sync-point": 3.0})
    record_analysis(a, RecordOptions(gpu_hours=400, gpu_hour_cost=3.0, week="2026-W10"), db=store_url)
    with read_session(open_store(store_url)) as s:
        rows = dict(s.execute(select(Finding.pattern, Finding.wasted_gpu_hours)).all())
    assert rows == {"launch-bound": pytest.approx(50.0), "sync-point": pytest.approx(12.0)}


def test_default_gpu_hours_are_profiled_wall_time_times_gpus(store_url):
    a = make_analysis("ddp", wall_ms=7_200_000.0, world_size=4, findings={"idle-gpu": 10.0})
    r = record_analysis(a, RecordOptions(week="2026-W10"), db=store_url)
    assert r.gpus == 4 and r.gpu_hours == pytest.approx(8.0)  # 2 h x 4 GPUs
    assert r.cost["gpu_hours_source"] == "profiled"
    assert r.gpu_hour_cost is None and r.cost["usd"] is None
    cpu = make_analysis("cpu", has_accelerator=False, findings={"sync-point": 5.0})
    r = record_analysis(cpu, RecordOptions(week="2026-W10"), db=store_url)
    assert r.gpus == 0 and r.gpu_hours == 0.0


def test_job_attributes_are_upserted_not_clobbered(store_url):
    record_analysis(make_analysis("bert"), RecordOptions(team="nlp", owner="ana", gpus=8, gpu_hour_cost=2.5,
                                                         week="2026-W01"), db=store_url)
    # later runs without those options keep them, and use the job's GPU count and price
    r = record_analysis(make_analysis("bert", wall_ms=3_600_000.0), RecordOptions(week="2026-W02"), db=store_url)
    assert (r.gpus, r.gpu_hour_cost, r.gpu_hours) == (8, 2.5, pytest.approx(8.0))
    record_analysis(make_analysis("bert"), RecordOptions(owner="bo", week="2026-W03"), db=store_url)
    with read_session(open_store(store_url)) as s:
        job = s.execute(select(Job)).scalar_one()
    assert (job.team, job.owner, job.gpu_count, job.gpu_hour_cost, job.gpu_type) == (
        "nlp", "bo", 8, 2.5, "NVIDIA H100 80GB HBM3")


def test_week_comes_from_option_then_recorded_at_then_trace_time_then_now(store_url):
    t = datetime(2026, 11, 25, 12, tzinfo=UTC).timestamp()  # Wednesday of 2026-W48
    r = record_analysis(make_analysis("a", start_unix_s=t), RecordOptions(), db=store_url)
    assert r.week == "2026-W48" and r.recorded_at == datetime(2026, 11, 25, 12, tzinfo=UTC)
    r = record_analysis(make_analysis("b", start_unix_s=t), RecordOptions(week="2026-W40"), db=store_url)
    assert r.week == "2026-W40" and r.recorded_at == datetime(2026, 9, 28, tzinfo=UTC)  # Monday of W40
    r = record_analysis(make_analysis("c", start_unix_s=t),
                        RecordOptions(recorded_at=datetime(2026, 1, 2, 9, tzinfo=UTC)), db=store_url)
    assert r.week == "2026-W01"
    before = datetime.now(UTC)
    r = record_analysis(make_analysis("d", start_unix_s=None), RecordOptions(), db=store_url)
    assert before <= r.recorded_at <= datetime.now(UTC)


def test_newer_tool_version_refreshes_in_place(store_url):
    a = make_analysis("job", key="same-content", findings={"idle-gpu": 40.0, "launch-bound": 10.0})
    r1 = record_analysis(a, RecordOptions(gpu_hours=10, week="2026-W20"), db=store_url)
    b = make_analysis("job", key="same-content", findings={"idle-gpu": 30.0}, tool_version="0.2.0")
    r2 = record_analysis(b, RecordOptions(week="2026-W30"), db=store_url)
    assert r2.status == "refreshed" and r2.analysis_id == r1.analysis_id
    assert (r2.week, r2.gpu_hours) == ("2026-W20", 10)
    with read_session(open_store(store_url)) as s:
        rows = s.execute(select(Finding.pattern, Finding.wasted_gpu_hours, Finding.week)).all()
        tool = s.execute(select(Analysis.tool_version)).scalar_one()
    assert rows == [("idle-gpu", pytest.approx(3.0), "2026-W20")] and tool == "0.2.0"
    assert record_analysis(b, RecordOptions(), db=store_url).status == "exists"


def test_model_version_is_recorded(store_url):
    a = make_analysis("m", findings={"idle-gpu": 10.0})
    record_analysis(a, RecordOptions(model_version="lgbm-2026.11", week="2026-W48"), db=store_url)
    with read_session(open_store(store_url)) as s:
        row = s.execute(select(Analysis.model_version, Model.version).join(Model, Model.id == Analysis.model_id)).one()
    assert tuple(row) == ("lgbm-2026.11", "lgbm-2026.11")


def test_verdicts_label_a_trace_pattern(store_url):
    a = make_analysis("v", findings={"extra-copy": 9.0})
    record_analysis(a, RecordOptions(week="2026-W48"), db=store_url)
    h = content_hash(a)
    v1 = add_verdict(h, "extra-copy", "positive", author="ana", db=store_url)
    v2 = add_verdict(h, "extra-copy", "negative", author="ana", note="memcpy is needed", db=store_url)
    assert v1 == v2
    add_verdict(h, "idle-gpu", "negative", author="ana", db=store_url)
    with read_session(open_store(store_url)) as s:
        rows = s.execute(select(Verdict.pattern, Verdict.label, Verdict.finding_id.is_not(None))
                         .order_by(Verdict.pattern)).all()
    assert [tuple(r) for r in rows] == [("extra-copy", "negative", True), ("idle-gpu", "negative", False)]
    with pytest.raises(StoreError):
        add_verdict("0" * 64, "idle-gpu", "positive", db=store_url)


def test_content_hash_of_a_rank_set_is_order_independent():
    a = make_analysis("x")
    b = a.model_copy(deep=True)
    r2 = b.job.ranks[0].model_copy(update={"rank": 1, "sha256": "f" * 64})
    a.job.ranks.append(r2)
    b.job.ranks.insert(0, r2)
    assert content_hash(a) == content_hash(b) != a.job.ranks[0].sha256


def test_a_jobs_first_price_prices_its_unpriced_runs(store_url):
    from zoomer_ar.store.digest import build_digest

    record_analysis(make_analysis("p", findings={"idle-gpu": 50.0}), RecordOptions(gpu_hours=10, week="2026-W10"),
                    db=store_url)
    assert build_digest(store_url, week="2026-W10").wasted_usd == 0.0
    record_analysis(make_analysis("p"), RecordOptions(gpu_hours=10, gpu_hour_cost=3.0, week="2026-W11"), db=store_url)
    d = build_digest(store_url, week="2026-W10")
    assert (d.usd, d.wasted_usd) == (pytest.approx(30.0), pytest.approx(15.0))
    # a later price change does not reprice history
    record_analysis(make_analysis("p"), RecordOptions(gpu_hours=10, gpu_hour_cost=5.0, week="2026-W12"), db=store_url)
    assert build_digest(store_url, week="2026-W10").wasted_usd == pytest.approx(15.0)
    assert build_digest(store_url, week="2026-W12").usd == pytest.approx(50.0)
