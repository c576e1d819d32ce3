"""``zoomer-ar fix DIR``: list static findings, print a patch (--diff) or apply it (--apply)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import InputError


#: trees of fewer files finish before a bar is worth drawing
PROGRESS_MIN_FILES = 50


@contextlib.contextmanager
def _progress_bar():
    """A transient files-done bar on stderr, when stderr is a terminal and the tree is large; yields
    the engine's progress callback (None: no bar)."""
    from rich.console import Console

    console = Console(file=sys.stderr)
    if not console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]fixing[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True)
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if total < PROGRESS_MIN_FILES:
            return
        if task is None:
            bar.start()
            task = bar.add_task("files", total=total)
        bar.update(task, completed=done)

    try:
        yield update
    finally:
        bar.stop()


def _parse_options(values: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for raw in values:
        key, eq, value = raw.partition("=")
        target, dot, name = key.strip().partition(".")
        if not eq or not dot or not target or not name:
            raise InputError(None, f"--option {raw!r}: expected FIXER_OR_PATTERN.KEY=VALUE, e.g. dataloader-bound.num_workers=8")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        out.setdefault(target.strip().lower(), {})[name.strip()] = parsed
    return out


def _echo_bytes(data: bytes) -> None:
    out = sys.stdout
    out.flush()
    buffer = getattr(out, "buffer", None)
    if buffer is None:
        out.write(data.decode("utf-8", "replace"))
        out.flush()
        return
    buffer.write(data)
    buffer.flush()


def _list_fixers(fmt: str) -> None:
    from .registry import load_registry

    reg = load_registry()
    if fmt == "json":
        from .api import fixers

        click.echo(json.dumps(fixers(reg), indent=2))
        return
    for f in reg.fixers:
        tag = " (opt-in)" if f.opt_in else ""
        click.echo(f"{f.name:24} {f.pattern:24} {f.summary}{tag}")


@click.command("fix")
@click.argument("path_arg", metavar="[PATH]", required=False, type=click.Path())
@click.option("--select", help="Comma-separated fixer names or pattern ids to run (default: all). Opt-in fixers rewrite only when selected here.")
@click.option("--ignore", help="Comma-separated fixer names or pattern ids to skip.")
@click.option("--diff", "show_diff", is_flag=True,
              help="Print a unified diff (git apply / patch -p1) instead of the findings. Paths: for a folder, relative "
                   "to it (apply inside it); for a file, relative to the current directory (apply here), or to its git "
                   "work tree's top when the file lies outside the current directory.")
@click.option("--apply", "do_apply", is_flag=True, help="Rewrite the files in place.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--option", "-o", "opts", multiple=True, metavar="ID.KEY=VALUE", help="Fixer option, e.g. dataloader-bound.num_workers=8 (repeatable).")
@click.option("--list", "list_fixers", is_flag=True, help="List the fixers and exit.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Worker processes reading the files (default: the CPU count; trees under 32 files are read in "
                   "this process). The output does not depend on it.")
def fix(path_arg: str | None, select: str | None, ignore: str | None, show_diff: bool, do_apply: bool, fmt: str, opts: tuple[str, ...], list_fixers: bool,
        jobs: int | None) -> int:
    """Find performance anti-patterns in the Python files and notebooks (.ipynb) under PATH (a
    folder or a file) and fix them with codemods.

    Without --diff/--apply the findings are listed, one a line: `path:line:col: pattern message
    [fixer, fixable|opt-in|report only]`, then a count on stderr. Inline `# zoomer: ignore[ID]`
    comments suppress a finding. Files that do not parse are reported
    and skipped. Exit status 0 (with or without findings), 2 for a missing PATH or bad options,
    1 when --apply could not write a file.
    """
    from . import engine  # libcst loads here, not when the CLI starts

    if list_fixers:
        _list_fixers(fmt)
        return 0
    if path_arg is None:
        raise InputError(None, "missing PATH: the folder (or file) to analyse")
    if path_arg == "":  # an unset variable ("$SRC"): not the current folder, which --apply would rewrite
        raise InputError(None, "PATH is empty: name the folder (or file) to analyse ('.' for the current one)")
    path = Path(path_arg)
    if show_diff and do_apply:
        raise InputError(None, "--diff and --apply are exclusive")
    options = _parse_options(opts)
    with _progress_bar() as progress:
        result = engine.run(path, select=select, ignore=ignore, options=options, fix=show_diff or do_apply,
                            jobs=jobs or os.cpu_count() or 1, progress=progress)
    written = engine.apply(result) if do_apply else []

    def shown(p: str) -> str:
        """A file's name in the text output, quoted as git quotes it when it holds a newline or
        another control character: each finding and message stays one line."""
        base = path if path.is_dir() else path.parent
        name = str(base / p) if str(base) not in ("", ".") else p
        return engine.git_quote(name) if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name) else name

    if fmt == "json":
        doc: dict[str, Any] = {
            "root": str(path),
            "fixers": result.selection.names,
            "fixing": sorted(result.selection.fixing),
            "files": len(result.files),
            "findings": [m.model_dump() for m in result.findings],
            "errors": result.errors,
        }
        if show_diff:
            doc["diff"] = result.diff()
        if do_apply:
            doc["changed"] = [f.path for f in written]
        click.echo(json.dumps(doc, indent=2))
    else:
        for f in result.files:
            if f.error:
                what = "left out" if f.left_out else "skipped"  # a notebook's cells, or the whole file
                click.echo(f"zoomer-ar: {what} {f.error_line(shown(f.path))}", err=True)
        if show_diff:
            _echo_bytes(result.diff_bytes())
        elif do_apply:
            for f in written:
                n = sum(1 for m in f.findings if m.fixable)
                click.echo(f"fixed {shown(f.path)} ({n} finding{'s' * (n != 1)})")
        else:
            for m in result.findings:
                click.echo(m.model_copy(update={"path": shown(m.path)}).format())
        n = len(result.findings)
        fixable = sum(1 for m in result.findings if m.fixable)
        summary = f"{n} finding{'s' * (n != 1)} ({fixable} fixable) in {len(result.files)} file{'s' * (len(result.files) != 1)}"
        if result.skipped:
            summary += f"; {len(result.skipped)} skipped"
        cells = sum(f.left_out for f in result.files)
        if cells:
            summary += f"; {cells} notebook cell{'s' * (cells != 1)} left out"
        if do_apply:
            summary += f"; {len(written)} file{'s' * (len(written) != 1)} rewritten"
        click.echo(summary, err=True)
    if do_apply and len(written) < len(result.changed):
        return 1  # a fixed file could not be written (reported above)
    return 0


commands = [fix]
