"""`zoomer-ar relaunch SPEC [--dry-run]`: print (or run) the command a relaunch spec describes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click

from ..errors import InputError
from .spec import load_spec


@click.command()
@click.argument("spec_path", type=click.Path(path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the exact command and patch step; run nothing.")
@click.option("--cwd", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where to apply the patch and run (default: the current folder).")
def relaunch(spec_path: Path, dry_run: bool, cwd: Path | None) -> None:
    """Relaunch the job with the spec's environment, launcher arguments and overrides."""
    spec = load_spec(spec_path)
    workdir = cwd or Path.cwd()
    patch = None
    if spec.patch:
        patch = Path(spec.patch)
        if not patch.is_absolute():
            patch = (spec_path.parent / patch).resolve()
    if dry_run:
        if patch:
            click.echo(f"git apply {patch}")
        click.echo(spec.shell_command())
        return
    if patch:
        check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=workdir, capture_output=True, text=True)
        if check.returncode != 0:
            raise InputError(str(patch), f"patch does not apply in {workdir}: {check.stderr.strip().splitlines()[0] if check.stderr.strip() else 'git apply --check failed'}")
        subprocess.run(["git", "apply", str(patch)], cwd=workdir, check=True)
    env = dict(os.environ, **spec.env)
    raise SystemExit(subprocess.run(spec.argv(), cwd=workdir, env=env).returncode)


commands = [relaunch]
