"""The `zoomer-ar` command line.

Exit codes: 0 analysed (with or without findings), 2 no usable input, 1 internal error.
Sub-commands live next to the stage they drive; each module named in COMMANDS exposes `commands`: a list
of click commands/groups, imported when one of them runs.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import sys

import click

from . import __version__
from .errors import ZoomerError

# command name -> the module that defines it (its `commands` list). A module is imported only when one of its
# commands runs (or `--help` lists them all): `zoomer-ar analyze` does not import the service, the review bot or
# the trainer. tests/test_cli_lazy.py checks this table against the modules' own `commands`.
COMMANDS = {
    "analyze": "zoomer_ar.analyze_cli",
    "rules": "zoomer_ar.rules_cli",
    "fix": "zoomer_ar.fix.cli",
    "corpus": "zoomer_ar.learn.cli", "train": "zoomer_ar.learn.cli", "evaluate": "zoomer_ar.learn.cli",
    "models": "zoomer_ar.learn.cli", "label": "zoomer_ar.learn.cli",
    "review": "zoomer_ar.review.cli",
    "digest": "zoomer_ar.store.cli", "history": "zoomer_ar.store.cli", "record": "zoomer_ar.store.cli",
    "db": "zoomer_ar.store.cli",
    "serve": "zoomer_ar.service.cli", "worker": "zoomer_ar.service.cli", "token": "zoomer_ar.service.cli",
    "batch": "zoomer_ar.service.cli", "openapi": "zoomer_ar.service.cli",
    "trace": "zoomer_ar.surgery.cli",
    "relaunch": "zoomer_ar.relaunch.cli",
    "compare": "zoomer_ar.compare",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def _available(module: str) -> bool:
    """The module is part of this installation (a package left out of a slim install is not offered)."""
    return importlib.util.find_spec(module.rsplit(".", 1)[0]) is not None and importlib.util.find_spec(module) is not None


def _output_gone() -> bool:
    """Whether stdout (or stderr) is a pipe whose reader has gone (``zoomer-ar ... | head``):
    a broken pipe of the output, not of a socket the command talks to."""
    import select

    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            if any(events & select.POLLERR for _, events in poller.poll(0)):
                return True
        except (AttributeError, OSError, ValueError):
            continue
    return False


def _silence_output(stderr: bool = True) -> None:
    """Point stdout (and stderr) at /dev/null, so that the interpreter's last flush of the text the
    reader did not take does not fail again ('Exception ignored ... BrokenPipeError')."""
    import os

    for stream in (sys.stdout, sys.stderr) if stderr else (sys.stdout,):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (AttributeError, OSError, ValueError):
            continue


class LazyGroup(click.Group):
    """Commands imported on first use, from COMMANDS."""

    def invoke(self, ctx: click.Context):
        """A reader that goes away (``| head``) ends the command with exit 0; click itself would
        turn the broken pipe into a silent exit 1, the code of an internal error. A broken pipe
        that is not the output's (a socket) is an internal error, with its line."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            if _output_gone():
                _silence_output()
                raise click.exceptions.Exit(0) from None
            raise RuntimeError(f"broken pipe: {exc}") from exc

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """A mistyped command name (`anlyze`) names the closest commands, as click does for a group whose
        commands are loaded: these are imported on first use, so click's own list would be empty."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            no_such = getattr(click.exceptions, "NoSuchCommand", None)  # click 8.2+
            if no_such is None or not isinstance(exc, no_such):
                raise
            raise no_such(exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | {n for n, m in COMMANDS.items() if _available(m)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in COMMANDS and _available(COMMANDS[cmd_name]):
            module = importlib.import_module(COMMANDS[cmd_name])
            for command in getattr(module, "commands", []):
                if command.name not in self.commands:
                    self.add_command(command)
            found = super().get_command(ctx, cmd_name)
        return found


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from .load.fastcols import describe as describe_reader  # the loader only when asked

    click.echo(f"zoomer-ar, version {__version__}\nreader: {describe_reader()}")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and exit.")
def cli() -> None:
    """Zoomer AR: turn PyTorch profiler traces into ranked findings, patches and relaunch specs."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps errors to one-line messages and exit codes (never a traceback for bad input)."""
    try:
        rv = cli.main(args=argv, prog_name="zoomer-ar", standalone_mode=False)
    except ZoomerError as exc:
        click.echo(f"zoomer-ar: error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort as exc:  # click's form of Ctrl-C (and of an aborted prompt)
        click.echo("zoomer-ar: aborted", err=True)
        return 130 if isinstance(exc.__cause__, KeyboardInterrupt) else 1  # 128 + SIGINT, as shells say it
    except click.ClickException as exc:
        exc.show()
        return 2 if isinstance(exc, click.UsageError) else exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except OSError as exc:
        if not _output_failed(exc):
            return _internal_error(exc)
        _silence_output(stderr=False)  # the interpreter's last flush would fail again
        click.echo(f"zoomer-ar: error: cannot write the output: {exc.strerror or exc}", err=True)
        return 2
    except Exception as exc:  # internal error: one line, exit 1; ZOOMER_DEBUG=1 shows the traceback
        return _internal_error(exc)
    return rv if isinstance(rv, int) else 0


# a write that failed for want of room or of a working device, on a file object the command was given
# (its output stream: `> /dev/full`, a full disk); files the command opens itself say which (OutputError)
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _output_failed(exc: OSError) -> bool:
    return exc.errno in _OUTPUT_ERRNOS and exc.filename is None


def _internal_error(exc: Exception) -> int:
    """Internal error: one line, exit 1; ZOOMER_DEBUG=1 shows the traceback."""
    import os

    if os.environ.get("ZOOMER_DEBUG"):
        raise exc
    click.echo(f"zoomer-ar: internal error: {type(exc).__name__}: {exc}", err=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
