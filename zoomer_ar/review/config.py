"""``[tool.zoomer-ar]`` in the reviewed repository's ``pyproject.toml`` (read at HEAD).

    [tool.zoomer-ar]
    select = ["sync-point", "dataloader-bound"]   # pattern ids or fixer names (default: all)
    ignore = ["torch-compile"]
    exclude = ["tests/", "legacy/*.py"]             # paths not reviewed (globs; "dir/" = the folder)
    fail-on = "high"                                # CI gate (the --fail-on flag wins)
    max-inline-comments = 20                        # per --post run
    severity = { "sync-point" = "critical", "optimizer-foreach" = "low" }
    options = { "dataloader-bound" = { num_workers = 8 } }   # fixer options

Other keys in the table belong to other stages and are left alone. A key here with a value of
the wrong type is an error naming the key (exit status 2).
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..models import PATTERN_IDS, SEVERITY_ORDER

DEFAULT_MAX_INLINE = 25
FAIL_ON_CHOICES = ("none", *sorted(SEVERITY_ORDER, key=SEVERITY_ORDER.__getitem__))


@dataclass
class ReviewConfig:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    severity: dict[str, str] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    fail_on: str | None = None
    max_inline_comments: int | None = None
    source: str | None = None  # where it was read from

    def excluded(self, path: str) -> bool:
        return any(_match(path, pat) for pat in self.exclude)


def _match(path: str, pattern: str) -> bool:
    pattern = pattern.strip()
    if pattern.startswith("./"):
        pattern = pattern[2:]
    if not pattern:
        return False
    if pattern.endswith("/"):
        folder = pattern.rstrip("/")
        return path == folder or path.startswith(folder + "/") or ("/" not in folder and f"/{folder}/" in f"/{path}")
    if fnmatch.fnmatchcase(path, pattern):
        return True
    if "/" not in pattern:  # a bare name or glob matches any path component (like .gitignore)
        parts = path.split("/")
        return any(fnmatch.fnmatchcase(p, pattern) for p in parts)
    return path.startswith(pattern.rstrip("/") + "/")


def _ids(where: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [v for v in value.split(",")]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(where, "expected a list of pattern ids or fixer names")
    return [v.strip().lower() for v in value if v.strip()]


def _known_ids() -> set[str]:
    from ..fix.registry import load_registry

    return set(PATTERN_IDS) | set(load_registry().names) | {"all"}


def parse(table: dict[str, Any], source: str = "pyproject.toml") -> ReviewConfig:
    """A ReviewConfig from the ``[tool.zoomer-ar]`` table (validated)."""
    cfg = ReviewConfig(source=source)
    where = f"{source} [tool.zoomer-ar]"
    known = _known_ids()
    for key in ("select", "ignore"):
        if key in table:
            ids = _ids(f"{where} {key}", table[key])
            bad = [i for i in ids if i not in known]
            if bad:
                raise InputError(f"{where} {key}", f"unknown pattern id or fixer name(s): {', '.join(bad)}")
            setattr(cfg, key, ids)
    if "exclude" in table:
        ex = table["exclude"]
        if isinstance(ex, str):
            ex = [ex]
        if not isinstance(ex, list) or not all(isinstance(v, str) for v in ex):
            raise InputError(f"{where} exclude", "expected a list of path globs")
        cfg.exclude = [e for e in ex if e.strip()]
    if "severity" in table:
        sev = table["severity"]
        if not isinstance(sev, dict):
            raise InputError(f"{where} severity", "expected a table of id = severity")
        for k, v in sev.items():
            kid = str(k).strip().lower()
            if kid not in known - {"all"}:
                raise InputError(f"{where} severity", f"unknown pattern id or fixer name: {k!r}")
            if not isinstance(v, str) or v.strip().lower() not in SEVERITY_ORDER:
                raise InputError(f"{where} severity.{k}", f"expected one of {', '.join(FAIL_ON_CHOICES[1:])}, got {v!r}")
            cfg.severity[kid] = v.strip().lower()
    if "options" in table:
        opts = table["options"]
        if not isinstance(opts, dict) or not all(isinstance(v, dict) for v in opts.values()):
            raise InputError(f"{where} options", "expected a table of id = { option = value }")
        cfg.options = {str(k).strip().lower(): dict(v) for k, v in opts.items()}
    fail_on = table.get("fail-on", table.get("fail_on"))
    if fail_on is not None:
        if not isinstance(fail_on, str) or fail_on.strip().lower() not in FAIL_ON_CHOICES:
            raise InputError(f"{where} fail-on", f"expected one of {', '.join(FAIL_ON_CHOICES)}, got {fail_on!r}")
        cfg.fail_on = fail_on.strip().lower()
    cap = table.get("max-inline-comments", table.get("max_inline_comments"))
    if cap is not None:
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
            raise InputError(f"{where} max-inline-comments", f"expected a non-negative integer, got {cap!r}")
        cfg.max_inline_comments = cap
    return cfg


def load_text(text: str | None, source: str = "pyproject.toml") -> ReviewConfig:
    """The config from a pyproject.toml's text (an empty config when there is none)."""
    if text is None:
        return ReviewConfig()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, f"invalid TOML: {exc}") from None
    tool = doc.get("tool", {})
    table = tool.get("zoomer-ar", tool.get("zoomer_ar")) if isinstance(tool, dict) else None
    if table is None:
        return ReviewConfig(source=source)
    if not isinstance(table, dict):
        raise InputError(source, "[tool.zoomer-ar] must be a table")
    return parse(table, source)
