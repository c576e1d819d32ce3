"""zoomer_ar.capture: the steady-state profiler helper (needs torch, except the import test)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)["traceEvents"]


def _steps(events: list[dict]) -> list[str]:
    return [e["name"] for e in sorted(events, key=lambda e: e.get("ts", 0)) if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X"]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture()
def tiny(torch):
    """A tiny model, optimizer and step function."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
    x = torch.randn(8, 16)

    def tiny_train_step(i: int) -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return tiny_train_step


def test_capture_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None; import zoomer_ar.capture as c; print(c.trace_file_name(2))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "rank-2.pt.trace.json.gz"


@pytest.mark.torch
def test_profile_steps_writes_trace_and_job(tiny, tmp_path):
    from zoomer_ar.capture import CAPTURE_SCHEMA, profile_steps

    res = profile_steps(tiny, out_dir=tmp_path, skip_first=2, warmup=1, active=3, job_name="tiny-job",
                        metadata={"purpose": "test"})
    trace = tmp_path / "rank-0.pt.trace.json.gz"
    assert res.traces == [trace] and trace.exists()
    with open(trace, "rb") as fh:
        assert fh.read(2) == b"\x1f\x8b"  # gzip
    events = _load(trace)
    assert _steps(events) == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    assert res.steps_recorded == [3, 4, 5] and res.steps_run == 6
    frames = [e["name"] for e in events if e.get("cat") == "python_function"]
    assert any(name.endswith(": tiny_train_step") and "test_capture.py(" in name for name in frames)
    assert any(name.startswith("nn.Module: Linear") for name in frames)  # with_modules
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert any(e["name"] == "aten::addmm" and e["args"].get("Input Dims") for e in ops)  # record_shapes

    job = json.loads((tmp_path / "job.json").read_text())
    assert job["schema"] == CAPTURE_SCHEMA
    assert job["job_name"] == "tiny-job"
    assert job["rank"] == 0 and job["rank_source"] == "default"
    assert job["steps_recorded"] == [3, 4, 5] and job["steps_run"] == 6 and job["complete"] is True
    assert job["schedule"] == {"skip_first": 2, "wait": 0, "warmup": 1, "active": 3, "repeat": 1}
    assert job["traces"] == ["rank-0.pt.trace.json.gz"]
    assert job["torch_version"] and job["hostname"] and isinstance(job["argv"], list)
    assert job["profiler"]["with_stack"] is True and job["profiler"]["profile_memory"] is False
    assert job["metadata"] == {"purpose": "test"}


@pytest.mark.torch
def test_steady_state_profiler_context_and_env_rank(tiny, tmp_path, monkeypatch):
    from zoomer_ar.capture import SteadyStateProfiler

    monkeypatch.setenv("RANK", "3")
    prof = SteadyStateProfiler(tmp_path, skip_first=1, wait=1, warmup=1, active=2, profile_memory=True)
    assert prof.total_steps == 5 and prof.recorded_steps() == [3, 4]
    n = 0
    with prof:
        while not prof.done:  # the loop may run on; it stops once everything is recorded
            tiny(n)
            prof.step()
            n += 1
    assert n == 5
    trace = tmp_path / "rank-3.pt.trace.json.gz"
    events = _load(trace)
    assert _steps(events) == ["ProfilerStep#3", "ProfilerStep#4"]
    assert any(e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {}) for e in events)
    assert not (tmp_path / "job.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.ranks", "rank-3.pt.trace.json.gz"]
    job = json.loads((tmp_path / "job.ranks" / "rank-3.json").read_text())
    assert job["rank"] == 3 and job["rank_source"] == "env RANK" and job["profiler"]["profile_memory"] is True


@pytest.mark.torch
def test_repeat_writes_one_file_per_cycle(tiny, tmp_path):
    from zoomer_ar.capture import profile_steps

    res = profile_steps(tiny, out_dir=tmp_path, rank=0, skip_first=0, warmup=1, active=2, repeat=2)
    assert res.traces == [tmp_path / "rank-0.pt.trace.json.gz", tmp_path / "cycle-1" / "rank-0.pt.trace.json.gz"]
    assert _steps(_load(res.traces[0])) == ["ProfilerStep#1", "ProfilerStep#2"]
    assert _steps(_load(res.traces[1])) == ["ProfilerStep#4", "ProfilerStep#5"]
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["steps_recorded"] == [1, 2, 4, 5]
    assert job["traces"] == ["rank-0.pt.trace.json.gz", "cycle-1/rank-0.pt.trace.json.gz"]


@pytest.mark.torch
def test_short_loop_still_flushes_partial_window(tiny, tmp_path):
    from zoomer_ar.capture import SteadyStateProfiler

    with SteadyStateProfiler(tmp_path, skip_first=1, warmup=1, active=5, rank=0) as prof:
        for i in range(4):  # stops two steps into the active window
            tiny(i)
            prof.step()
    events = _load(tmp_path / "rank-0.pt.trace.json.gz")
    assert _steps(events)[:2] == ["ProfilerStep#2", "ProfilerStep#3"]
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["complete"] is False and job["steps_recorded"] == [2, 3]


@pytest.mark.torch
def test_errors(tiny, tmp_path):
    from zoomer_ar.capture import SteadyStateProfiler, profile_steps

    with pytest.raises(ValueError, match="too few"):
        profile_steps(tiny, out_dir=tmp_path, steps=2, skip_first=1, warmup=1, active=3)
    with pytest.raises(ValueError):
        SteadyStateProfiler(tmp_path, active=0)
    with pytest.raises(RuntimeError, match="boom"):
        with SteadyStateProfiler(tmp_path / "err", skip_first=0, warmup=0, active=2) as prof:
            tiny(0)
            prof.step()
            raise RuntimeError("boom")
    assert not (tmp_path / "err" / "job.json").exists()


def test_detect_rank_order(monkeypatch):
    from zoomer_ar.capture import detect_rank

    monkeypatch.delenv("RANK", raising=False)
    assert detect_rank(5) == (5, "argument")
    assert detect_rank() == (0, "default")
    monkeypatch.setenv("RANK", "7")
    assert detect_rank() == (7, "env RANK")
