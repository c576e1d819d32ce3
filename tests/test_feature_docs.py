"""docs/features.md is generated from FeatureVector and must be up to date."""

from __future__ import annotations

import subprocess
import sys

from zoomer_ar.features import FEATURE_SCHEMA_VERSION, FeatureVector
from zoomer_ar.features.docs import grouped_fields, main, render

from conftest import REPO

DOC = REPO / "docs" / "features.md"
REGENERATE = "python -m zoomer_ar.features.docs > docs/features.md"


def test_features_md_is_up_to_date():
    assert DOC.is_file(), f"docs/features.md missing: run `{REGENERATE}`"
    assert DOC.read_text(encoding="utf-8") == render(), f"docs/features.md is out of date: run `{REGENERATE}`"


def test_every_field_documented_with_group_and_unit_key():
    text = render()
    assert f"**{FEATURE_SCHEMA_VERSION}**" in text
    for name, field in FeatureVector.model_fields.items():
        assert f"| `{name}` |" in text, f"{name} not in the docs"
        assert field.description, f"{name} has no definition"
        extra = field.json_schema_extra
        assert isinstance(extra, dict) and extra.get("group"), f"{name} has no group"
        assert "unit" in extra, f"{name} declares no unit (use '' for unitless)"
    assert sum(len(v) for v in grouped_fields().values()) == len(FeatureVector.model_fields)


def test_groups_in_model_order_and_each_field_once():
    text = render()
    headings = [line for line in text.splitlines() if line.startswith("## ") and line != "## Groups"]
    assert len(headings) == len(grouped_fields())
    for name in FeatureVector.model_fields:
        assert text.count(f"| `{name}` |") == 1


def test_module_entry_point_prints_and_checks(tmp_path):
    out = subprocess.run([sys.executable, "-m", "zoomer_ar.features.docs"], capture_output=True, text=True, check=True)
    assert out.stdout == render()
    stale = tmp_path / "features.md"
    stale.write_text("old\n")
    assert main(["--check", str(stale)]) == 1
    stale.write_text(render())
    assert main(["--check", str(stale)]) == 0
