"""Relaunch specs: schema, construction from an analysis, rendering, and the relaunch command."""

from .render import render_spec
from .spec import RelaunchSpec, json_schema, load_spec, spec_from_analysis

__all__ = ["RelaunchSpec", "json_schema", "load_spec", "render_spec", "spec_from_analysis"]
