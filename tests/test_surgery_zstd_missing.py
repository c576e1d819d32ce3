"""A zstd output (OUT.json.zst, --compression zstd) without the optional `zstandard` package: refused
before the input is read. slice, split and merge read the whole input first (a survey, the launches),
so on a large trace the refusal came minutes late; an input that is bad further on was the error
reported instead of the missing package."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.stream import source

from conftest import SHARED_TRACES, files_under, one_error_line

NS = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"


@pytest.fixture
def no_zstandard(monkeypatch):
    """The package absent, as on this project's machines without the optional extra."""
    monkeypatch.setattr(source, "zstandard", None)


@pytest.fixture
def cut_off(tmp_path: Path, shared_traces) -> Path:
    """A trace whose events array is cut off at 90%: an error the readers find only at the end."""
    data = gzip.decompress(NS.read_bytes())
    path = tmp_path / "in" / "cut.json"
    path.parent.mkdir()
    path.write_bytes(data[: len(data) * 9 // 10])
    return path


@pytest.mark.parametrize("args", [
    ["slice", "{src}", "{out}/s.json.zst", "--steps", "102..103"],
    ["slice", "{src}", "{out}/w.trace", "--window", "0..5", "--compression", "zstd"],
    ["split", "{src}", "{out}/steps", "--compression", "zstd"],
    ["merge", "{src}", "{out}/m.json.zst"],
    ["filter", "{src}", "{out}/f.json.zstd"],
    ["compress", "{src}", "{out}/c.json.zst"],
])
def test_a_zstd_output_without_zstandard_is_refused_first(args, no_zstandard, cut_off, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    assert main(["trace", *(a.format(src=cut_off, out=out) for a in args)]) == 2
    one_error_line(capsys, "zstd output needs the optional `zstandard` package", str(out))
    assert files_under(out) == []
