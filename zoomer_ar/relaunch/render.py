"""relaunch.yaml rendered from its Jinja template (reports/relaunch.yaml.j2)."""

from __future__ import annotations

import json
from functools import lru_cache

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..paths import REPORTS_DIR
from .spec import RelaunchSpec


def header_command(spec: RelaunchSpec) -> str:
    """The command the header shows, in the folder it runs in; a template says so first, so nobody
    copies it as runnable."""
    if spec.is_template():
        return f"TEMPLATE, fill in command.script and command.args (see notes): {spec.shell_command(in_cwd=True)}"
    return spec.shell_command(in_cwd=True)


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
    lines.insert(at + 1, f"cwd: {json.dumps(spec.cwd)}")
    return "\n".join(lines)


@lru_cache(maxsize=1)
def _env() -> Environment:
    """One environment per process (it keeps the compiled template), as render.report's."""
    env = Environment(loader=FileSystemLoader(str(REPORTS_DIR)), undefined=StrictUndefined, keep_trailing_newline=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["j"] = json.dumps
    return env


def render_spec(spec: RelaunchSpec) -> str:
    return _with_cwd(_env().get_template("relaunch.yaml.j2").render(s=spec, command=header_command(spec)), spec)
