"""The capture helper exported the uncompressed trace into the system temp folder before gzipping it:
a GPU trace's export runs to gigabytes, and a small /tmp filled up (the capture failed at the end of
the run). The export now goes beside the trace it becomes, as a hidden file removed on every path."""

from __future__ import annotations

import errno
import gzip
import json
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from zoomer_ar.capture import SteadyStateProfiler, profile_steps  # noqa: E402


def _step_fn():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def train_step(i: int) -> None:
        model(x).sum().backward()

    return train_step


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.torch
def test_the_capture_needs_no_system_temp_folder(tmp_path, monkeypatch):
    """A temp folder that cannot take a file (here: a file, not a folder) no longer fails the capture."""
    profile_steps(_step_fn(), out_dir=tmp_path / "first", rank=0, skip_first=0, warmup=0, active=1)  # torch's
    # own lazy imports (torch._inductor makes a folder in the temp folder) happen here, before the temp folder goes
    not_a_folder = tmp_path / "temp"
    not_a_folder.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_folder))
    out = tmp_path / "run"
    res = profile_steps(_step_fn(), out_dir=out, rank=0, skip_first=0, warmup=1, active=2, repeat=2)
    assert _files(out) == ["cycle-1", "cycle-1/rank-0.pt.trace.json.gz", "job.json", "rank-0.pt.trace.json.gz"]
    for trace in res.traces:
        with gzip.open(trace, "rt", encoding="utf-8") as fh:
            assert json.load(fh)["traceEvents"]


@pytest.mark.torch
def test_a_failed_export_leaves_no_file_behind(tmp_path, monkeypatch):
    """The export runs out of disk half-way (after writing part of the file): the hidden file beside the
    trace is removed, no trace is claimed, and the error reaches the caller."""
    seen: list[Path] = []
    real = torch.profiler.profile.export_chrome_trace

    def export_then_disk_full(self, path: str) -> None:
        seen.append(Path(path))
        real(self, path)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", export_then_disk_full)
    out = tmp_path / "run"
    with pytest.raises(OSError, match="No space left"):
        with SteadyStateProfiler(out, rank=0, skip_first=0, warmup=0, active=1) as prof:
            step = _step_fn()
            for i in range(2):
                step(i)
                prof.step()
    assert [p.parent for p in seen] == [out] and seen[0].name.startswith(".rank-0.pt.trace.json.gz.")
    assert _files(out) == []


@pytest.mark.torch
def test_the_trace_is_not_compressed_at_gzips_slowest_level(tmp_path):
    """The export is compressed inside prof.step(), holding up the training loop: at level 9 a 35 MB trace
    took 2.7 s where level 6 takes 0.54 s for 13% more bytes. gzip's header says which (XFL: 2 = slowest)."""
    res = profile_steps(_step_fn(), out_dir=tmp_path / "run", rank=0, skip_first=0, warmup=0, active=1)
    header = res.traces[0].read_bytes()[:10]
    assert header[:2] == b"\x1f\x8b" and header[8] != 2
