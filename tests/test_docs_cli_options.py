"""README.md and docs/*.md against the commands themselves: every option a documented command line
gives a command is one of that command's options, and every option a command's --help lists is
named somewhere in the docs."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from zoomer_ar.cli import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# options a doc does not name yet, excused by command (none now: docs/learning.md names the retraining
# commands' options); an option listed here is only excused, never required to stay undocumented
LEARNING_GAPS: dict[str, set[str]] = {}


def _commands() -> dict[str, set[str]]:
    """'analyze', 'trace slice'... -> the command's visible option names (hidden ones left out)."""
    found: dict[str, set[str]] = {}

    def walk(command: click.Command, path: list[str], parent: click.Context | None) -> None:
        ctx = click.Context(command, info_name=path[-1] if path else "zoomer-ar", parent=parent)
        found[" ".join(path)] = {name for p in command.params if isinstance(p, click.Option) and not p.hidden
                                 for name in (*p.opts, *p.secondary_opts)}
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    walk(sub, [*path, name], ctx)

    walk(cli, [], None)
    return found


COMMANDS = _commands()
TEXT = {doc.relative_to(REPO).as_posix(): doc.read_text(encoding="utf-8") for doc in DOCS}


def _command_lines() -> list[tuple[str, str, str]]:
    """(doc, command, the rest of the line) for each `zoomer-ar CMD ...` in a code span or code block."""
    out = []
    for doc, text in TEXT.items():
        spans = re.findall(r"```.*?```", text, re.S) + re.findall(r"`[^`\n]+`", text)
        for span in spans:
            for line in span.splitlines():
                for m in re.finditer(r"zoomer-ar\s+([a-z][\w-]*)(?:\s+([a-z][\w-]*))?(.*)", line):
                    first, second, rest = m.group(1), m.group(2), m.group(3)
                    if f"{first} {second}" in COMMANDS:
                        command = f"{first} {second}"
                    elif first in COMMANDS:
                        command, rest = first, f" {second or ''}{rest}"
                    else:
                        out.append((doc, first, line))  # no such command: reported by the test
                        continue
                    out.append((doc, command, re.split(r"zoomer-ar\s", rest)[0]))
    return out


def test_the_docs_show_command_lines():
    assert len(_command_lines()) > 50  # the extraction found the docs' examples


@pytest.mark.parametrize("doc, command, rest", _command_lines())
def test_a_documented_command_line_uses_the_commands_own_options(doc, command, rest):
    assert command in COMMANDS, f"{doc}: `zoomer-ar {command}` is no command: {rest.strip()}"
    unknown = [o for o in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", rest)
               if o not in COMMANDS[command] and o not in ("-h", "--help")]
    assert not unknown, f"{doc}: `zoomer-ar {command}` has no option {', '.join(unknown)} ({rest.strip()})"


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if c))
def test_every_option_of_a_command_is_named_in_the_docs(command):
    everything = "\n".join(TEXT.values())
    missing = sorted(o for o in COMMANDS[command] - LEARNING_GAPS.get(command, set())
                     if o not in ("-h", "--help") and not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", everything))
    assert not missing, f"`zoomer-ar {command} --help` lists {', '.join(missing)}, which no doc names"
