"""relaunch reads the program's source to learn how it takes settings (relaunch/program.py, never run).
A module over MAX_MODULE_BYTES is not parsed: parsing and walking an 11 MB script took 40 s and 2.2 GB."""

from __future__ import annotations

import time

from zoomer_ar.relaunch import program
from zoomer_ar.relaunch.program import scan_program

PARSER = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', type=float)\nargs = p.parse_args()\n"


def _padding(nbytes: int) -> str:
    line = "x_{0} = [{0}, {0} + 1, {0} * 2]  # padding\n"
    out, i, size = [], 0, 0
    while size < nbytes:
        s = line.format(i)
        out.append(s)
        size += len(s)
        i += 1
    return "".join(out)


def test_a_script_over_the_limit_is_not_parsed_and_the_evidence_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(program, "MAX_MODULE_BYTES", 64 * 1024)
    script = tmp_path / "train.py"
    script.write_text(PARSER + _padding(100 * 1024))
    t = time.perf_counter()
    cli = scan_program(script)
    assert time.perf_counter() - t < 5
    assert cli.style == "unknown"
    assert "train.py not read: over" in cli.evidence
    # under the limit the same script is read: its argparse option is found
    monkeypatch.setattr(program, "MAX_MODULE_BYTES", 1024 * 1024)
    cli = scan_program(script)
    assert cli.style == "argparse" and cli.options.get("lr") == "--lr"


def test_a_large_helper_module_is_skipped_and_the_script_still_read(tmp_path, monkeypatch):
    monkeypatch.setattr(program, "MAX_MODULE_BYTES", 64 * 1024)
    (tmp_path / "big_table.py").write_text(_padding(100 * 1024))
    script = tmp_path / "train.py"
    script.write_text("import big_table\n" + PARSER)
    cli = scan_program(script)
    assert cli.style == "argparse" and cli.options.get("lr") == "--lr"
    assert [p.name for p in cli.files] == ["train.py"]
