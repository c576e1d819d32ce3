"""The recorded run's trace folder on the replayed command line: a program that takes its trace
folder as an argument (positional, --out=VALUE, relative or absolute) records the relaunch into a
fresh sibling folder, never over the capture the spec was made from; a spec that still names it is
refused before anything changes. A real program under the real capture helper (torch, CPU), the
real analyze and the real `zoomer-ar relaunch`."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import git_repo
from zoomer_ar.cli import main
from zoomer_ar.relaunch import RelaunchSpec, load_spec, render_spec

#: a small training program that records with zoomer_ar.capture into the folder its command line names
PROGRAM = '''
import argparse
import torch
from torch import nn
from zoomer_ar.capture import SteadyStateProfiler

parser = argparse.ArgumentParser()
parser.add_argument("trace_dir", nargs="?")
parser.add_argument("--out")
parser.add_argument("--tag", default="")
args = parser.parse_args()
torch.manual_seed(0)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with SteadyStateProfiler(args.out or args.trace_dir, skip_first=1, warmup=1, active=2) as prof:
    while not prof.done:
        loss = nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
print("recorded", args.out or args.trace_dir, args.tag)
'''


def _env() -> dict[str, str]:
    """This interpreter first on PATH (an activated virtualenv): its python has torch and zoomer_ar."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def project(root: Path) -> Path:
    """A git checkout holding the program (what a user's repository is)."""
    proj = root / "proj"
    proj.mkdir(parents=True)
    (proj / "train.py").write_text(PROGRAM)
    return git_repo(proj)


def record(proj: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "train.py", *args], cwd=proj, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def analyze(trace: Path, out: Path, source: Path, capsys) -> RelaunchSpec:
    assert main(["analyze", str(trace), "--out", str(out), "--source", str(source), "--no-progress"]) == 0
    capsys.readouterr()
    return load_spec(out / "relaunch.yaml")


def relaunch(spec: Path, *extra: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(spec), *extra], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=300)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def positional(tmp_path_factory) -> Path:
    """`python train.py traces/before` recorded in a checkout: the trace folder a positional argument."""
    proj = project(tmp_path_factory.mktemp("positional"))
    record(proj, "traces/before")
    return proj


def test_positional_trace_folder_is_relaunched_into_a_fresh_sibling(positional, tmp_path, capsys, monkeypatch):
    proj = positional
    before = digest(proj / "traces" / "before")
    monkeypatch.chdir(proj)  # analysed in place, by the relative path the user types
    spec = analyze(Path("traces/before"), tmp_path / "o", proj, capsys)
    assert spec.command.args == ["traces/before-relaunch"]
    note = next(n for n in spec.notes if n.startswith("Records into a new folder"))
    assert "traces/before -> traces/before-relaunch" in note
    assert "zoomer-ar compare traces/before traces/before-relaunch" in note

    done = relaunch(tmp_path / "o" / "relaunch.yaml")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CaptureError" not in done.stderr
    assert (proj / "traces" / "before-relaunch" / "job.json").is_file()
    assert digest(proj / "traces" / "before") == before  # the capture the spec was made from, untouched
    assert main(["compare", "traces/before", "traces/before-relaunch"]) == 0


def test_option_value_absolute_path_is_retargeted_too(tmp_path, capsys):
    """--out=/abs/path/run1 (one word, absolute): the same folder, so the same fresh sibling."""
    proj = project(tmp_path)
    out = tmp_path / "runs" / "run1"
    record(proj, f"--out={out}", "--tag", "a b é")
    spec = analyze(out, tmp_path / "o", proj, capsys)
    assert spec.command.args == [f"--out={tmp_path / 'runs' / 'run1-relaunch'}", "--tag", "a b é"]
    assert not any(n.startswith("The command is the recorded one") for n in spec.notes)  # not 'writes where it wrote'
    done = relaunch(tmp_path / "o" / "relaunch.yaml")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "recorded" in done.stdout and "a b é" in done.stdout
    assert (tmp_path / "runs" / "run1-relaunch" / "job.json").is_file()


def test_a_taken_sibling_is_not_reused(positional, tmp_path, capsys, monkeypatch):
    """traces/before-relaunch holds an earlier relaunch's capture: the spec takes -relaunch-2."""
    proj = positional
    taken = proj / "traces" / "before-relaunch"
    taken.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(proj)
    spec = analyze(proj / "traces" / "before", tmp_path / "o", proj, capsys)  # absolute this time
    assert spec.command.args == ["traces/before-relaunch-2"]


def test_spec_naming_its_own_capture_is_refused_before_the_patch(positional, tmp_path, capsys):
    """A spec that still replays the recorded folder (an older zoomer-ar's, or edited back): one line,
    exit 2, before the patch goes in; the dry run says so and still prints the command."""
    proj = positional
    trace = proj / "traces" / "before"
    out = tmp_path / "o"
    analyze(trace, out, proj, capsys)
    job = json.loads((trace / "job.json").read_text())
    spec = load_spec(out / "relaunch.yaml")
    spec.command.args = job["argv"][1:]  # as recorded: `train.py traces/before`
    (out / "patch.diff").write_text("--- a/train.py\n+++ b/train.py\n@@ -1,2 +1,3 @@\n \n+# patched\n"
                                    " import argparse\n")
    spec.patch = "patch.diff"
    (out / "relaunch.yaml").write_text(render_spec(spec))
    before = digest(trace)

    done = relaunch(out / "relaunch.yaml")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "the capture this spec was made from" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "CaptureError" in lines[0]
    assert subprocess.run(["git", "diff", "--stat"], cwd=proj, capture_output=True, text=True).stdout == ""
    assert digest(trace) == before

    dry = relaunch(out / "relaunch.yaml", "--dry-run")
    assert dry.returncode == 0 and "train.py traces/before" in dry.stdout
    assert "the capture this spec was made from" in dry.stderr


def test_analysed_on_another_machine_the_folder_is_matched_by_name(positional, tmp_path, capsys):
    """The capture copied off the machine it ran on (its recorded cwd is not here): the word naming a
    folder of the capture's name is pointed at the sibling, and --cwd runs it in the moved checkout."""
    proj = positional
    moved = tmp_path / "moved-checkout"
    shutil.copytree(proj, moved, ignore=shutil.ignore_patterns("traces"))
    copy = tmp_path / "downloads" / "before"
    shutil.copytree(proj / "traces" / "before", copy)
    job = json.loads((copy / "job.json").read_text())
    job["cwd"] = "/nonexistent/cluster/home/proj"  # where it ran: not on this machine
    (copy / "job.json").write_text(json.dumps(job))
    spec = analyze(copy, tmp_path / "o", moved, capsys)
    assert spec.command.args == ["traces/before-relaunch"]
    done = relaunch(tmp_path / "o" / "relaunch.yaml", "--cwd", str(moved))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (moved / "traces" / "before-relaunch" / "job.json").is_file()


def test_folder_with_a_space_gives_a_compare_command_that_runs(tmp_path, capsys, monkeypatch):
    proj = project(tmp_path)
    record(proj, "traces/run 1")
    monkeypatch.chdir(proj)
    spec = analyze(Path("traces/run 1"), tmp_path / "o", proj, capsys)
    assert spec.command.args == ["traces/run 1-relaunch"]
    done = relaunch(tmp_path / "o" / "relaunch.yaml")
    assert done.returncode == 0, done.stderr[-2000:]
    note = next(n for n in spec.notes if n.startswith("Records into a new folder"))
    compare = shlex.split(note.split("Afterwards: ", 1)[1])
    assert compare == ["zoomer-ar", "compare", "traces/run 1", "traces/run 1-relaunch"]
    assert main(compare[1:]) == 0


ROOTED = PROGRAM.replace("SteadyStateProfiler(args.out or args.trace_dir,",
                         "SteadyStateProfiler(f'{args.out or args.trace_dir}/profile',")


def test_an_output_root_holding_the_capture_gets_a_note(tmp_path, capsys):
    """--out runs/exp1 where the program records into runs/exp1/profile: the word is not the trace folder
    (it is left as recorded), but the spec says the replay meets the capture there."""
    proj = project(tmp_path)
    (proj / "train.py").write_text(ROOTED)
    record(proj, "--out", "runs/exp1")
    spec = analyze(proj / "runs" / "exp1" / "profile", tmp_path / "o", proj, capsys)
    assert spec.command.args == ["--out", "runs/exp1"]
    note = next(n for n in spec.notes if n.startswith("runs/exp1 on the command line holds"))
    assert "CaptureError" in note and str((proj / "runs" / "exp1" / "profile").resolve()) in note


def test_a_job_json_nested_too_deep_is_no_run_of_ours(tmp_path):
    """A folder named on the command line whose job.json is nested deeper than json reads (a hostile or
    broken file) is not the capture's folder: the match said RecursionError (analyze: internal error)."""
    from zoomer_ar.relaunch.trace_folder import _names_folder

    trace, other = tmp_path / "traces" / "before", tmp_path / "data"
    trace.mkdir(parents=True)
    other.mkdir()
    (other / "job.json").write_text("[" * 100_000 + "]" * 100_000)
    assert _names_folder("data", trace, tmp_path, identity=("run", 1)) is False
