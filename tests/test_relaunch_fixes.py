"""Relaunch specs that run: the recorded command replayed whole, settings only in a form the
program takes, a retry after the patch went in, and a template (never a made-up command) when no
job.json recorded the job. Real traces, real git repositories, the real CLI."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path


from conftest import git_repo
from zoomer_ar.cli import main
from zoomer_ar.relaunch import RelaunchSpec, load_spec, render_spec
from zoomer_ar.relaunch.spec import TEMPLATE_SCRIPT, Command
from zoomer_ar.relaunch.workers import fitted_count, usable_cpus

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SCENARIOS = REPO / "training_data" / "scenarios"




def scenario_repo(tmp_path: Path) -> Path:
    shutil.copytree(SCENARIOS, tmp_path / "repo")
    return git_repo(tmp_path / "repo")


def recorded_trace(tmp_path: Path, example: Path, argv: list[str] | None) -> Path:
    """A copy of an example trace folder whose job.json records ``argv`` (None: no job.json)."""
    folder = tmp_path / "trace"
    shutil.copytree(example, folder)
    job = folder / "job.json"
    if argv is None:
        job.unlink()
    else:
        doc = json.loads(job.read_text())
        doc["argv"] = argv
        job.write_text(json.dumps(doc))
    return folder


def analyze(trace: Path, out: Path, source: Path | None, capsys) -> None:
    args = ["analyze", str(trace), "--out", str(out), "--no-progress"] + (["--source", str(source)] if source else [])
    assert main(args) == 0
    capsys.readouterr()


def relaunch_cli(spec: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    """`zoomer-ar relaunch` as a user runs it, with this interpreter first on PATH (as in an
    activated virtualenv) so the relaunched `python` has torch and zoomer_ar."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(spec), "--cwd", str(cwd), *extra],
                          env=env, capture_output=True, text=True, timeout=300)


def test_scenario_relaunch_runs_and_can_be_retried(tmp_path, capsys):
    """D2 (a)(b)(c): the recorded argv (its required --out included) is replayed without Hydra
    overrides the argparse program rejects; a second relaunch finds the patch applied and runs."""
    repo = scenario_repo(tmp_path)
    after = tmp_path / "after"
    argv = ["dataloader_bound.py", "--out", str(after), "--steps", "1", "--skip", "0", "--warmup", "0"]
    trace = recorded_trace(tmp_path, EXAMPLES / "traces" / "dataloader_bound", argv)
    analyze(trace, tmp_path / "o", repo, capsys)
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.argv() == ["python", *argv]
    assert spec.patch == "patch.diff" and spec.config_overrides == {}
    assert any("dataloader.num_workers=4" in n and "patch.diff carries the dataloader-bound fix" in n for n in spec.notes)

    first = relaunch_cli(tmp_path / "o" / "relaunch.yaml", repo)
    assert first.returncode == 0, first.stderr
    assert (after / "job.json").is_file()
    assert "num_workers=DATALOADER_WORKERS" in subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True).stdout

    # the retry records into the same --out: the capture helper keeps an earlier capture (it refuses
    # to write over one), so the user clears it first, as after any run they mean to replace
    shutil.rmtree(after)
    again = relaunch_cli(tmp_path / "o" / "relaunch.yaml", repo)
    assert again.returncode == 0, again.stderr
    assert "already applied" in again.stderr and (after / "job.json").is_file()


def test_relaunch_after_a_failed_launch_is_retried(tmp_path):
    """D2 (c) on its own: the first launch applies the patch and fails (the job's own error); the
    retry finds the patch applied, says so, and launches again instead of 'patch does not apply'."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "job.py").write_text("import sys\nWORKERS = 0\nsys.exit(0 if WORKERS == 4 and len(sys.argv) > 1 else 5)\n")
    git_repo(repo)
    (tmp_path / "patch.diff").write_text("--- a/job.py\n+++ b/job.py\n@@ -1,3 +1,3 @@\n import sys\n-WORKERS = 0\n"
                                         "+WORKERS = 4\n sys.exit(0 if WORKERS == 4 and len(sys.argv) > 1 else 5)\n")
    spec = RelaunchSpec(job="j", command=Command(script="job.py"), patch="patch.diff")
    (tmp_path / "relaunch.yaml").write_text(render_spec(spec))
    assert relaunch_cli(tmp_path / "relaunch.yaml", repo).returncode == 5  # patched, then the job failed
    spec.command.args = ["--go"]  # the user mends the command line and retries
    (tmp_path / "relaunch.yaml").write_text(render_spec(spec))
    again = relaunch_cli(tmp_path / "relaunch.yaml", repo)
    assert again.returncode == 0 and "already applied" in again.stderr, again.stderr


def test_patch_that_neither_applies_nor_is_applied_is_an_input_error(tmp_path, capsys):
    repo = scenario_repo(tmp_path)
    trace = recorded_trace(tmp_path, EXAMPLES / "traces" / "dataloader_bound", ["dataloader_bound.py", "--out", "x"])
    analyze(trace, tmp_path / "o", repo, capsys)
    target = repo / "dataloader_bound.py"
    target.write_text(target.read_text().replace("num_workers=0", "num_workers=1"))
    done = relaunch_cli(tmp_path / "o" / "relaunch.yaml", repo)
    assert done.returncode == 2 and "patch does not apply" in done.stderr


def test_gpu_example_command_is_the_recorded_one(tmp_path, capsys):
    """D2 (b) on examples/gpu/sync_point: no `compile=true compile_mode=...` after an argparse
    command line; the spec says they are not passable and why."""
    repo = scenario_repo(tmp_path)
    analyze(EXAMPLES / "gpu" / "sync_point", tmp_path / "o", repo, capsys)
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    # the recorded command; its --out (the folder of the capture analysed, recorded on another machine) is
    # pointed at a fresh sibling, unless /tmp/gpu is on this machine without that capture (the GPU machine)
    assert spec.command.script == "sync_point.py" and spec.command.args[0] == "--out"
    assert spec.command.args[2:] == ["--device", "cuda"]
    recorded_here = Path("/tmp/gpu").is_dir()
    assert spec.command.args[1] == "/tmp/gpu/sync_point" + ("" if recorded_here else "-relaunch")
    assert spec.override_style == "argparse"
    note = next(n for n in spec.notes if n.startswith("Not on the command line"))
    assert "compile=true" in note and "argparse" in note and "yourself" in note


ARGPARSE_PROGRAM = '''\
import argparse
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--num-workers", type=int, default=0)
parser.add_argument("--pin-memory", action="store_true")
args = parser.parse_args()
print("workers", args.num_workers)
'''


def test_argparse_option_that_exists_is_passed_as_that_option(tmp_path, capsys):
    """A setting the program's parser has an option for goes on the command line as that option;
    the program runs with it (a flag, whose spelling of `true` is the program's own, stays a note)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(ARGPARSE_PROGRAM)
    git_repo(src)
    trace = recorded_trace(tmp_path, EXAMPLES / "traces" / "dataloader_bound", ["train.py", "--out", "o2"])
    analyze(trace, tmp_path / "o", src, capsys)
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.override_style == "argparse" and spec.config_overrides == {"num-workers": 4}
    assert spec.argv() == ["python", "train.py", "--out", "o2", "--num-workers=4"]
    assert any("dataloader.pin_memory=true" in n for n in spec.notes)
    assert any("num-workers=4 is the most" in n for n in spec.notes)
    done = relaunch_cli(tmp_path / "o" / "relaunch.yaml", src)
    # the count the relaunch passes fits this machine: 4 on 5 usable CPUs or more, 1 on 2, none on 1
    fitted = fitted_count(4, usable_cpus())
    assert done.returncode == 0 and f"workers {fitted}" in done.stdout, done.stderr
    assert (fitted == 4) == ("fitted to this machine" not in done.stderr and "left out" not in done.stderr)


def test_hydra_program_gets_overrides_once(tmp_path, capsys):
    """A @hydra.main program (read, not imported: hydra need not be installed) takes key=value;
    a recorded override of the same key is replaced, since Hydra rejects a key given twice."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import hydra\n\n\n@hydra.main(config_path='conf', config_name='c', version_base=None)\n"
                                  "def main(cfg):\n    pass\n\n\nif __name__ == '__main__':\n    main()\n")
    git_repo(src)
    trace = recorded_trace(tmp_path, EXAMPLES / "traces" / "dataloader_bound",
                           ["train.py", "dataloader.num_workers=0", "lr=0.1"])
    analyze(trace, tmp_path / "o", src, capsys)
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.override_style == "hydra"
    assert spec.argv() == ["python", "train.py", "lr=0.1", "dataloader.num_workers=4",
                           "dataloader.persistent_workers=true", "dataloader.pin_memory=true"]


def test_no_job_json_is_a_template_not_a_command(tmp_path, capsys):
    """D2 (d): without job.json the script is a placeholder, the header says TEMPLATE, and
    relaunch refuses to run it (exit 2) while the dry run still shows it."""
    trace = recorded_trace(tmp_path, EXAMPLES / "traces" / "dataloader_bound", None)
    analyze(trace, tmp_path / "o", None, capsys)
    text = (tmp_path / "o" / "relaunch.yaml").read_text()
    assert "# Command:  TEMPLATE" in text and "train.py" not in text
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.is_template() and spec.command.script == TEMPLATE_SCRIPT and spec.notes[0].startswith("TEMPLATE")
    done = relaunch_cli(tmp_path / "o" / "relaunch.yaml", tmp_path)
    assert done.returncode == 2 and "template" in done.stderr and "Traceback" not in done.stderr
    dry = relaunch_cli(tmp_path / "o" / "relaunch.yaml", tmp_path, "--dry-run")
    assert dry.returncode == 0 and "template" in dry.stderr


def test_multi_rank_job_without_job_json_is_a_torchrun_template(shared_traces, tmp_path, capsys):
    analyze(shared_traces / "param" / "dlrm_8ranks", tmp_path / "o", None, capsys)
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.is_template() and spec.command.launcher == "torchrun" and spec.command.nproc_per_node == 8
    assert "TEMPLATE" in (tmp_path / "o" / "relaunch.yaml").read_text().splitlines()[2]


def _package_repo(tmp_path: Path) -> Path:
    """A git checkout whose job is a module of a package (``python -m pkg.train``): a relative
    import that only works so, and a marker file naming the interpreter and arguments it ran with."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "util.py").write_text("WHO = 'module'\n")
    (repo / "pkg" / "train.py").write_text(
        "import json\nimport sys\n\nfrom .util import WHO\n\n"
        "if __name__ == '__main__':\n"
        "    with open('ran.json', 'w') as f:\n"
        "        json.dump({'who': WHO, 'python': sys.executable, 'args': sys.argv[1:]}, f)\n"
    )
    return git_repo(repo)


def _recorded_module_trace(tmp_path: Path, repo: Path, python: str) -> Path:
    trace = recorded_trace(tmp_path, EXAMPLES / "traces" / "dataloader_bound", [str(repo / "pkg" / "train.py"), "--out", "o2"])
    doc = json.loads((trace / "job.json").read_text())
    doc |= {"executable": python, "module": "pkg.train"}
    (trace / "job.json").write_text(json.dumps(doc))
    return trace


def test_capture_records_the_module_a_job_was_started_as(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    probe = "from zoomer_ar.capture import _main_module\nprint(_main_module())\n"
    (tmp_path / "pkg" / "train.py").write_text(probe)
    (tmp_path / "pkg" / "__main__.py").write_text(probe)
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def run(*args: str) -> str:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert run("-m", "pkg.train") == "pkg.train"
    assert run("-m", "pkg") == "pkg"  # a package's __main__ is run as the package
    assert run("pkg/train.py") == "None"  # a script: argv[0] is all there is


def test_module_job_is_relaunched_as_a_module_on_its_own_interpreter(tmp_path, capsys):
    repo = _package_repo(tmp_path)
    trace = _recorded_module_trace(tmp_path, repo, sys.executable)
    analyze(trace, tmp_path / "out", None, capsys)
    spec = load_spec(tmp_path / "out" / "relaunch.yaml")
    assert spec.command.python == sys.executable and spec.command.module == "pkg.train"
    assert spec.argv()[:3] == [sys.executable, "-m", "pkg.train"]
    # PATH without this interpreter: the relaunch must not depend on which `python` PATH finds
    env = dict(os.environ, PATH="/usr/bin:/bin")
    done = subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(tmp_path / "out" / "relaunch.yaml"),
                           "--cwd", str(repo)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ran = json.loads((repo / "ran.json").read_text())
    assert ran["who"] == "module" and ran["python"] == sys.executable
    assert ran["args"][:2] == ["--out", "o2"]


def test_recorded_interpreter_missing_here_is_an_input_error(tmp_path, capsys):
    repo = _package_repo(tmp_path)
    trace = _recorded_module_trace(tmp_path, repo, "/nonexistent/envs/train/bin/python3")
    analyze(trace, tmp_path / "out", None, capsys)
    done = relaunch_cli(tmp_path / "out" / "relaunch.yaml", repo)
    assert done.returncode == 2
    assert "/nonexistent/envs/train/bin/python3 is not on this machine" in done.stderr
    assert "Traceback" not in done.stderr and not (repo / "ran.json").exists()


def test_torchrun_with_a_recorded_interpreter_and_module():
    spec = RelaunchSpec(job="j", command=Command(launcher="torchrun", python="/env/bin/python", module="pkg.train",
                                                 script="/src/pkg/train.py", args=["--lr", "1"], nproc_per_node=4))
    assert spec.argv() == ["/env/bin/python", "-m", "torch.distributed.run", "--nproc_per_node=4", "--module",
                           "pkg.train", "--lr", "1"]
    old = RelaunchSpec(job="j", command=Command(launcher="torchrun", script="train.py", nproc_per_node=2))
    assert old.argv() == ["torchrun", "--nproc_per_node=2", "train.py"]  # a spec without them: as before


def test_spec_that_is_not_utf8_is_an_input_error(tmp_path, capsys):
    """A relaunch.yaml in another encoding (or a binary file) was an internal error (UnicodeDecodeError,
    exit 1); it is bad input: one line naming the file, exit 2."""
    spec = tmp_path / "relaunch.yaml"
    spec.write_bytes(b"job: \xff\xfe\ncommand: {script: t.py}\n")
    assert main(["relaunch", str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert str(spec) in err and "not a readable YAML relaunch spec" in err and "internal error" not in err


def test_spec_with_an_unusable_environment_name_or_nul_byte_is_an_input_error(tmp_path):
    """env: {'A=B': ...}, an empty name, or a NUL byte in a value or a command-line word passed validation
    and broke at the launch (ValueError from subprocess: 'internal error', exit 1); now the spec is refused
    on load, one line naming the file, exit 2, and nothing runs."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "job.py").write_text("open('ran', 'w').close()\n")
    for body in ('env: {"A=B": "1"}', 'env: {"": "1"}', 'env: {"A": "1\\0x"}', 'command: {script: job.py, args: ["a\\0b"]}',
                 'config_overrides: {"k\\0": 1}'):
        spec = tmp_path / "relaunch.yaml"
        spec.write_text(f"job: j\n{body}\n" + ("" if body.startswith("command") else "command: {script: job.py}\n"))
        done = relaunch_cli(spec, repo)
        assert done.returncode == 2, (body, done.stderr)
        assert f"{spec}: invalid relaunch spec" in done.stderr and "internal error" not in done.stderr
        assert not (repo / "ran").exists()


def test_command_whose_program_is_not_on_path_is_refused_before_the_patch(tmp_path):
    """A spec with command.python null runs `python` (torchrun: `torchrun`) from PATH; where there is none
    (only python3, say) the patch was applied and then the launch failed as an internal error
    (FileNotFoundError, exit 1). Now it is refused first: one line naming the spec, exit 2, the checkout
    untouched."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "job.py").write_text("WORKERS = 0\n")
    git_repo(repo)
    (tmp_path / "patch.diff").write_text("--- a/job.py\n+++ b/job.py\n@@ -1 +1 @@\n-WORKERS = 0\n+WORKERS = 4\n")
    for launcher in ("python", "torchrun"):
        spec = RelaunchSpec(job="j", command=Command(launcher=launcher, script="job.py"), patch="patch.diff")
        (tmp_path / "relaunch.yaml").write_text(render_spec(spec))
        only_git = tmp_path / "bin"  # a PATH with git and nothing else
        if not only_git.exists():
            only_git.mkdir()
            (only_git / "git").symlink_to(shutil.which("git"))
        env = dict(os.environ, PATH=str(only_git))
        done = subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(tmp_path / "relaunch.yaml"),
                               "--cwd", str(repo)], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert f"relaunch.yaml: {launcher} (what the command starts) is not on PATH" in done.stderr
        assert (repo / "job.py").read_text() == "WORKERS = 0\n"


def test_dry_run_quotes_a_patch_path_with_spaces(tmp_path, capsys):
    """The dry run printed 'git apply /x/my run/patch.diff' unquoted: pasted into a shell it names two
    files; now the path is quoted as the command line's words are."""
    folder = tmp_path / "my run"
    folder.mkdir()
    spec = RelaunchSpec(job="j", command=Command(script="job.py"), patch="patch.diff")
    (folder / "relaunch.yaml").write_text(render_spec(spec))
    assert main(["relaunch", str(folder / "relaunch.yaml"), "--dry-run", "--cwd", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert shlex.split(first) == ["git", "apply", str((folder / "patch.diff").resolve())]
