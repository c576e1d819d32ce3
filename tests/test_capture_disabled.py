"""SteadyStateProfiler(enabled=False), the switch for runs or ranks that should not be profiled, still
made and checked the folder (refusing one that held an earlier capture), wrote a job.json that claimed
an incomplete capture and, with overwrite=True, deleted the earlier run's trace. Switched off, it now
touches nothing and only counts steps."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from zoomer_ar.capture import SteadyStateProfiler, profile_steps  # noqa: E402


def _loop(prof: SteadyStateProfiler) -> None:
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    with prof:
        for _ in range(10):
            model(x).sum().backward()
            prof.step()
            if prof.done:
                break


@pytest.mark.torch
def test_switched_off_it_leaves_an_earlier_capture_as_it_was(tmp_path):
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    profile_steps(lambda i: model(x).sum().backward(), out_dir=tmp_path, rank=0, skip_first=0, warmup=0, active=1)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    prof = SteadyStateProfiler(tmp_path, enabled=False, overwrite=True, skip_first=1, warmup=0, active=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no step recorded" warning either
        _loop(prof)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert prof.steps_run == 3 and prof.done
    assert prof.result.traces == [] and prof.result.job_json is None and prof.result.steps_run == 3


@pytest.mark.torch
def test_switched_off_it_makes_no_folder_and_reads_no_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "not-a-rank")  # switched on, this is a ValueError
    out = tmp_path / "never"
    _loop(SteadyStateProfiler(out, enabled=False, skip_first=0, warmup=0, active=1))
    assert not out.exists()
