"""`zoomer-ar relaunch SPEC [--dry-run]`: print (or run) the command a relaunch spec describes."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import click

from ..errors import InputError
from .spec import RelaunchSpec, load_spec
from .trace_folder import FoundCapture, captures_on_command_line, is_dir, is_file
from .workers import fit_overrides, usable_cpus


def _git_apply_check(patch: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "apply", "--check", *extra, str(patch)], cwd=workdir, capture_output=True, text=True)


def apply_patch(patch: Path, workdir: Path) -> bool:
    """Apply ``patch`` in ``workdir``; False when it is already applied (its reverse applies), so a
    launch that failed or was stopped can be retried. A patch that neither applies nor is applied
    is an input error."""
    check = _git_apply_check(patch, workdir)
    if check.returncode != 0:
        if _git_apply_check(patch, workdir, "--reverse").returncode == 0:
            return False
        first = check.stderr.strip().splitlines()[0] if check.stderr.strip() else "git apply --check failed"
        raise InputError(str(patch), f"patch does not apply in {workdir}: {first}")
    subprocess.run(["git", "apply", str(patch)], cwd=workdir, check=True)
    return True


def _launchable(program: str, workdir: Path, env: dict[str, str]) -> bool:
    """``program`` can be started as the command's first word: a path (taken from ``workdir``, where the
    command starts, when relative) to an executable file, or a name on the PATH the command runs with."""
    if os.sep in program:
        path = Path(program) if os.path.isabs(program) else workdir / program
        return is_file(path) and os.access(path, os.X_OK)
    return shutil.which(program, path=env.get("PATH", os.defpath)) is not None


def _absolute(p: Path) -> Path:
    try:
        return p.resolve()
    except OSError:  # pragma: no cover
        return p.absolute()


def run_job(argv: list[str], workdir: Path, env: dict[str, str], spec_path: Path) -> int:
    """Start the job and wait for it to end; its exit status as a shell gives it (128 + N when signal N ended
    it, with a line saying so). Ctrl-C reaches the job itself (it runs in the terminal's process group):
    relaunch keeps waiting while the job stops (saves, exports its trace) instead of killing it. A SIGTERM
    relaunch gets is passed on to the job, which would otherwise run on, orphaned, holding its devices."""
    try:
        proc = subprocess.Popen(argv, cwd=workdir, env=env)
    except OSError as exc:
        raise InputError(str(spec_path), f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    try:  # SIGTERM to relaunch alone (`kill PID`, a scheduler that knows only this process) stops the job too
        earlier = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    except ValueError:  # not the main thread: nothing to forward from
        earlier = None
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:
                continue
    finally:
        if earlier is not None:
            signal.signal(signal.SIGTERM, earlier)
    if rc >= 0:
        return rc
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    click.echo(f"zoomer-ar: the job was stopped by {name}", err=True)
    return 128 - rc


def _capture_line(found: FoundCapture) -> str:
    """What a folder holding a capture on the command line means for the relaunch."""
    shown = ", ".join(found.files[:3])
    if found.own:
        return (f"{found.word} on the command line is the folder holding the capture this spec was made from "
                f"({shown}): the relaunch would record over it (zoomer_ar.capture stops with CaptureError, or with "
                "overwrite=True replaces the trace `zoomer-ar compare` needs); point it at a new folder in "
                "command.args")
    return (f"{found.word} on the command line already holds a capture ({shown}): a program recording there with "
            "zoomer_ar.capture stops with CaptureError unless it passes overwrite=True; move that capture or "
            "point command.args at a new folder")


def _captures(spec: RelaunchSpec, workdir: Path) -> list[FoundCapture]:
    return captures_on_command_line(spec.argv()[1:], workdir, spec.trace_sha256) if is_dir(workdir) else []


def _from_spec_folder(path: str, spec_path: Path) -> Path:
    """A path the spec gives (its patch, its cwd), taken from the spec's folder when relative: the spec means
    the same folder wherever relaunch is started from."""
    p = Path(path)
    return p if p.is_absolute() else _absolute(spec_path.parent / p)


def _refusals(spec: RelaunchSpec, spec_path: Path, workdir: Path, patch: Path | None, recorded_missing: bool,
              env: dict[str, str]) -> list[str]:
    """Why the spec cannot be run here, in the order the real run checks (it stops at the first; the dry
    run says them all)."""
    if spec.is_template():
        return ["a template, not a runnable command: no recorded command stands behind it (its first note says "
                f"why); fill in command.script (now {spec.command.script}) and command.args"]
    if recorded_missing:
        return [f"the folder the job ran in ({spec.cwd}, the spec's cwd) is not on this machine: pass --cwd with the "
                "checkout to apply the patch in and run from (or set cwd in the spec)"]
    out = []
    if patch and not is_file(patch):  # not 'patch does not apply ... can't open patch'
        out.append(f"the spec's patch {spec.patch} is not there ({patch}: a patch path is taken from the spec's "
                   "folder)")
    if patch and is_file(patch) and shutil.which("git") is None:
        out.append(f"the patch is applied with `git apply`, and git is not on PATH: install git, or apply {patch} "
                   "yourself and set patch to null in the spec")
    interpreter, first = spec.command.python, spec.argv()[0]
    if interpreter and not _launchable(interpreter, workdir, env):
        fallback = "torchrun" if spec.command.launcher == "torchrun" else "python"
        out.append(f"the recorded interpreter {interpreter} is not on this machine: set command.python to the one "
                   f"to run the job on (or null for `{fallback}` on PATH)")
    elif not _launchable(first, workdir, env):
        out.append(f"{first} (what the command starts) is not on PATH: set command.python to the interpreter to run "
                   "the job on")
    return out


def fit_to_machine(spec: RelaunchSpec, cpus: int | None = None) -> tuple[RelaunchSpec, str | None]:
    """The spec with its DataLoader worker counts fitted to this machine (``cpus``: its usable CPUs, by
    default this process's), and a line saying what changed (workers.fit_overrides)."""
    c = spec.command
    processes = c.nproc_per_node if c.launcher == "torchrun" and c.nproc_per_node else 1
    overrides, line = fit_overrides(dict(spec.config_overrides), cpus if cpus is not None else usable_cpus(), processes)
    return (spec.model_copy(update={"config_overrides": overrides}) if line else spec), line


def _patch_state(patch: Path, workdir: Path) -> str | None:
    """The dry run's word on the patch: already applied in ``workdir``, or not applying there (None: it applies)."""
    if _git_apply_check(patch, workdir).returncode == 0:
        return None
    if _git_apply_check(patch, workdir, "--reverse").returncode == 0:
        return f"{patch.name} is already applied in {workdir}: a real run launches without applying it"
    return f"a real run stops here: {patch.name} does not apply in {workdir} (git apply --check)"


@click.command()
@click.argument("spec_path", type=click.Path(path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the exact command and patch step; run nothing.")
@click.option("--cwd", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Where to apply the patch and run (default: the spec's cwd, the folder the recorded job ran "
                   "in; a spec without one: the current folder).")
def relaunch(spec_path: Path, dry_run: bool, cwd: Path | None) -> None:
    """Relaunch the job with the spec's environment, launcher arguments and overrides.

    The patch is applied and the command started in --cwd, else in the spec's `cwd` (where the
    recorded job ran), else in the current folder. The dry run prints the steps: `cd FOLDER`
    (on stderr, when that folder is not the current one), then `git apply PATCH` and the command
    on stdout."""
    spec, fitted = fit_to_machine(load_spec(spec_path))
    if fitted:
        click.echo(f"note: {fitted}", err=True)
    workdir = cwd or (_from_spec_folder(spec.cwd, spec_path) if spec.cwd else Path.cwd())
    recorded_missing = cwd is None and spec.cwd is not None and not is_dir(workdir)
    patch = None
    if spec.patch:
        patch = _from_spec_folder(spec.patch, spec_path)
    env = dict(os.environ, **spec.env)
    refusals = _refusals(spec, spec_path, workdir, patch, recorded_missing, env)
    if dry_run:  # what the real run would refuse is said, not left to be found by running it
        for reason in refusals:
            click.echo(f"note: a real run stops here: {reason}", err=True)
        if not refusals and patch:
            patch_note = _patch_state(patch, workdir)
            if patch_note:
                click.echo(f"note: {patch_note}", err=True)
        for found in _captures(spec, workdir):
            click.echo(f"note: {_capture_line(found)}", err=True)
        if _absolute(workdir) != Path.cwd().resolve():
            click.echo(f"cd {shlex.quote(str(workdir))}", err=True)
        if patch:
            click.echo(f"git apply {shlex.quote(str(patch))}")
        click.echo(spec.shell_command())
        return
    if refusals:
        raise InputError(str(spec_path), refusals[0])
    argv = spec.argv()
    for found in _captures(spec, workdir):  # before the patch: a refused relaunch changes nothing
        if found.own:
            raise InputError(str(spec_path), _capture_line(found))
        click.echo(f"note: {_capture_line(found)}", err=True)
    if patch and not apply_patch(patch, workdir):
        click.echo(f"{patch.name} is already applied in {workdir}; launching", err=True)
    raise SystemExit(run_job(argv, workdir, env, spec_path))


commands = [relaunch]
