"""Verified fixes: record -> analyze --source -> patch -> apply -> record again -> the finding is gone.

For every planted scenario program (training_data/scenarios/MANIFEST.yaml), in a scratch git
repository holding a copy of the scenario folder:

1. record the planted program (a few profiled steps) and run `zoomer-ar analyze TRACE --source
   SRC --out OUT`: the planted finding is there and `patch.diff` fixes the planted file;
2. `git apply --check` and `git apply` the patch; running the fix stage again over the files it
   patched (the files the findings were traced to) with the same patterns changes nothing
   (idempotent);
3. record the patched program and analyse it: the planted finding is gone;
4. step time is not worse: median ProfilerStep time after <= 1.25 x before (+0.5 ms) for a
   before/after pair recorded back to back (load on a shared box drifts within seconds), with up
   to two more pairs before failing. It is measured with the planted pattern's fix alone: analyze's patch also fixes incidental findings (every fp32 program has fp32 GEMMs,
   and bf16 autocast is *slower* on a CPU without native bf16), which would blur the check.

Where the fix cannot show on a CPU the step-time check is skipped, with the reason in CASES:
fp32_matmul (no native bf16 here: autocast's bf16 GEMMs are emulated and slower) and
dataloader_bound (the patch sizes the workers from the CPUs when the program runs, 1 on 2 cores;
it gains only where that core is free, and other jobs on this shared box often hold it). For
dataloader_bound "gone" is weakened to "the trace shows the loader's worker processes": on a
loaded 2-core box the batch hand-over alone can stay above the rule's 5% threshold (the clean
twin's recording shows the finding too at times); on a single usable core the patch's count is
0 (no worker: it would only take turns with training), and the finding stays. fp32_matmul's fix (cpu-autocast) is opt-in,
so its case asks for it with `--fix-select`, and checks that the default patch leaves it out.

Each case records 2-3 programs (a few seconds each, most of it importing torch); the cases are
independent and spread over pytest-xdist workers (`-n 2`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_fixes as B  # noqa: E402

from zoomer_ar.capture import cpu_facts  # noqa: E402
from zoomer_ar.relaunch.workers import usable_cpus  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch"),
]

TOLERANCE = 1.25
SLACK_MS = 0.5
STEPS = 6

#: per scenario: whether the step time is checked (and why not), what "fixed" means
CASES: dict[str, dict] = {
    "sync_point": {"timing": True},  # .item() costs ~nothing on a CPU: the check is "not worse"
    "extra_copy": {"timing": True},
    "single_tensor_optimizer": {"timing": True},
    "zero_grad_not_none": {"timing": True},
    "conv_bias_before_bn": {"timing": True},
    "memory_growth": {"timing": True},
    "fp32_matmul": {"timing": False, "fix_select": "cpu-autocast",
                    "why": "without native bf16 autocast's bf16 GEMMs are emulated, slower (so the fix is opt-in; a CPU with avx512_bf16/amx_bf16 unlocks it by default); speed depends on the CPU"},
    "dataloader_bound": {"timing": False, "gone": "workers",
                         "why": "the worker (DATALOADER_WORKERS: 1 on 2 cores) gains only on a core the training does not use; other jobs on this shared box often hold it"},
    "misaligned_gemm": {"timing": True},  # align-gemm-dims: 1001/999/63 -> 1008/1000/64
}

PLANTED = B.planted()


def test_every_planted_scenario_has_a_case():
    assert set(PLANTED) == set(CASES)


def _not_worse(src: Path, entry: dict, after: Path, tmp: Path) -> None:
    """after <= TOLERANCE x before + SLACK_MS on median step times of a before/after pair recorded
    back to back (``after`` was just recorded; a before run follows it). Load on a shared box
    drifts within seconds and only ever slows a run down, so on failure up to two more pairs are
    recorded (alternating the order) and the check passes if any pair does."""
    path = src / entry["file"]
    fixed = path.read_text()
    original = B.git(src, "show", f"HEAD:{entry['file']}").stdout
    pairs: list[tuple[float, float]] = []
    for attempt in range(3):
        if attempt:
            path.write_text(fixed)
            order = ("before", "after") if attempt % 2 else ("after", "before")
        else:
            order = ("before",)
        runs = {"after": B.median(B.step_ms(after))} if not attempt else {}
        for label in order:
            path.write_text(original if label == "before" else fixed)
            runs[label] = B.median(B.step_ms(B.record(src, entry["file"], tmp / f"{label}-timing-{attempt}", steps=STEPS)))
        pairs.append((runs["before"], runs["after"]))
        if runs["after"] <= TOLERANCE * runs["before"] + SLACK_MS:
            path.write_text(fixed)
            return
    path.write_text(fixed)
    shown = ", ".join(f"{b:.2f} -> {a:.2f}" for b, a in pairs)
    pytest.fail(f"step time worse than {TOLERANCE}x + {SLACK_MS} ms in every before/after pair (ms): {shown}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_fix_is_verified_on_a_new_recording(name, tmp_path):
    entry, case = PLANTED[name], CASES[name]
    pattern, program = entry["pattern"], entry["file"]
    src = B.workspace(tmp_path / "src")
    original = (src / program).read_text()

    # 1. record and analyse with --source: the planted finding and a patch for its file
    before = B.record(src, program, tmp_path / "before", steps=STEPS)
    fix_select = case.get("fix_select")
    if fix_select:  # an opt-in fix: the default patch leaves it out, unless the recording CPU runs bf16 natively
        _, default_patch = B.analyze_with_source(before, src, tmp_path / "analysis-default")
        in_default = default_patch is not None and "autocast" in default_patch.read_text()
        if cpu_facts().get("native_bf16"):  # the recording's capture facts unlock it (analyze_cli.FACT_UNLOCKS)
            assert in_default, f"{name}: this CPU runs bf16 natively ({cpu_facts()['bf16_flags']}): the fix belongs in the default patch"
        else:
            assert not in_default, f"{name}: opt-in fix in the default patch"
    analysis, patch = B.analyze_with_source(before, src, tmp_path / "analysis-before", fix_select)
    found = B.finding(analysis, pattern)
    assert found is not None, f"{name}: planted {pattern} not found in {[f.pattern for f in analysis.findings]}"

    assert patch is not None, f"{name}: analyze --source wrote no patch.diff"
    assert f"+++ b/{program}" in patch.read_text(), f"{name}: the patch does not touch {program}"

    # 2. the patch applies, and fixing the patched tree again changes nothing
    B.git(src, "apply", "--check", str(patch))
    B.git(src, "apply", str(patch))
    from zoomer_ar.fix.api import run_directory

    again = run_directory(src, select=B.patch_selection(analysis, fix_select), only=B.patch_files(analysis))
    assert again.diff() == "", f"{name}: the fix is not idempotent"
    patched = (src / program).read_text()
    assert patched != original

    # 3. the patched program records, and the planted finding is gone
    after = B.record(src, program, tmp_path / "after", steps=STEPS)
    after_analysis = B.analyze(after)
    left = B.finding(after_analysis, pattern)
    if case.get("gone", "gone") == "gone":
        assert left is None, f"{name}: {pattern} still reported after the fix: {left.title if left else ''}"
    elif usable_cpus() < 2:  # "workers" on one core: the patch's count is 0, the loader loads in the process
        assert "num_workers=DATALOADER_WORKERS" in patched and after_analysis.features.get("dataloader_workers") is not True
    else:  # "workers": the trace shows the loader's worker processes (the finding may stay, see CASES)
        assert left is None or after_analysis.features.get("dataloader_workers") is True, (
            f"{name}: {pattern} still reported and the DataLoader still loads in the training process"
        )

    # 4. step time not worse, measured with the planted pattern's fix alone
    if not case["timing"]:
        return
    planted_only = B.planted_fix(original, pattern)
    if planted_only != patched:
        (src / program).write_text(planted_only)
        after = B.record(src, program, tmp_path / "after-planted-only", steps=STEPS)
    _not_worse(src, entry, after, tmp_path)
