"""Placeholder until source mapping lands: leaves the analysis unchanged."""

from __future__ import annotations

from pathlib import Path

from .models import Analysis


def map_sources(analysis: Analysis, source_dir: Path) -> Analysis:
    return analysis
