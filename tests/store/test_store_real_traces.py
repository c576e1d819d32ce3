"""Must hold: the real traces recorded under a few teams and weeks give a digest whose numbers add up.

Per pattern and week, the digest's wasted GPU-hours must equal the sum over recorded findings of
impact.pct_of_step / 100 x the run's GPU-hours, and its dollars that times the run's price; totals,
team filters, phases and the job table must agree too. Same on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.detect.combine import combined_impact
from zoomer_ar.features.phases import PHASES
from zoomer_ar.models import Finding
from zoomer_ar.store.cost import default_gpus, profiled_gpu_hours

from store_support import TRACES, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.xdist_group("store-real-traces")

# trace, job, team, owner, week, --gpu-hours (None: profiled), --gpu-hour-cost (None: the job's), how
PLAN = [
    ("kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz", "resnet", "vision", "ann", "2026-W45", 1000.0, 2.5, "analyze"),
    ("hta/trace_diff/control/control.json.gz", "recsys", "ads", "bob", "2026-W45", 500.0, 3.0, "record"),
    ("hta/df_index_resolver/df_index_resolver.json.gz", "ddp", "infra", "cid", "2026-W45", None, 4.0, "record"),
    ("kineto/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz", "resnet", "vision", "ann", "2026-W46", 1000.0, None, "record"),
    ("hta/trace_diff/test/test.json.gz", "recsys", "ads", "bob", "2026-W46", 500.0, None, "record"),
    ("param/dlrm_8ranks", "dlrm", "infra", "dee", "2026-W46", 2000.0, 1.8, "record"),
    ("hta/nccl_parser_config/nccl_data.json.gz", "ddp", "infra", "cid", "2026-W47", 300.0, None, "record"),
    ("tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz", "bert", "inference", "eve", "2026-W47", 50.0, 2.0, "analyze"),
    ("param/linear_kineto.json.gz", "linear", "inference", "eve", "2026-W47", None, None, "record"),
    ("hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "cnn", "vision", "ann", "2026-W47", 250.0, 2.5, "record"),
]
WEEKS = ["2026-W45", "2026-W46", "2026-W47"]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory, shared_traces_dir) -> dict[str, Path]:
    """findings.json of every trace recorded through `zoomer-ar record` (analysed once per module)."""
    root = tmp_path_factory.mktemp("real-findings")
    out = {}
    for rel, *_rest, how in PLAN:
        if how != "record":
            continue
        d = root / rel.replace("/", "__")
        assert main(["analyze", str(shared_traces_dir / rel), "--out", str(d), "--no-progress", "--format", "json"]) == 0
        out[rel] = d / "findings.json"
    return out


@pytest.fixture(scope="module")
def shared_traces_dir() -> Path:
    import os

    if not (TRACES / "LABELS.yaml").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"the real-trace corpus is missing at {TRACES}")
        pytest.skip(f"real-trace corpus not found at {TRACES}")
    return TRACES


def _opts(job, team, owner, week, hours, price, url) -> list[str]:
    args = ["--job", job, "--team", team, "--owner", owner, "--week", week, "--db", url]
    if hours is not None:
        args += ["--gpu-hours", str(hours)]
    if price is not None:
        args += ["--gpu-hour-cost", str(price)]
    return args


def record_all(url: str, analysed: dict[str, Path], tmp: Path, traces: Path) -> list[tuple[dict, float, float, tuple]]:
    """Record the PLAN; returns (findings.json doc, GPU-hours, price, plan row) per run, as the test expects them."""
    prices: dict[str, float] = {}
    runs = []
    for row in PLAN:
        rel, job, team, owner, week, hours, price, how = row
        if how == "analyze":
            out = tmp / rel.replace("/", "__")
            assert main(["analyze", str(traces / rel), "--out", str(out), "--no-progress", "--format", "json", "--record",
                         *_opts(job, team, owner, week, hours, price, url)]) == 0
            doc = json.loads((out / "findings.json").read_text())
        else:
            assert main(["record", str(analysed[rel]), *_opts(job, team, owner, week, hours, price, url)]) == 0
            doc = json.loads(analysed[rel].read_text())
        if price is not None:
            prices[job] = price
        gpus = default_gpus(doc["features"])
        runs.append((doc, hours if hours is not None else profiled_gpu_hours(doc["features"], gpus),
                     prices.get(job, 0.0), row))
    return runs


def _digest(url: str, week: str, team: str | None = None) -> dict:
    import contextlib
    import io

    buf = io.StringIO()
    args = ["digest", "--db", url, "--week", week, "--format", "json", "--top", "50"]
    if team:
        args += ["--team", team]
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return json.loads(buf.getvalue())


def test_real_trace_digest_adds_up(store_url, analysed, shared_traces_dir, tmp_path, capsys):
    runs = record_all(store_url, analysed, tmp_path, shared_traces_dir)
    capsys.readouterr()
    assert sum(len(doc["findings"]) for doc, *_ in runs) > 20, "the corpus should yield findings to add up"
    for team in (None, "vision", "infra"):
        for week in WEEKS:
            sel = [(doc, h, p, row) for doc, h, p, row in runs if row[4] == week and (team is None or row[2] == team)]
            waste: dict[str, float] = defaultdict(float)
            usd: dict[str, float] = defaultdict(float)
            count: dict[str, int] = defaultdict(int)
            for doc, hours, price, _row in sel:
                for f in doc["findings"]:
                    w = f["impact"]["pct_of_step"] / 100.0 * hours
                    waste[f["pattern"]] += w
                    usd[f["pattern"]] += w * price
                    count[f["pattern"]] += 1
            d = _digest(store_url, week, team)
            got = {p["pattern"]: p for p in d["patterns"]}
            assert set(got) == set(waste), (team, week)
            for pat in waste:
                assert got[pat]["wasted_gpu_hours"] == pytest.approx(waste[pat], rel=1e-9, abs=1e-12), (team, week, pat)
                assert got[pat]["wasted_usd"] == pytest.approx(usd[pat], rel=1e-9, abs=1e-12), (team, week, pat)
                assert got[pat]["findings"] == count[pat]
            # totals count each run's findings combined (a finding within another once)
            combined = {id(doc): combined_impact(Finding.model_validate(f) for f in doc["findings"]).pct_of_step / 100.0
                        for doc, *_ in sel}
            assert d["wasted_gpu_hours"] == pytest.approx(sum(combined[id(doc)] * h for doc, h, _p, _r in sel), rel=1e-9)
            assert d["wasted_usd"] == pytest.approx(sum(combined[id(doc)] * h * p for doc, h, p, _r in sel), rel=1e-9)
            assert d["wasted_gpu_hours"] <= sum(waste.values()) + 1e-9
            assert d["gpu_hours"] == pytest.approx(sum(h for _d, h, _p, _r in sel), rel=1e-9)
            assert d["usd"] == pytest.approx(sum(h * p for _d, h, p, _r in sel), rel=1e-9)
            assert d["runs"] == len(sel)
            # the job table is the same sums by job
            for j in d["jobs"]:
                mine = [(doc, h, p) for doc, h, p, row in sel if row[1] == j["job"]]
                wj = sum(combined[id(doc)] * h for doc, h, _p in mine)
                assert j["wasted_gpu_hours"] == pytest.approx(wj, rel=1e-9, abs=1e-12)
                assert j["gpu_hours"] == pytest.approx(sum(h for _d, h, _p in mine), rel=1e-9)
            # phases: each run's GPU-hours split by its trace's phase shares
            phases = {p["phase"]: p["gpu_hours"] for p in d["phases"]}
            for ph in PHASES:
                exp = sum(h * (doc["features"][f"phase_{ph}_pct"] or 0.0) / 100.0 for doc, h, _p, _r in sel)
                assert phases[ph] == pytest.approx(exp, rel=1e-9, abs=1e-12), (team, week, ph)
            assert sum(phases.values()) == pytest.approx(d["gpu_hours"], rel=1e-6)
            # the 12-week series ends with this week's totals
            assert d["series"][-1]["wasted_gpu_hours"] == pytest.approx(d["wasted_gpu_hours"], rel=1e-9)

    # the fix shows as resolved: dataloader-bound was on resnet in W45 and is gone in W46
    d46 = _digest(store_url, "2026-W46")
    assert {(r["job"], r["pattern"]) for r in d46["resolved"]} >= {("resnet", "dataloader-bound")}
    # re-recording the same traces changes nothing
    before = [_digest(store_url, w) for w in WEEKS]
    record_all(store_url, analysed, tmp_path / "again", shared_traces_dir)
    after = [_digest(store_url, w) for w in WEEKS]
    for b, a in zip(before, after):
        b.pop("generated_at"), a.pop("generated_at")
        assert a == b


def test_analyze_report_shows_cost_attribution(shared_traces_dir, tmp_path, capsys):
    rel = "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    assert main(["analyze", str(shared_traces_dir / rel), "--out", str(tmp_path), "--no-progress",
                 "--gpu-hours", "100", "--gpu-hour-cost", "2"]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "findings.json").read_text())
    cost = doc["features"]["cost_attribution"]
    assert cost["gpu_hours"] == 100 and cost["usd"] == pytest.approx(200.0)
    assert sum(p["gpu_hours"] for p in cost["phases"]) == pytest.approx(100.0)
    dl = next(p for p in cost["patterns"] if p["pattern"] == "dataloader-bound")
    assert dl["gpu_hours"] == pytest.approx(next(f for f in doc["findings"] if f["pattern"] == "dataloader-bound")
                                            ["impact"]["pct_of_step"])
    md = (tmp_path / "report.md").read_text()
    assert "## Cost attribution" in md and "| dataloader |" in md and "`dataloader-bound`" in md
    html = (tmp_path / "report.html").read_text()
    assert 'id="cost"' in html and 'id="cost-phases"' in html
    # recording-only options need --record
    assert main(["analyze", str(shared_traces_dir / rel), "--no-files", "--no-progress", "--week", "2026-W01"]) == 2
