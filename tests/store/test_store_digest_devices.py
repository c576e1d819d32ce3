"""The digest and history name the hours they add up: GPU-hours for GPU jobs, accelerator-hours for jobs on an
accelerator that is not a GPU (MTIA: has_accelerator without has_gpu, as features.names.device_noun says), and
GPU/accelerator-hours where both are summed; a job's own rows name its own. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re

import pytest

from zoomer_ar.cli import main
from zoomer_ar.models import Analysis
from zoomer_ar.render.digest import render_digest, render_history
from zoomer_ar.store.digest import build_digest
from zoomer_ar.store.history import job_history
from zoomer_ar.store.record import RecordOptions, record_analysis

from store_support import make_analysis, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures

GPU_HOURS_FIGURE = re.compile(r"\d GPU-h|GPU-h\b|GPU-hours?\b(?! of GPU runs)")


def mtia_analysis(name: str, key: str, findings: dict[str, float]) -> Analysis:
    a = make_analysis(name, key=key, findings=findings, devices=())
    a.features["has_gpu"] = False  # an MTIA trace: accelerator work, no CUDA/ROCm events
    return a


def seed(url: str) -> None:
    runs = [  # (analysis, team, week, hours)
        (mtia_analysis("ranker", "m1", {"dataloader-bound": 20.0}), "mtia-team", "2026-W47", 100.0),
        (mtia_analysis("ranker", "m2", {"launch-bound": 10.0}), "mtia-team", "2026-W48", 100.0),  # dataloader fixed
        (make_analysis("llm", key="g1", findings={"idle-gpu": 50.0}), "gpu-team", "2026-W48", 40.0),
    ]
    for a, team, week, hours in runs:
        record_analysis(a, RecordOptions(team=team, gpu_hours=hours, gpu_hour_cost=2.0, week=week), db=url)


@pytest.fixture
def seeded(store_url):
    seed(store_url)
    return store_url


def test_an_mtia_teams_digest_says_accelerator_hours(seeded):
    d = build_digest(seeded, week="2026-W48", team="mtia-team")
    assert (d.device, d.hours_unit) == ("accelerator", "accelerator-hours")
    md = render_digest(d, "md")
    assert "**10.0 accelerator-hours ($20.00) wasted** on anti-patterns, of 100 accelerator-hours ($200)" in md, md
    assert "| Job | Team | Owner | Runs | Accelerator-h | Cost | Wasted accelerator-h |" in md
    assert "`dataloader-bound` | 2026-W47 | 20.0 accelerator-h ($40.00)" in md  # resolved
    assert not GPU_HOURS_FIGURE.search(md), GPU_HOURS_FIGURE.findall(md)
    html = render_digest(d, "html")
    assert "accelerator-h wasted per week" in html and "20.0 accelerator-h ($40.00)" in html
    assert not GPU_HOURS_FIGURE.search(html), GPU_HOURS_FIGURE.findall(html)
    assert json.loads(render_digest(d, "json"))["hours_unit"] == "accelerator-hours"


def test_a_digest_of_gpu_and_mtia_jobs_mislabels_neither(seeded):
    d = build_digest(seeded, week="2026-W48")
    assert d.device == "GPU/accelerator"
    assert {j.job: j.device for j in d.jobs} == {"llm": "GPU", "ranker": "accelerator"}
    assert {r.job: r.device for r in d.resolved} == {"ranker": "accelerator"}
    md = render_digest(d, "md")
    assert "**30.0 GPU/accelerator-hours ($60.00) wasted**" in md, md
    assert "| Job | Team | Owner | Device | Runs | GPU/accelerator-h |" in md
    assert "| llm | gpu-team | - | GPU | 1 | 40.0 |" in md and "| ranker | mtia-team | - | accelerator | 1 | 100 |" in md
    assert "`dataloader-bound` | 2026-W47 | 20.0 accelerator-h ($40.00)" in md
    assert "GPU/accelerator-hours: the GPU-hours of GPU runs and the accelerator-hours" in md
    html = render_digest(d, "html")
    assert "<td style=" in html and ">accelerator</td>" in html and ">GPU</td>" in html
    assert "20.0 accelerator-h ($40.00)" in html and "GPU/accelerator-h wasted per week" in html


def test_a_gpu_teams_digest_keeps_gpu_hours(seeded):
    d = build_digest(seeded, week="2026-W48", team="gpu-team")
    assert d.device == "GPU"
    md = render_digest(d, "md")
    assert "**20.0 GPU-hours ($40.00) wasted** on anti-patterns, of 40.0 GPU-hours ($80.00)" in md
    assert "accelerator" not in md and "| Device |" not in md


def test_history_of_an_mtia_job_says_accelerator(seeded, capsys):
    h = job_history("ranker", seeded)
    assert h.device == "accelerator" and {r.device for r in h.runs} == {"accelerator"}
    assert main(["history", "ranker", "--db", seeded]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ranker: team mtia-team, owner -, 1 x accelerator, $2.00/accelerator-hour\n"), text
    assert "100 accelerator-h" in text and "Wasted accelerator-hours by pattern and week:" in text
    assert not GPU_HOURS_FIGURE.search(text), text
    md = render_history(h, "md")
    assert "| Accelerator-h | Cost | Step | Findings (pct of step, wasted accelerator-h) |" in md
    assert not GPU_HOURS_FIGURE.search(md), md
    gpu = render_history(job_history("llm", seeded), "text")
    assert "40.0 GPU-h" in gpu and "accelerator" not in gpu
