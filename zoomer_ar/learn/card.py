"""The model card: reports/model_card.md.j2 rendered from a version's meta.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..models import PATTERN_IDS
from ..paths import REPORTS_DIR


def _f(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def render_card(meta: dict[str, Any]) -> str:
    env = Environment(loader=FileSystemLoader(str(REPORTS_DIR)), undefined=StrictUndefined, trim_blocks=True,
                      lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["f"] = _f
    held = meta.get("held_out") or {"per_label": {}, "macro_f1": {}}
    rows = []
    for p in PATTERN_IDS:
        m = held["per_label"].get(p)
        info = meta["labels"].get(p)
        rows.append({"pattern": p, "m": m, "info": info, "skipped": meta.get("skipped_labels", {}).get(p)})
    return env.get_template("model_card.md.j2").render(meta=meta, rows=rows, macro=held.get("macro_f1", {}),
                                                        real=meta.get("real"), promotion=meta.get("promotion"))


def write_card(version_dir: Path) -> Path:
    meta = json.loads((version_dir / "meta.json").read_text())
    out = version_dir / "model_card.md"
    out.write_text(render_card(meta))
    return out
