"""SARIF 2.1.0 for GitHub code scanning.

* ``ruleId``: the pattern id (``sync-point``, ``dataloader-bound``...), the same ids as the rule
  catalogue, the trace findings and ``# zoomer: ignore[ID]``; the fixer is a result property.
* ``partialFingerprints["zoomerAr/v1"]``: a hash of the rule, fixer, file and the flagged code
  (whitespace-normalised) plus its occurrence number in the file; no line numbers, so an alert
  keeps its identity when code above it moves. GitHub's upload action adds its own
  ``primaryLocationLineHash`` next to it.
* ``fixes``: the fixer's rewrite as replacements (deleted region, inserted text).
* Files that could not be analysed are ``toolExecutionNotifications`` of the invocation.
* ``artifactLocation.uri``: the repository path as an RFC 3986 relative reference (``/`` kept,
  everything else outside the unreserved characters percent-encoded), against ``%SRCROOT%``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from .. import __version__
from ..fix.registry import load_registry
from . import catalogue
from .models import ReviewFinding, ReviewResult

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
FINGERPRINT_KEY = "zoomerAr/v1"
SRCROOT = "%SRCROOT%"


def _camel(rule_id: str) -> str:
    return "".join(p.capitalize() for p in rule_id.split("-"))


def _rule(pattern: str) -> dict[str, Any]:
    reg = load_registry()
    fixers = reg.by_pattern(pattern)
    lines = [f"- `{f.name}`: {f.summary}" for f in fixers]
    rec = catalogue.recommendation(pattern)
    markdown = "\n\n".join(x for x in [catalogue.summary(pattern), rec, "Fixers:\n" + "\n".join(lines) if lines else ""] if x)
    text = " ".join(x for x in [catalogue.summary(pattern), rec] if x) or catalogue.title(pattern)
    sev = catalogue.DEFAULT_SEVERITY.get(pattern, "low")
    return {
        "id": pattern,
        "name": _camel(pattern),
        "shortDescription": {"text": catalogue.title(pattern)},
        "fullDescription": {"text": catalogue.summary(pattern) or catalogue.title(pattern)},
        "help": {"text": text, "markdown": markdown or text},
        "defaultConfiguration": {"level": catalogue.SARIF_LEVEL[sev]},
        "properties": {"tags": ["performance", "pytorch"], "precision": "high", "zoomerSeverity": sev},
    }


def _region(line: int, column: int, end_line: int, end_column: int) -> dict[str, int]:
    region = {"startLine": max(1, line), "startColumn": max(1, column)}
    if end_line >= line:
        region["endLine"] = end_line
        if end_line > line or end_column > column:
            region["endColumn"] = max(1, end_column)
    return region


def uri(path: str) -> str:
    """A repository path as a relative URI reference (RFC 3986, as SARIF requires): each byte
    outside the unreserved characters percent-encoded (UTF-8), the ``/`` separators kept."""
    return quote(path.encode("utf-8", "surrogateescape"), safe="/")


def _artifact(path: str) -> dict[str, str]:
    return {"uri": uri(path), "uriBaseId": SRCROOT}


def _location(path: str, region: dict[str, int]) -> dict[str, Any]:
    return {"physicalLocation": {"artifactLocation": _artifact(path), "region": region}}


def _result(f: ReviewFinding, index: int, edits: list[dict[str, Any]]) -> dict[str, Any]:
    text = f.message
    if f.evidence:
        text += " " + " ".join(f"[{e.source}] {e.text}." for e in f.evidence)
    res: dict[str, Any] = {
        "ruleId": f.rule_id,
        "ruleIndex": index,
        "level": catalogue.SARIF_LEVEL[f.severity],
        "message": {"text": text},
        "locations": [_location(f.path, _region(f.line, f.column, f.end_line, f.end_column))],
        "partialFingerprints": {FINGERPRINT_KEY: f.fingerprint},
        "properties": {
            "severity": f.severity,
            "fixer": f.fixer,
            "title": f.title,
            "fixable": f.fixable,
            "evidence": [e.model_dump() for e in f.evidence],
        },
    }
    if f.cell is not None:  # a notebook: the region is the .ipynb's JSON line; this names the cell
        res["properties"]["cell"] = f.cell
        res["properties"]["cellLine"] = f.cell_line
    if edits:
        res["fixes"] = [{
            "description": {"text": f"{f.fixer}: apply the rewrite"},
            "artifactChanges": [{
                "artifactLocation": _artifact(f.path),
                "replacements": [
                    {"deletedRegion": _region(e["line"], e["column"], e["end_line"], e["end_column"]),
                     "insertedContent": {"text": e["text"]}}
                    for e in edits
                ],
            }],
        }]
    return res


def to_sarif(result: ReviewResult) -> dict[str, Any]:
    """The SARIF log of a review."""
    patterns = sorted(set(result.rules) | {f.rule_id for f in result.findings})
    index = {p: i for i, p in enumerate(patterns)}
    notifications = []
    for e in result.errors:
        region = {"startLine": e.line, **({"startColumn": e.column} if e.column else {})} if e.line else None
        loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": _artifact(e.path)}}
        if region:
            loc["physicalLocation"]["region"] = region
        notifications.append({"level": "warning", "message": {"text": f"{e.path}: {e.message} (not reviewed)"}, "locations": [loc]})
    for s in result.skipped:
        notifications.append({
            "level": "note",
            "message": {"text": f"{s.path}: skipped: {s.message}"},
            "locations": [{"physicalLocation": {"artifactLocation": _artifact(s.path)}}],
        })
    run: dict[str, Any] = {
        "tool": {"driver": {
            "name": "zoomer-ar",
            "semanticVersion": __version__,
            "version": __version__,
            "rules": [_rule(p) for p in patterns],
        }},
        "automationDetails": {"id": "zoomer-ar/review/"},
        "columnKind": "unicodeCodePoints",
        "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": notifications}],
        "results": [_result(f, index[f.rule_id], f.edits if f.fixable else []) for f in result.findings],
    }
    if result.head_sha:
        run["properties"] = {"baseSha": result.base_sha, "headSha": result.head_sha, "mergeBaseSha": result.merge_base_sha}
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}
