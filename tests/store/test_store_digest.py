"""The weekly digest and job history on a seeded multi-week store, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from zoomer_ar.cli import main
from zoomer_ar.render.digest import render_digest, render_history
from zoomer_ar.store.digest import sparkline
from zoomer_ar.store.digest import build_digest
from zoomer_ar.store.history import job_history
from zoomer_ar.store.record import RecordOptions, record_analysis

from store_support import make_analysis, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures

# (job, team, owner, price, week, gpu_hours, {pattern: pct})
RUNS = [
    ("alpha", "A", "ann", 2.0, "2026-W44", 100.0, {"dataloader-bound": 20.0}),
    ("alpha", "A", "ann", 2.0, "2026-W45", 100.0, {"dataloader-bound": 20.0}),
    ("alpha", "A", "ann", 2.0, "2026-W46", 100.0, {"dataloader-bound": 10.0}),
    ("alpha", "A", "ann", 2.0, "2026-W47", 100.0, {"dataloader-bound": 10.0}),
    ("alpha", "A", "ann", 2.0, "2026-W48", 100.0, {"launch-bound": 5.0}),  # dataloader fixed
    ("delta", "A", "cid", 1.0, "2026-W46", 10.0, {"sync-point": 10.0}),  # not recorded in W48: not "resolved"
    ("beta", "B", "bob", 3.0, "2026-W47", 200.0, {"idle-gpu": 50.0}),
    ("beta", "B", "bob", 3.0, "2026-W48", 200.0, {"idle-gpu": 40.0, "fp32-matmul": 10.0}),
    ("gamma", "B", "bob", None, "2026-W48", 50.0, {"idle-gpu": 30.0}),
]


def seed(url: str) -> None:
    for i, (job, team, owner, price, week, hours, findings) in enumerate(RUNS):
        a = make_analysis(job, key=f"run-{i}", findings=findings)
        record_analysis(a, RecordOptions(team=team, owner=owner, gpu_hour_cost=price, gpu_hours=hours, week=week), db=url)


@pytest.fixture
def seeded(store_url):
    seed(store_url)
    return store_url


def test_digest_numbers(seeded):
    d = build_digest(seeded, week="2026-W48")
    assert d.trend_weeks == ["2026-W44", "2026-W45", "2026-W46", "2026-W47"]
    assert (d.runs, d.jobs_recorded) == (3, 3)
    assert d.gpu_hours == pytest.approx(350.0) and d.usd == pytest.approx(800.0)
    assert d.wasted_gpu_hours == pytest.approx(120.0) and d.wasted_usd == pytest.approx(310.0)
    p = {x.pattern: x for x in d.patterns}
    assert [x.pattern for x in d.patterns] == ["idle-gpu", "fp32-matmul", "launch-bound"]
    idle = p["idle-gpu"]
    assert (idle.wasted_gpu_hours, idle.wasted_usd) == (pytest.approx(95.0), pytest.approx(240.0))
    assert (idle.jobs, idle.new_jobs, idle.recurring_jobs, idle.status) == (2, 1, 1, "recurring")
    assert idle.trend_gpu_hours == [0.0, 0.0, 0.0, pytest.approx(100.0)]
    assert idle.change_pct == pytest.approx(280.0)  # 95 vs the 4-week mean of 25
    assert (p["fp32-matmul"].status, p["fp32-matmul"].wasted_usd) == ("new", pytest.approx(60.0))
    assert (p["launch-bound"].status, p["launch-bound"].wasted_gpu_hours) == ("new", pytest.approx(5.0))
    # costliest jobs and owners, by wasted dollars
    assert [(j.job, j.top_pattern) for j in d.jobs] == [("beta", "idle-gpu"), ("alpha", "launch-bound"), ("gamma", "idle-gpu")]
    assert d.jobs[0].wasted_gpu_hours == pytest.approx(100.0) and d.jobs[0].usd == pytest.approx(600.0)
    assert d.jobs[2].usd == 0.0 and d.jobs[2].wasted_gpu_hours == pytest.approx(15.0)
    assert [(o.owner, o.jobs) for o in d.owners] == [("bob", 2), ("ann", 1)]
    assert d.owners[0].wasted_gpu_hours == pytest.approx(115.0) and d.owners[0].wasted_usd == pytest.approx(300.0)
    # resolved: alpha's dataloader-bound is gone in W48; delta was not recorded in W48, so unknown
    assert [(r.job, r.pattern, r.last_seen) for r in d.resolved] == [("alpha", "dataloader-bound", "2026-W47")]
    assert d.resolved[0].wasted_gpu_hours_before == pytest.approx(60.0) and d.resolved[0].wasted_usd_before == pytest.approx(120.0)
    assert d.resolved_total == 1
    # series over 12 weeks
    series = {s.week: s.wasted_gpu_hours for s in d.series}
    assert len(d.series) == 12 and d.series[-1].week == "2026-W48"
    assert series["2026-W44"] == pytest.approx(20.0) and series["2026-W46"] == pytest.approx(11.0)
    assert series["2026-W47"] == pytest.approx(110.0) and series["2026-W48"] == pytest.approx(120.0)
    # phases split all the week's GPU-hours
    assert sum(x.gpu_hours for x in d.phases) == pytest.approx(d.gpu_hours)
    assert sum(x.usd for x in d.phases) == pytest.approx(d.usd)
    assert {x.phase: x.pct for x in d.phases}["backward"] == pytest.approx(40.0)


def test_digest_team_filter_and_default_week(seeded):
    d = build_digest(seeded, team="A")
    assert d.week == "2026-W48"  # the latest week with runs
    assert [p.pattern for p in d.patterns] == ["launch-bound"]
    assert d.gpu_hours == pytest.approx(100.0) and [j.job for j in d.jobs] == ["alpha"]
    assert [r.pattern for r in d.resolved] == ["dataloader-bound"]
    b = build_digest(seeded, week="2026-W48", team="B")
    assert b.wasted_gpu_hours == pytest.approx(115.0) and not b.resolved
    w47 = build_digest(seeded, week="2026-W47")
    assert {p.pattern: p.status for p in w47.patterns} == {"idle-gpu": "new", "dataloader-bound": "recurring"}
    empty = build_digest(seeded, week="2025-W01")
    assert empty.runs == 0 and not empty.patterns and render_digest(empty, "md") and render_digest(empty, "html")


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_digest_renders_markdown_and_email_ready_html(seeded):
    d = build_digest(seeded, week="2026-W48")
    md = render_digest(d, "md")
    assert "# Zoomer AR weekly digest: 2026-W48" in md
    assert "| 1 | `idle-gpu` | 95.0 | $240 |" in md
    assert re.search(r"`[▁▂▃▄▅▆▇█]{12}`", md), "a 12-week text sparkline"
    assert "`dataloader-bound` | 2026-W47 | 60.0 GPU-h ($120)" in md
    html = render_digest(d, "html")
    low = html.lower()
    assert "<script" not in low and "<style" not in low and "<link" not in low
    p = _Tags()
    p.feed(html)
    tags = [t for t, _ in p.tags]
    assert "svg" in tags and tags.count("rect") >= 12
    for tag, attrs in p.tags:
        if tag in ("td", "th", "table", "h1", "h2", "p"):
            assert attrs.get("style"), f"<{tag}> without inline style"
    assert "$310" in html and "idle-gpu" in html and "2026-W48" in html
    doc = json.loads(render_digest(d, "json"))
    assert doc["week"] == "2026-W48" and doc["patterns"][0]["pattern"] == "idle-gpu"


def test_history(seeded):
    h = job_history("alpha", seeded)
    assert [r.week for r in h.runs] == ["2026-W44", "2026-W45", "2026-W46", "2026-W47", "2026-W48"]
    assert h.matrix["dataloader-bound"] == {"2026-W44": pytest.approx(20.0), "2026-W45": pytest.approx(20.0),
                                            "2026-W46": pytest.approx(10.0), "2026-W47": pytest.approx(10.0)}
    assert h.runs[0].findings[0].wasted_usd == pytest.approx(40.0)
    text = render_history(h, "text")
    assert "dataloader-bound" in text and "2026-W48" in text
    md = render_history(h, "md")
    assert "| `launch-bound` | · | · | · | · | 5.00 |" in md


def test_cli_digest_history_record(seeded, tmp_path, capsys):
    out = tmp_path / "digest.html"
    assert main(["digest", "--db", seeded, "--week", "2026-W48", "--format", "html", "--out", str(out)]) == 0
    assert "<svg" in out.read_text()
    capsys.readouterr()
    assert main(["digest", "--db", seeded, "--team", "B", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["team"] == "B"
    assert main(["history", "beta", "--db", seeded, "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2
    assert main(["history", "nobody", "--db", seeded]) == 2  # an unknown job is bad input
    assert "no recorded job" in capsys.readouterr().err
    assert main(["digest", "--db", seeded, "--week", "2026-W99"]) == 2
    # record a findings.json file
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("epsilon", key="eps", findings={"idle-gpu": 10.0}).model_dump_json())
    assert main(["record", str(f), "--db", seeded, "--team", "C", "--gpu-hours", "10", "--week", "2026-W48"]) == 0
    assert "recorded: job epsilon, week 2026-W48" in capsys.readouterr().out
    assert main(["record", str(f), "--db", seeded]) == 0
    assert "already recorded" in capsys.readouterr().out
    assert main(["record", str(tmp_path / "missing.json"), "--db", seeded]) == 2


def test_sparkline():
    assert sparkline([0, 1, 2, 4]) == "▁▃▅█"
    assert sparkline([0, 0]) == "▁▁"
    assert sparkline([]) == ""


def test_totals_count_a_finding_within_another_once(store_url):
    """launch-bound's host-bound idle is part of idle-gpu's idle: a run with both wastes the idle
    once in the week's, the job's and the owner's totals; each pattern's row keeps its own waste."""
    a = make_analysis("graphs", key="overlap", findings={"idle-gpu": 60.0, "launch-bound": 55.0, "fp32-matmul": 10.0})
    record_analysis(a, RecordOptions(team="G", owner="gus", gpu_hour_cost=2.0, gpu_hours=100.0, week="2026-W48"), db=store_url)
    d = build_digest(store_url, week="2026-W48", team="G")
    p = {x.pattern: x.wasted_gpu_hours for x in d.patterns}
    assert p == {"idle-gpu": pytest.approx(60.0), "launch-bound": pytest.approx(55.0), "fp32-matmul": pytest.approx(10.0)}
    assert d.wasted_gpu_hours == pytest.approx(70.0) and d.wasted_usd == pytest.approx(140.0)
    assert d.jobs[0].wasted_gpu_hours == pytest.approx(70.0) and d.owners[0].wasted_gpu_hours == pytest.approx(70.0)
    assert d.series[-1].wasted_gpu_hours == pytest.approx(70.0)
