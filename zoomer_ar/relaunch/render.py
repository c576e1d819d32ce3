"""relaunch.yaml rendered from its Jinja template (reports/relaunch.yaml.j2)."""

from __future__ import annotations

import json
import re
import unicodedata
from functools import lru_cache
from typing import Any

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..paths import REPORTS_DIR
from .spec import RelaunchSpec


#: a UTF-16 surrogate pair as json.dumps escapes a character past U+FFFF, not itself escaped (an even run of
#: backslashes before it)
_PAIR = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})")


def yaml_value(value: Any) -> str:
    """``value`` as a YAML flow value that reads back equal: JSON (ASCII, escaped), with what YAML reads
    otherwise than JSON written its own way: a character past U+FFFF as ``\\UXXXXXXXX`` (YAML reads JSON's
    surrogate pair as two lone surrogates, which no command line can carry) and DEL as ``\\u007f`` (YAML
    refuses it raw)."""
    def one(m: re.Match) -> str:
        code = 0x10000 + ((int(m[2], 16) - 0xD800) << 10) + (int(m[3], 16) - 0xDC00)
        return f"{m[1]}\\U{code:08x}"

    return _PAIR.sub(one, json.dumps(value)).replace("\x7f", "\\u007f")


def _comment_line(text: str) -> str:
    """``text`` as one line of a YAML comment: a line break or control character (which would end the comment,
    turning the rest into YAML, or which YAML refuses) written as an escape."""
    def escape(ch: str) -> str:
        if ch in "\n\r\x85\u2028\u2029\ufeff" or unicodedata.category(ch) in ("Cc", "Cs"):
            return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
        return ch

    return "".join(escape(ch) for ch in text)


def header_command(spec: RelaunchSpec) -> str:
    """The command the header shows, in the folder it runs in; a template says so first, so nobody
    copies it as runnable. A command holding a line break or control character is shown escaped (one
    comment line), and says so: the dry run prints it as it runs."""
    command = spec.shell_command(in_cwd=True)
    shown = _comment_line(command)
    if shown != command:
        shown += "   (escaped: a word holds a line break or control character; the dry run prints the command)"
    if spec.is_template():
        return f"TEMPLATE, fill in command.script and command.args (see notes): {shown}"
    return shown


def _with_cwd(text: str, spec: RelaunchSpec) -> str:
    """``cwd`` (schema 1.2) written after ``job:`` when the template does not write it itself."""
    try:
        written = "cwd" in (yaml.safe_load(text) or {})
    except yaml.YAMLError:  # pragma: no cover - the template writes JSON-quoted values
        written = False
    if written:
        return text
    lines = text.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("job:")), None)
    if at is None:  # pragma: no cover - every spec has a job
        return text
    lines.insert(at + 1, f"cwd: {yaml_value(spec.cwd)}")
    return "\n".join(lines)


@lru_cache(maxsize=1)
def _env() -> Environment:
    """One environment per process (it keeps the compiled template), as render.report's."""
    env = Environment(loader=FileSystemLoader(str(REPORTS_DIR)), undefined=StrictUndefined, keep_trailing_newline=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["j"] = yaml_value
    env.filters["comment"] = _comment_line
    return env


def render_spec(spec: RelaunchSpec) -> str:
    return _with_cwd(_env().get_template("relaunch.yaml.j2").render(s=spec, command=header_command(spec)), spec)
