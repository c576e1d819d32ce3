"""The op-level rules on the project's own CPU traces: they fire on the planted programs and stay
quiet on the clean twins (examples/traces, recorded from training_data/scenarios)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zoomer_ar.analyze import analyze_path

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "training_data" / "scenarios" / "MANIFEST.yaml"
EXAMPLES = REPO / "examples" / "traces"


def _scenarios() -> list[tuple[str, dict]]:
    if not MANIFEST.is_file():
        return []
    doc = yaml.safe_load(MANIFEST.read_text())
    return sorted(doc["scenarios"].items())


SCENARIOS = _scenarios()


def test_every_scenario_has_a_bundled_trace():
    assert SCENARIOS, "MANIFEST.yaml missing or empty"
    missing = [name for name, _ in SCENARIOS if not (EXAMPLES / name).is_dir()]
    assert not missing, f"no recorded example trace for {missing}"


@pytest.mark.parametrize("name,entry", SCENARIOS, ids=[n for n, _ in SCENARIOS])
def test_planted_found_and_twins_quiet(name, entry):
    analysis = analyze_path(EXAMPLES / name)
    found = {f.pattern for f in analysis.findings}
    if entry["pattern"] != "clean":
        assert entry["pattern"] in found, f"{name}: planted {entry['pattern']} not found; found {sorted(found)}"
        finding = next(f for f in analysis.findings if f.pattern == entry["pattern"])
        assert finding.evidence.figures, "a finding carries its figures"
    wrong = found & set(entry.get("must_not_show", []))
    assert not wrong, f"{name}: must not show {sorted(wrong)}"
