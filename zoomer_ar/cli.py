"""The `zoomer-ar` command line.

Exit codes: 0 analysed (with or without findings), 2 no usable input, 1 internal error.
Sub-commands live next to the stage they drive; each module named in COMMAND_MODULES exposes
`commands`: a list of click commands/groups to register.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from . import __version__
from .errors import ZoomerError
from .load.fastcols import describe as describe_reader

COMMAND_MODULES = (
    "zoomer_ar.analyze_cli",
    "zoomer_ar.detect.cli",
    "zoomer_ar.fix.cli",
    "zoomer_ar.learn.cli",
    "zoomer_ar.review.cli",
    "zoomer_ar.store.cli",
    "zoomer_ar.service.cli",
    "zoomer_ar.surgery.cli",
    "zoomer_ar.relaunch.cli",
    "zoomer_ar.compare",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="zoomer-ar",
                      message="%(prog)s, version %(version)s\nreader: " + describe_reader())
def cli() -> None:
    """Zoomer AR: turn PyTorch profiler traces into ranked findings, patches and relaunch specs."""


def _register() -> None:
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is None:
            continue
        if importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        for command in getattr(module, "commands", []):
            cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps errors to one-line messages and exit codes (never a traceback for bad input)."""
    try:
        rv = cli.main(args=argv, prog_name="zoomer-ar", standalone_mode=False)
    except ZoomerError as exc:
        click.echo(f"zoomer-ar: error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("zoomer-ar: aborted", err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return 2 if isinstance(exc, click.UsageError) else exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # internal error: one line, exit 1; ZOOMER_DEBUG=1 shows the traceback
        import os

        if os.environ.get("ZOOMER_DEBUG"):
            raise
        click.echo(f"zoomer-ar: internal error: {type(exc).__name__}: {exc}", err=True)
        return 1
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
