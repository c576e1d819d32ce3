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


def test_equally_matching_files_of_one_name_are_not_resolved_on_a_guess(tmp_path, capsys):
    """A trace frame /home/alice/proj/sync_point.py and a folder holding a/sync_point.py and
    b/sync_point.py: the first in sorted order was taken and patched. Now neither is taken, a
    note names both and patch.diff changes nothing; a file whose whole path is the frame's
    suffix still wins a tie (train.py over old/train.py)."""
    for sub in ("a", "b"):
        (tmp_path / "src" / sub).mkdir(parents=True)
        for name in ("sync_point.py", "_common.py"):
            (tmp_path / "src" / sub / name).write_bytes((SCEN / name).read_bytes())
    idx = SourceIndex(tmp_path / "src")
    assert idx.resolve("/home/alice/proj/sync_point.py") is None
    assert [p.relative_to(tmp_path / "src").as_posix() for p in idx.ambiguous["/home/alice/proj/sync_point.py"]] == [
        "a/sync_point.py", "b/sync_point.py"]
    assert idx.resolve("/home/alice/proj/a/sync_point.py").relative_to(tmp_path / "src").as_posix() == "a/sync_point.py"
    (tmp_path / "src" / "sync_point.py").write_text("x = 1\n")
    assert SourceIndex(tmp_path / "src").resolve("/home/alice/proj/sync_point.py") == (tmp_path / "src" / "sync_point.py").resolve()
    (tmp_path / "src" / "sync_point.py").unlink()

    rc = main(["analyze", str(EXAMPLES / "sync_point"), "--source", str(tmp_path / "src"), "--out", str(tmp_path / "out"),
               "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "match the traced sync_point.py equally (a/sync_point.py, b/sync_point.py)" in out
    patch = tmp_path / "out" / "patch.diff"
    assert not patch.exists() or patch.read_text() == ""


def test_a_library_package_init_is_no_ambiguity(tmp_path):
    """The traced logging/__init__.py against a folder of packages: every __init__.py matched it
    by name alone and the note listed hundreds of 'equally matching' files; a package's
    __init__.py needs its folder's name too, so none matches and nothing is noted."""
    for sub in ("a", "b", "logging"):
        (tmp_path / "src" / sub).mkdir(parents=True)
        (tmp_path / "src" / sub / "__init__.py").write_text("x = 1\n")
    idx = SourceIndex(tmp_path / "src")
    assert idx.resolve_strict("/usr/lib/python3.11/logging/__init__.py") == (tmp_path / "src" / "logging" / "__init__.py").resolve()
    (tmp_path / "src" / "logging" / "__init__.py").unlink()
    idx = SourceIndex(tmp_path / "src")
    assert idx.resolve_strict("/usr/lib/python3.11/logging/__init__.py") is None
    assert idx.ambiguous == {}


@pytest.mark.parametrize("make", ["file", "missing"])
def test_a_source_that_is_no_folder_is_refused_before_any_work(tmp_path, capsys, make):
    """--source train.py (a file) was refused as 'source folder not found', after the whole trace was
    read, and both refusals left an empty --out folder behind."""
    source = tmp_path / "sync_point.py"
    if make == "file":
        source.write_bytes((SCEN / "sync_point.py").read_bytes())
    rc = main(["analyze", str(EXAMPLES / "sync_point"), "--source", str(source), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert ("a file, not a folder" if make == "file" else "source folder not found") in err
    assert not (tmp_path / "out").exists()


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
    out = capsys.readouterr().out
    assert "opt-in fix cpu-autocast selected (job.json records cpu.native_bf16 = true" in out
    assert "included" not in out  # it ran; whether it changed anything is patch.diff's (and a note's) to say
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


def test_files_ran_is_empty_without_resolved_frames():
    """Nothing of the trace resolves: no file is patched (it used to be the whole folder, every
    program in it); the static matches found by searching the folder are marked unconfirmed."""
    from zoomer_ar.sourcemap import files_ran, is_unconfirmed

    analysis = map_sources(analyze_path(EXAMPLES / "sync_point"), SCEN)
    assert files_ran(analysis) == ["sync_point.py"]
    unmapped = analyze_path(EXAMPLES / "sync_point")  # not source-mapped: nothing resolved
    assert files_ran(unmapped) == []
    elsewhere = map_sources(analyze_path(EXAMPLES / "sync_point"), REPO / "zoomer_ar" / "fix")  # not the traced code
    assert files_ran(elsewhere) == []
    frames = [fr for f in elsewhere.findings for fr in f.evidence.frames if fr.resolved_path]
    assert all(is_unconfirmed(fr) for fr in frames)
    assert any("resolves to a file under" in n and "nothing is patched" in n for n in elsewhere.notes)


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


# --------------------------------------------------------------------------------------------
# GPU recordings whose findings carry no Python frame, against a git repository of the folder
# --------------------------------------------------------------------------------------------

GPU = REPO / "examples" / "gpu"


def _git_repo(tmp_path: Path, name: str = "repo", rename=lambda n: n) -> Path:
    import shutil
    import subprocess

    repo = tmp_path / name
    repo.mkdir()
    for f in SCEN.iterdir():
        if f.is_file():
            shutil.copy(f, repo / rename(f.name))
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(tmp_path), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "scenarios"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True, env=env, capture_output=True)
    return repo


def _analyze(trace: Path, src: Path, out: Path, capsys) -> tuple[str | None, str]:
    rc = main(["analyze", str(trace), "--source", str(src), "--fix-select", "torch-compile", "--out", str(out),
               "--no-progress"])
    assert rc in (0, None)
    patch = out / "patch.diff"
    return (patch.read_text() if patch.is_file() else None), capsys.readouterr().out


def _locations(out: str) -> list[tuple[str, str]]:
    import re

    lines = [l.strip() for l in out.splitlines() if l.strip().startswith("at ")]
    found = [re.fullmatch(r"at (\S+):\d+ in (.*)", l) for l in lines]
    assert all(found), lines
    return [(m.group(1), m.group(2)) for m in found]


@pytest.mark.parametrize("scenario", ["launch_bound", "memory_growth", "extra_copy"])
def test_frameless_gpu_findings_patch_only_the_program_that_ran(scenario, tmp_path, capsys):
    """launch-bound's evidence is idle gaps (framed by the launch that came late after each, in
    `train_step`); memory-growth's a memory curve (no frame); the trace's own frames are
    `SCENARIO.py(..): main` and `train_step`. launch-bound used to be located `at extra_copy.py:53
    in ` and `at extra_copy_clean.py:42 in ` (a static search of the whole folder, no function) and
    the patch compiled those two programs and left the traced one alone."""
    import subprocess

    repo = _git_repo(tmp_path)
    program = f"{scenario}.py"
    diff, out = _analyze(GPU / scenario, repo, tmp_path / "out", capsys)
    assert diff is not None, out
    assert _patched_files(diff) == {program}
    assert "+    model = torch.compile(model)" in diff
    locations = _locations(out)
    assert locations and {f for f, _ in locations} == {program}
    assert all(fn and "unconfirmed" not in fn for _, fn in locations)
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    lb = next(f for f in doc["findings"] if f["pattern"] == "launch-bound")
    # framed in train_step by the trace; located at the model's construction, which lies in main
    assert [(fr["resolved_path"], fr["function"]) for fr in lb["evidence"]["frames"]] == [(program, "main")]

    check = subprocess.run(["git", "apply", "--check", str(tmp_path / "out" / "patch.diff")], cwd=repo,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "apply", str(tmp_path / "out" / "patch.diff")], cwd=repo, check=True)
    changed = subprocess.run(["git", "diff", "--name-only"], cwd=repo, capture_output=True, text=True, check=True)
    assert changed.stdout.split() == [program]
    again, out2 = _analyze(GPU / scenario, repo, tmp_path / "out2", capsys)
    assert again is None, again
    assert all(f == program for f, _ in _locations(out2))


def test_memory_growth_is_located_in_the_traced_program(tmp_path, capsys):
    """memory-growth (profile_memory off: no frame) is looked for in memory_growth.py only, and
    its fix is the only one of the default patch there."""
    repo = _git_repo(tmp_path)
    analysis = map_sources(analyze_path(GPU / "memory_growth"), repo)
    mg = next(f for f in analysis.findings if f.pattern == "memory-growth")
    assert [(fr.resolved_path, fr.function) for fr in mg.evidence.frames] == [("memory_growth.py", "train_step")]


def test_nothing_resolves_patches_nothing_and_says_the_locations_are_unconfirmed(tmp_path, capsys):
    """The folder holds the programs under other names: no frame of the trace and not job.json's
    script resolves. The trace's own frames are shown as the trace names them (launch_bound.py,
    which the folder does not hold), the static matches as unconfirmed; no program is patched."""
    repo = _git_repo(tmp_path, rename=lambda n: f"x_{n}")
    diff, out = _analyze(GPU / "launch_bound", repo, tmp_path / "out", capsys)
    assert diff is None
    locations = _locations(out)
    static = [(f, fn) for f, fn in locations if f.startswith("x_")]
    assert static and all(fn.endswith("(unconfirmed)") and not fn.startswith(" ") for _, fn in static)
    assert all(f == "launch_bound.py" and not (repo / f).exists() for f, _ in locations if (f, _) not in static)
    assert "note: source: no Python frame of the trace" in out and "nothing is patched" in out


def test_partly_resolving_frames_confine_the_finding_to_their_file(tmp_path):
    """A finding whose frames resolve partly (one in a library outside the folder, one in the
    program) is located in the program only; other findings without frames follow it."""
    from zoomer_ar.models import SourceFrame
    from zoomer_ar.sourcemap import files_ran

    repo = _git_repo(tmp_path)
    analysis = analyze_path(GPU / "launch_bound")
    frames = [SourceFrame(file="/opt/lib/helpers/elsewhere.py", line=3, function="run"),
              SourceFrame(file="/home/u/job/launch_bound.py", line=28, function="train_step")]
    findings = [f.model_copy(update={"evidence": f.evidence.model_copy(update={"frames": frames})})
                if f.pattern == "idle-gpu" else f for f in analysis.findings]
    (tmp_path / "trace").mkdir()  # no job.json and no trace file: only the frames tell
    job = analysis.job.model_copy(update={"path": str(tmp_path / "trace"), "ranks": []})
    mapped = map_sources(analysis.model_copy(update={"findings": findings, "job": job}), repo)
    idle = next(f for f in mapped.findings if f.pattern == "idle-gpu")
    assert [fr.resolved_path for fr in idle.evidence.frames] == [None, "launch_bound.py"]
    lb = next(f for f in mapped.findings if f.pattern == "launch-bound")
    assert {fr.resolved_path for fr in lb.evidence.frames} == {"launch_bound.py"}
    assert files_ran(mapped) == ["launch_bound.py"]


def test_job_json_script_names_the_program_of_a_trace_without_stacks(tmp_path):
    """A recording without Python stacks: the capture helper's job.json names the script."""
    from zoomer_ar.sourcemap import files_ran

    repo = _git_repo(tmp_path)
    analysis = analyze_path(GPU / "launch_bound")
    job = analysis.job.model_copy(update={"ranks": []})  # the trace's own frames are not read
    mapped = map_sources(analysis.model_copy(update={"job": job}), repo)
    assert files_ran(mapped) == ["launch_bound.py"]


@pytest.mark.parametrize("folder", [GPU / "allocator_churn", GPU / "conv_bias_before_bn", EXAMPLES / "single_tensor_optimizer"],
                         ids=["allocator_churn", "conv_bias_before_bn", "single_tensor_optimizer"])
def test_a_location_names_the_function_that_holds_its_line(folder):
    """A finding framed in `train_step` whose statement lies elsewhere (launch-bound: the model's
    construction; single-tensor-optimizer: the optimizer's; conv-bias-before-bn: the conv in
    `conv_bn_block`) was shown as `allocator_churn.py:44 (train_step)` / "at allocator_churn.py:44 in
    train_step", line 44 being in `main`. The location now names the function holding the line."""
    from zoomer_ar.sourcemap import enclosing_function

    analysis = map_sources(analyze_path(folder), SCEN)
    located = [fr for f in analysis.findings for fr in f.all_frames() if fr.resolved_path]
    assert located
    elsewhere = 0
    for fr in located:
        text = (SCEN / fr.resolved_path).read_text()
        assert fr.function == enclosing_function(text, fr.resolved_line), (fr.resolved_path, fr.resolved_line, fr.function)
        elsewhere += fr.function != "train_step"
    assert elsewhere  # each of these has a statement outside the traced function
