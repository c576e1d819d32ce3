"""relaunch.yaml rendered from its Jinja template (reports/relaunch.yaml.j2)."""

from __future__ import annotations

import json

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..paths import REPORTS_DIR
from .spec import RelaunchSpec


def header_command(spec: RelaunchSpec) -> str:
    """The command the header shows: a template says so first, so nobody copies it as runnable."""
    if spec.is_template():
        return f"TEMPLATE, fill in command.script and command.args (see notes): {spec.shell_command()}"
    return spec.shell_command()


def render_spec(spec: RelaunchSpec) -> str:
    env = Environment(loader=FileSystemLoader(str(REPORTS_DIR)), undefined=StrictUndefined, keep_trailing_newline=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["j"] = lambda v: json.dumps(v)
    return env.get_template("relaunch.yaml.j2").render(s=spec, command=header_command(spec))
