"""`zoomer-ar trace ...` defects left open by earlier audits: an empty trace compressed (exit 0), a job
folder holding a trace beside its decompressed twin refused by merge, `sample -k` copying fewer ranks
than asked where one rank is unreadable. Each test drives the real CLI and failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.cli import main

from conftest import SHARED_TRACES

DLRM = SHARED_TRACES / "param/dlrm_8ranks"


def _one_error_line(capsys, *parts: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("zoomer-ar: error:") and "internal error" not in err, err
    for p in parts:
        assert p in err, err
    return err


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ---- an empty trace compressed ------------------------------------------------------------------


@pytest.mark.parametrize("doc", [b'{"traceEvents": []}', b"[]", b'{"schemaVersion": 1, "traceEvents": [ ]}'])
@pytest.mark.parametrize("out_name", ["o.json.gz", "o.json"])
def test_compress_refuses_a_trace_without_events(doc, out_name, tmp_path, capsys):
    """`analyze` refuses such a trace (exit 2); compress wrote it and exited 0."""
    src = tmp_path / "empty.json"
    src.write_bytes(doc)
    assert main(["trace", "compress", str(src), str(tmp_path / out_name)]) == 2
    _one_error_line(capsys, str(src), "no events")
    assert _files(tmp_path) == ["empty.json"]
