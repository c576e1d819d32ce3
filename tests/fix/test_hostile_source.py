"""Hostile user source: deeply nested text must be skipped with a one-line note, never crash.

libcst's native parser overflows the C stack on ``x = ((((...1))))`` (about 1,500 levels) and on
long operator chains; the process died with SIGSEGV, so one such file in the source folder
stopped ``fix`` and ``analyze --source`` from writing anything. Every test that could reach the
native parser with such text runs the CLI in a subprocess, so that on a regression the test
fails (exit -11 / 139) instead of killing the test run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zoomer_ar.fix.api import static_findings
from zoomer_ar.fix.nesting import MAX_BRACKETS, MAX_CHAIN, nesting_problem, parse_in_big_stack
from zoomer_ar.sourcemap import enclosing_function

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "training_data" / "scenarios"
SYNC_TRACE = ROOT / "examples" / "traces" / "sync_point"

#: each of these killed the process (or, for the chains, took minutes) before the guard
HOSTILE: dict[str, str] = {
    "parens.py": "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n",
    "lists.py": "x = " + "[" * 5000 + "1" + "]" * 5000 + "\n",
    "calls.py": "x = " + "f(" * 5000 + "1" + ")" * 5000 + "\n",
    "lambdas.py": "x = " + "lambda: " * 5000 + "1\n",
    "sum.py": "x = " + "+".join(["1"] * 100_000) + "\n",
    "ands.py": "x = " + " and ".join(["a"] * 100_000) + "\n",
    "powers.py": "x = " + "**".join(["2"] * 100_000) + "\n",
    "attrs.py": "x = a" + ".b" * 100_000 + "\n",
    "indent.py": "".join(" " * i + "if a:\n" for i in range(300)) + " " * 300 + "pass\n",
}

#: parses (inside the pre-scan's limits) but libcst's own Python recursion (positions, code
#: generation) runs out on it: the RecursionError's report recursed too and ended the run
DEEP_BUT_PARSED = (
    "import torch\n\ndef train(model, loader, total):\n    for x in loader:\n        total += model(x).item()\n"
    "    f = " + "lambda: " * 990 + "1\n    return total\n"
)

TRAIN = textwrap.dedent(
    """\
    import torch

    def train(model, opt, loader):
        total = 0.0
        for x, y in loader:
            loss = model(x, y)
            loss.backward()
            opt.step()
            total += loss.item()
        return total
    """
)


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zoomer_ar.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _skipped(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("zoomer-ar: skipped")]


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    """A folder of every hostile file plus one ordinary file with a fixable ``.item()``."""
    root = tmp_path / "proj"
    root.mkdir()
    for name, text in HOSTILE.items():
        (root / name).write_text(text)
    (root / "train.py").write_text(TRAIN)
    return root


def test_fix_single_deep_file_is_skipped_not_fatal(tmp_path: Path) -> None:
    deep = tmp_path / "d5000.py"
    deep.write_text(HOSTILE["parens.py"])
    proc = _cli("fix", str(deep))
    assert proc.returncode == 0, proc.stderr[-500:]
    assert _skipped(proc.stderr) == [f"zoomer-ar: skipped {deep}:1:{4 + MAX_BRACKETS + 1}: cannot parse: "
                                     f"nesting too deep (more than {MAX_BRACKETS} nested brackets)"]


def test_fix_diff_skips_each_hostile_file_and_fixes_the_rest(hostile_dir: Path) -> None:
    proc = _cli("fix", str(hostile_dir), "--diff")
    assert proc.returncode == 0, proc.stderr[-500:]
    skipped = _skipped(proc.stderr)
    for name in HOSTILE:
        line = [ln for ln in skipped if ln.startswith(f"zoomer-ar: skipped {hostile_dir / name}:")]
        assert len(line) == 1 and "cannot parse: nesting too deep" in line[0], (name, skipped)
    assert len(skipped) == len(HOSTILE)
    assert "+++ b/train.py" in proc.stdout and "+        total += loss.detach()" in proc.stdout
    assert f"; {len(HOSTILE)} skipped" in proc.stderr


def test_fix_findings_and_json_list_the_skipped_file(hostile_dir: Path) -> None:
    for name in list(HOSTILE)[1:]:
        (hostile_dir / name).unlink()  # one hostile file is enough here
    text = _cli("fix", str(hostile_dir))
    assert text.returncode == 0 and "train.py:9:" in text.stdout and "sync-point" in text.stdout
    as_json = _cli("fix", str(hostile_dir), "--format", "json")
    assert as_json.returncode == 0
    assert '"parens.py:1:' in as_json.stdout and "nesting too deep" in as_json.stdout


def test_fix_skips_text_too_deep_for_libcsts_own_recursion(tmp_path: Path) -> None:
    (tmp_path / "deep.py").write_text(DEEP_BUT_PARSED)
    (tmp_path / "train.py").write_text(TRAIN)
    proc = _cli("fix", str(tmp_path), "--diff")
    assert proc.returncode == 0, proc.stderr[-500:]
    assert _skipped(proc.stderr) == [f"zoomer-ar: skipped {tmp_path / 'deep.py'}: cannot analyse: nesting too deep"]
    assert "+++ b/train.py" in proc.stdout


def _scenario_copy(tmp_path: Path) -> Path:
    root = tmp_path / "scenarios"
    shutil.copytree(SCENARIOS, root)
    return root


def test_analyze_source_with_deep_file_still_writes_the_patch(tmp_path: Path) -> None:
    """The usual layout: the traced program beside hostile files it does not run. A guard that
    skipped whole folders, or parsed the hostile files for the patch, would fail here."""
    root = _scenario_copy(tmp_path)
    (root / "d5000.py").write_text(HOSTILE["parens.py"])
    (root / "sum.py").write_text(HOSTILE["sum.py"])
    out = tmp_path / "out"
    proc = _cli("analyze", str(SYNC_TRACE), "--source", str(root), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-500:]
    patch = (out / "patch.diff").read_text()
    assert "+++ b/sync_point.py" in patch and "d5000.py" not in patch
    assert (out / "report.md").is_file()


def test_analyze_searching_the_whole_folder_survives_deep_files(tmp_path: Path) -> None:
    """No frame of the trace resolves (the program is saved as train.py), so every file of the
    folder is searched statically: the hostile ones were parsed, and the process died."""
    root = tmp_path / "src"
    root.mkdir()
    shutil.copy(SCENARIOS / "sync_point.py", root / "train.py")
    shutil.copy(SCENARIOS / "_common.py", root / "_common.py")
    for name in ("parens.py", "sum.py", "lambdas.py"):
        (root / name).write_text(HOSTILE[name])
    (root / "deep.py").write_text(DEEP_BUT_PARSED)
    out = tmp_path / "out"
    proc = _cli("analyze", str(SYNC_TRACE), "--source", str(root), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-500:]
    report = (out / "report.md").read_text()
    assert "train.py" in report and "parens.py" not in report


def test_parse_survives_a_small_caller_stack(tmp_path: Path) -> None:
    """Text just inside the limits needs a few MiB of native stack: it is parsed on a thread of
    its own, so a caller on a 512 KiB worker thread is not at risk."""
    script = textwrap.dedent(
        f"""\
        import threading
        from zoomer_ar.fix.api import static_findings
        texts = ["x = " + "[lambda: " * {MAX_BRACKETS - 1} + "1" + "]" * {MAX_BRACKETS - 1} + "\\n",
                 "x = " + "lambda: " * {MAX_CHAIN - 3} + "1\\n"]
        done = []
        def work():
            for t in texts:
                done.append(static_findings(t, "t.py"))
        threading.stack_size(512 * 1024)
        th = threading.Thread(target=work)
        th.start(); th.join()
        print("parsed", len(done))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout.strip() == "parsed 2"


# --------------------------------------------------------------------------------------------
# The pre-scan itself (in-process: it never reaches a native parser)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_prescan_flags_hostile_text(name: str) -> None:
    assert nesting_problem(HOSTILE[name]) is not None


@pytest.mark.parametrize(
    "text",
    [
        "x = " + "(" * MAX_BRACKETS + "1" + ")" * MAX_BRACKETS + "\n",  # CPython's own limit
        "x = " + "+".join(["1"] * 900) + "\n",
        "x = [" + ", ".join(["-1"] * 20_000) + "]\n",  # long flat literals are fine
        "s = '" + "(" * 5000 + "'  # ((((\n",  # brackets in strings and comments do not nest
        "".join(" " * i + "if a:\n" for i in range(90)) + " " * 90 + "pass\n",
        "if a:\n    pass\n" + "elif a:\n    pass\n" * 500,
    ],
    ids=["brackets-at-limit", "sum-900", "flat-list", "string-and-comment", "indent-90", "elif-500"],
)
def test_prescan_accepts_deep_but_ordinary_code(text: str) -> None:
    assert nesting_problem(text) is None
    static_findings(text, "ok.py")  # parses: no SourceParseError


def test_prescan_points_at_the_line_that_goes_too_deep() -> None:
    text = "import torch\n\nx = 1\ny = " + "-" * 5000 + "1\n"
    line, column, why = nesting_problem(text) or (0, 0, "")
    assert (line, why) == (4, f"more than {MAX_CHAIN} chained operators or elifs") and column > 4


def test_unterminated_text_is_measured_by_its_raw_brackets() -> None:
    assert nesting_problem("x = " + "(" * 5000 + "\n'''") is not None
    assert nesting_problem("x = (1,\n'''") is None  # an ordinary syntax error, left to the parser


def test_enclosing_function_of_hostile_text_is_module() -> None:
    """sourcemap names the function around a frame with :mod:`ast`, which raised RecursionError
    (uncaught: analyze died with a traceback) on a long operator chain."""
    assert enclosing_function(HOSTILE["sum.py"], 1) == "<module>"
    assert enclosing_function("def f():\n    return 1\n", 2) == "f"


def test_parse_in_big_stack_returns_and_reraises() -> None:
    assert parse_in_big_stack(lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        parse_in_big_stack(lambda: 1 // 0)
