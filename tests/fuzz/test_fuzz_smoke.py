"""A few cases of each kind of tests/fuzz/fuzz_cli.py: the fuzzer runs, and what it checks holds."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz_cli  # noqa: E402


def test_a_few_fuzz_cases_of_each_kind(shared_traces, tmp_path, capsys):
    code = fuzz_cli.main(["--seed", "3", "-n", "6", "--keep", str(tmp_path / "kept")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "0 of 6 cases failed" in out


def test_the_fuzzer_sees_an_output_that_fails_check(shared_traces, tmp_path):
    """Its output check is not vacuous: a written trace that `trace check` refuses is reported."""
    bad = tmp_path / "out" / "x.json"
    bad.parent.mkdir()
    bad.write_text('{"traceEvents": [{"ph": "M", "pid": 1, "args": {"name": "p"}}]}')
    assert "fails trace check" in (fuzz_cli.unchecked_outputs(tmp_path / "out") or "")
    good = tmp_path / "ok" / "y.json"
    good.parent.mkdir()
    good.write_text('{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}')
    assert fuzz_cli.unchecked_outputs(tmp_path / "ok") is None
