"""analyze --source maps every planted anti-pattern of the scenario programs to its planted line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zoomer_ar.analyze import analyze_path
from zoomer_ar.cli import main
from zoomer_ar.sourcemap import SourceIndex, map_sources

REPO = Path(__file__).resolve().parents[1]
SCEN = REPO / "training_data" / "scenarios"
EXAMPLES = REPO / "examples" / "traces"
MANIFEST = yaml.safe_load((SCEN / "MANIFEST.yaml").read_text())["scenarios"]
PLANTED = sorted((n, e) for n, e in MANIFEST.items() if e["pattern"] != "clean")


@pytest.mark.parametrize("name,entry", PLANTED, ids=[n for n, _ in PLANTED])
def test_planted_pattern_maps_to_its_line(name, entry):
    analysis = map_sources(analyze_path(EXAMPLES / name), SCEN)
    finding = next(f for f in analysis.findings if f.pattern == entry["pattern"])
    top = finding.evidence.frames[0]
    lines = {entry["line"]} | {a["line"] for a in entry.get("also", [])}
    assert top.resolved_path == entry["file"]
    assert top.resolved_line in lines
    assert top.snippet and entry["contains"].split("(")[0] in (SCEN / entry["file"]).read_text()


def test_cli_source_option_writes_resolved_frames(tmp_path, capsys):
    rc = main(["analyze", str(EXAMPLES / "sync_point"), "--source", str(SCEN), "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    assert "sync_point.py:33" in capsys.readouterr().out
    doc = json.loads((tmp_path / "findings.json").read_text())
    frames = [fr for f in doc["findings"] if f["pattern"] == "sync-point" for fr in f["evidence"]["frames"]]
    assert frames[0]["resolved_path"] == "sync_point.py" and frames[0]["resolved_line"] == 33


def test_suffix_resolution_prefers_longest_match(tmp_path):
    (tmp_path / "a" / "pkg").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "pkg" / "train.py").write_text("x = 1\n")
    (tmp_path / "b" / "train.py").write_text("x = 1\n")
    idx = SourceIndex(tmp_path)
    assert idx.resolve("/home/u/proj/pkg/train.py").relative_to(tmp_path).as_posix() == "a/pkg/train.py"
    assert idx.resolve("elsewhere.py") is None


def test_unparsable_source_keeps_frame_line(tmp_path):
    (tmp_path / "sync_point.py").write_text("def broken(:\n")
    analysis = map_sources(analyze_path(EXAMPLES / "sync_point"), tmp_path)
    f = next(f for f in analysis.findings if f.pattern == "sync-point")
    assert f.evidence.frames[0].resolved_path == "sync_point.py"


def _patch(tmp_path: Path, capsys, name: str, *extra: str) -> tuple[str, str]:
    out = tmp_path / f"out-{len(extra)}"
    rc = main(["analyze", str(EXAMPLES / name), "--source", str(SCEN), "--out", str(out), "--no-progress", *extra])
    assert rc in (0, None)
    patch = out / "patch.diff"
    return (patch.read_text() if patch.is_file() else ""), capsys.readouterr().out


def test_misaligned_gemm_patch_pads_the_planted_sizes(tmp_path, capsys):
    diff, _ = _patch(tmp_path, capsys, "misaligned_gemm")
    assert "-IN_FEATURES, HIDDEN, BATCH = 1001, 999, 63" in diff
    assert "+IN_FEATURES, HIDDEN, BATCH = 1008, 1000, 64" in diff
    assert "CLASSES = 64" not in [l[1:] for l in diff.splitlines() if l.startswith(("+", "-"))]


def test_opt_in_autocast_stays_out_of_the_default_patch(tmp_path, capsys):
    diff, out = _patch(tmp_path, capsys, "fp32_matmul")
    assert "torch.autocast" not in diff
    assert "opt-in fixes left out of patch.diff: cpu-autocast" in out
    diff, out = _patch(tmp_path, capsys, "fp32_matmul", "--fix-select", "cpu-autocast")
    assert '+    with torch.autocast("cpu", dtype=torch.bfloat16):' in diff
    assert "left out" not in out


def test_unknown_fix_select_is_a_one_line_error(tmp_path, capsys):
    rc = main(["analyze", str(EXAMPLES / "fp32_matmul"), "--source", str(SCEN), "--out", str(tmp_path),
               "--no-progress", "--fix-select", "no-such-fixer"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "no-such-fixer" in err and len(err.splitlines()) == 1


def test_job_facts_unlock_cpu_autocast_on_a_bf16_cpu(tmp_path, capsys):
    """cpu-autocast is opt-in because bf16 is emulated on CPUs without AVX512_BF16/AMX; the capture
    helper records the CPU in job.json, and a CPU with native bf16 gets the fix by default."""
    import shutil

    from zoomer_ar.capture import cpu_facts

    trace = tmp_path / "fp32_matmul"
    shutil.copytree(EXAMPLES / "fp32_matmul", trace)
    job = json.loads((trace / "job.json").read_text())
    job["cpu"] = cpu_facts("model name\t: Xeon\nflags\t\t: fpu avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert job["cpu"] == {"model": "Xeon", "native_bf16": True, "bf16_flags": ["amx_bf16", "avx512_bf16"]}
    (trace / "job.json").write_text(json.dumps(job))
    out_dir = tmp_path / "out"
    rc = main(["analyze", str(trace), "--source", str(SCEN), "--out", str(out_dir), "--no-progress"])
    assert rc in (0, None)
    assert "torch.autocast" in (out_dir / "patch.diff").read_text()
    assert "opt-in fix cpu-autocast included: job.json records cpu.native_bf16 = true" in capsys.readouterr().out
    # and without native bf16 it stays out
    job["cpu"] = cpu_facts("model name\t: Xeon\nflags\t\t: fpu avx512f\n")
    assert job["cpu"]["native_bf16"] is False
    (trace / "job.json").write_text(json.dumps(job))
    out_dir = tmp_path / "out2"
    main(["analyze", str(trace), "--source", str(SCEN), "--out", str(out_dir), "--no-progress"])
    patch = out_dir / "patch.diff"
    assert not patch.exists() or "torch.autocast" not in patch.read_text()


def test_reports_name_each_fixer_and_mark_the_opt_in_ones():
    from zoomer_ar.render import render_html, render_markdown

    analysis = analyze_path(EXAMPLES / "fp32_matmul")
    md = render_markdown(analysis)
    assert "`cpu-autocast` (opt-in: applied only when selected)" in md
    assert "`matmul-precision`" in md and "`matmul-precision` (opt-in" not in md
    assert "<code>cpu-autocast</code> (opt-in)" in render_html(analysis)


def test_job_facts_unlock_only_fixers_of_patterns_found(tmp_path):
    from zoomer_ar.analyze_cli import patch_fixers

    analysis = analyze_path(EXAMPLES / "sync_point")
    no_fp32 = [f for f in analysis.findings if f.pattern != "fp32-matmul"]
    chosen, held = patch_fixers(no_fp32, None, {"cpu-autocast"})
    assert "cpu-autocast" not in chosen and "cpu-autocast" not in held
    fp32 = analyze_path(EXAMPLES / "fp32_matmul").findings
    assert "cpu-autocast" in patch_fixers(fp32, None, {"cpu-autocast"})[0]
    assert "cpu-autocast" in patch_fixers(fp32)[1]


def _patched_files(diff: str) -> set[str]:
    return {line[len("+++ b/"):] for line in diff.splitlines() if line.startswith("+++ b/")}


def test_patch_changes_only_the_files_the_trace_ran(tmp_path, capsys):
    """The scenario folder holds 23 programs; the sync_point trace ran one of them. Other programs
    with an .item() in a loop or an fp32 model are left alone."""
    diff, _ = _patch(tmp_path, capsys, "sync_point")
    assert _patched_files(diff) == {"sync_point.py"}
    assert "-        stats[\"loss\"] += loss.item()" in diff


def test_files_ran_falls_back_to_the_whole_folder_without_resolved_frames():
    from zoomer_ar.sourcemap import files_ran

    analysis = map_sources(analyze_path(EXAMPLES / "sync_point"), SCEN)
    assert files_ran(analysis) == ["sync_point.py"]
    unmapped = analyze_path(EXAMPLES / "sync_point")  # not source-mapped: nothing resolved
    assert files_ran(unmapped) is None
    elsewhere = map_sources(analyze_path(EXAMPLES / "sync_point"), REPO / "zoomer_ar" / "fix")  # not the traced code
    assert files_ran(elsewhere) is None


def test_cpu_autocast_is_not_unlocked_for_a_gpu_job():
    from zoomer_ar.analyze_cli import unlocked_by_facts

    facts = {"cpu": {"native_bf16": True}}
    assert unlocked_by_facts(facts) == {"cpu-autocast"}
    assert unlocked_by_facts(facts, has_accelerator=True) == set()
    assert unlocked_by_facts({"cpu": {"native_bf16": False}}) == set()


def test_frameless_finding_is_looked_for_in_the_code_that_ran():
    """launch-bound's evidence (short kernels) carries no Python frame. It used to be looked for in
    every file of the folder and pointed at extra_copy.py for a trace of sync_point.py; now only
    the files the trace's frames resolve to are searched."""
    analysis = map_sources(analyze_path(REPO / "examples" / "gpu" / "sync_point"), SCEN)
    lb = next(f for f in analysis.findings if f.pattern == "launch-bound")
    resolved = {fr.resolved_path for fr in lb.evidence.frames if fr.resolved_path}
    assert resolved <= {"sync_point.py"}
