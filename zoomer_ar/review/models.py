"""What a review produces: findings on changed lines, with suggestions, evidence and fingerprints."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Evidence(BaseModel):
    """Measured cost of the pattern: from a trace of this code or from the store."""

    source: str  # "trace" | "store"
    text: str
    data: dict[str, Any] = Field(default_factory=dict)


class ReviewFinding(BaseModel):
    rule_id: str  # the pattern id (rules/<id>.yaml)
    fixer: str
    title: str
    severity: str
    message: str
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    statement_line: int
    #: a notebook's finding: the cell (1-based, markdown cells counted) and the line in it; ``line``
    #: and ``column`` are then those of the .ipynb file's JSON text, where GitHub and SARIF point
    cell: int | None = None
    cell_line: int | None = None
    snippet: str = ""  # the flagged code's first line
    fixable: bool = False
    opt_in: bool = False
    fingerprint: str = ""
    #: where an inline comment goes (None: no line of this finding is in the diff's hunks)
    comment_line: int | None = None
    comment_start_line: int | None = None  # multi-line comment (a suggestion spanning lines)
    suggestion: str | None = None  # body of a ```suggestion block (replaces the commented lines)
    #: other findings whose fixes this suggestion applies too (their rewrites touch the same lines,
    #: or they would not parse apart): rule_id, fixer, line
    also_fixes: list[dict[str, Any]] = Field(default_factory=list)
    #: the line of the comment whose suggestion applies this finding's fix (None: its own, or none)
    fixed_by_suggestion_on: int | None = None
    fix_diff: str = ""  # the fixer's rewrite as a unified diff (all its edits)
    edits: list[dict[str, Any]] = Field(default_factory=list)  # the rewrite's text edits (fix.base.TextEdit)
    evidence: list[Evidence] = Field(default_factory=list)

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"


class FileNote(BaseModel):
    path: str
    message: str
    line: int | None = None
    column: int | None = None


class ReviewResult(BaseModel):
    repo: str
    base: str
    base_sha: str
    head: str | None
    head_sha: str | None  # None: the working tree
    merge_base_sha: str
    files_changed: int = 0  # changed Python files and notebooks in the diff
    notebooks_changed: int = 0  # of those, notebooks (.ipynb)
    files_reviewed: int = 0  # of those, read and checked (after exclusions and prefiltering)
    files_parsed: int = 0  # parsed by the fixers (the rest could not hold a finding)
    findings: list[ReviewFinding] = Field(default_factory=list)
    errors: list[FileNote] = Field(default_factory=list)  # files that could not be analysed
    skipped: list[FileNote] = Field(default_factory=list)  # binary, too large, excluded
    notes: list[str] = Field(default_factory=list)
    rules: list[str] = Field(default_factory=list)  # pattern ids the selected fixers cover
    config_source: str | None = None
    config_fail_on: str | None = None  # [tool.zoomer-ar] fail-on
    config_max_inline: int | None = None  # [tool.zoomer-ar] max-inline-comments
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.findings:
            out[f.severity] = out.get(f.severity, 0) + 1
        return out
