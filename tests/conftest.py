"""Shared test fixtures: the real-trace corpus in ../shared/traces and its labels."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
EXAMPLES = REPO / "examples"


def shared_available() -> bool:
    return (SHARED_TRACES / "LABELS.yaml").is_file()


def load_labels() -> dict:
    if not shared_available():
        return {}
    return yaml.safe_load((SHARED_TRACES / "LABELS.yaml").read_text())


def all_trace_files() -> list[Path]:
    if not shared_available():
        return []
    return sorted(
        p for p in SHARED_TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz", ".gz"))
    )


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not shared_available():
        if os.environ.get("CI"):
            pytest.fail(f"the real-trace corpus is missing at {SHARED_TRACES}")
        pytest.skip(f"real-trace corpus not found at {SHARED_TRACES}")
    return SHARED_TRACES
