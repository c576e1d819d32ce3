"""Review output: the Markdown comment (reports/review_comment.md.j2), plain text and the GitHub
review payload (summary body plus inline comments with path, line and side)."""

from __future__ import annotations

import re
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..paths import REPORTS_DIR
from .catalogue import SEVERITIES
from .models import ReviewFinding, ReviewResult
from .safe_text import quoted_path, readable
from .suggest import fence

TEMPLATE = "review_comment.md.j2"
SUMMARY_MARKER = "<!-- zoomer-ar:review-summary -->"
SHORT_SHA = 12  # the commit ids the summary shows, base and head alike
GITHUB_BODY_LIMIT = 65_000  # GitHub rejects comment bodies over 65,536 characters
ICONS = {"critical": "🟥", "high": "🔴", "medium": "🟠", "low": "🟡", "info": "⚪"}
_MARK_RE = re.compile(r"<!-- zoomer-ar:finding rule=(?P<rule>[\w.-]+) fp=(?P<fp>[0-9a-f]+:\d+) -->")


def inline_marker(f: ReviewFinding) -> str:
    return f"<!-- zoomer-ar:finding rule={f.rule_id} fp={f.fingerprint} -->"


def parse_inline_marker(body: str) -> tuple[str, str] | None:
    """(rule, fingerprint) of a comment this tool posted, else None."""
    m = _MARK_RE.search(body or "")
    return (m.group("rule"), m.group("fp")) if m else None


def parse_markers(body: str) -> list[tuple[str, str]]:
    """(rule, fingerprint) of every finding marked in a body: a review body that lists findings
    GitHub refused as inline comments carries one marker per finding."""
    return [(m.group("rule"), m.group("fp")) for m in _MARK_RE.finditer(body or "")]


def short_sha(sha: str | None) -> str:
    return (sha or "")[:SHORT_SHA]


def _cell(text: Any) -> str:
    s = " ".join(str(text).split())
    return s.replace("|", "\\|")


_ENV: Environment | None = None


def _env() -> Environment:
    global _ENV
    if _ENV is None:
        env = Environment(
            loader=FileSystemLoader(str(REPORTS_DIR)),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            autoescape=False,
        )
        env.filters["fence"] = fence
        env.filters["cell"] = _cell
        env.filters["short_sha"] = short_sha
        _ENV = env
    return _ENV


def _context(result: ReviewResult, *, shown: list[ReviewFinding], details: bool, not_inline: int = 0,
             not_inline_reason: str = "") -> dict[str, Any]:
    counts = result.counts()
    return {
        "r": result,
        "marker": SUMMARY_MARKER,
        "findings": result.findings,
        "shown": shown,
        "hidden": len(result.findings) - len(shown),
        "details": details,
        "counts": [(s, counts[s]) for s in reversed(SEVERITIES) if counts.get(s)],
        "files_with_findings": len({f.path for f in result.findings}),
        "icons": ICONS,
        "not_inline": not_inline,
        "not_inline_reason": not_inline_reason,
    }


def render_markdown(result: ReviewResult, *, not_inline: int = 0, not_inline_reason: str = "",
                    limit: int = GITHUB_BODY_LIMIT) -> str:
    """The summary comment; shortened (details dropped, then table rows) to fit ``limit``."""
    tpl = _env().get_template(TEMPLATE)
    kw = {"not_inline": not_inline, "not_inline_reason": not_inline_reason}
    text = tpl.render(**_context(result, shown=list(result.findings), details=True, **kw))
    if len(text) <= limit:
        return text
    text = tpl.render(**_context(result, shown=list(result.findings), details=False, **kw))
    n = len(result.findings)
    while len(text) > limit and n > 0:
        n = n // 2 if len(text) > 2 * limit else int(n * 0.9)
        text = tpl.render(**_context(result, shown=list(result.findings[:n]), details=False, **kw))
    return text[:limit]


def render_inline(f: ReviewFinding) -> str:
    module = _env().get_template(TEMPLATE).module  # the macros (the summary renders only with `r`)
    return str(module.inline(f, inline_marker(f))).strip() + "\n"  # type: ignore[attr-defined]


def render_text(result: ReviewResult) -> str:
    """One line per finding (``path:line:col: severity rule message``), then errors; a path with a line break,
    a quote, a backslash or a byte that is not UTF-8 is quoted as git quotes it (safe_text.quoted_path)."""
    out = []
    for f in result.findings:
        tag = " [suggestion]" if f.suggestion is not None else ""
        out.append(f"{quoted_path(f.path)}:{f.line}:{f.column}: {f.severity} {f.rule_id} {readable(f.message)} [{f.fixer}]{tag}")
        for e in f.evidence:
            out.append(f"    {e.source}: {readable(e.text)}")
    for e in result.errors:
        where = f"{quoted_path(e.path)}:{e.line}:{e.column}" if e.line else quoted_path(e.path)
        out.append(f"{where}: error: {readable(e.message)}")
    for s in result.skipped:
        out.append(f"{quoted_path(s.path)}: skipped: {readable(s.message)}")
    n = len(result.findings)
    out.append(f"{n} finding{'s' if n != 1 else ''} on changed lines in {_changed_files(result)}"
               + (f"; {len(result.errors)} could not be analysed" if result.errors else ""))
    return "\n".join(out) + "\n"


def _changed_files(result: ReviewResult) -> str:
    """"1 changed Python file", "2 changed Python files and 1 notebook", "1 changed notebook"."""
    books = result.notebooks_changed
    py = result.files_changed - books
    parts = ([f"{py} changed Python file{'s' if py != 1 else ''}"] if py or not books else []) + \
            ([f"{books} notebook{'s' if books != 1 else ''}" if py else f"{books} changed notebook{'s' if books != 1 else ''}"]
             if books else [])
    return " and ".join(parts)


def inline_comment(f: ReviewFinding) -> dict[str, Any]:
    """One entry of a review's ``comments``: path, line, side (and start_line for a range)."""
    c: dict[str, Any] = {"path": f.path, "line": f.comment_line, "side": "RIGHT", "body": render_inline(f)}
    if f.comment_start_line is not None and f.comment_start_line < (f.comment_line or 0):
        c["start_line"] = f.comment_start_line
        c["start_side"] = "RIGHT"
    return c


def github_payload(result: ReviewResult, *, max_comments: int | None = None) -> dict[str, Any]:
    """The review as GitHub's "create a review" body: summary plus inline comments."""
    inline = [f for f in result.findings if f.comment_line is not None]
    capped = inline if max_comments is None else inline[:max_comments]
    left = len(result.findings) - len(capped)
    reason = "no line of theirs is in the diff's hunks, or the inline-comment cap was reached" if left else ""
    payload: dict[str, Any] = {
        "event": "COMMENT",
        "body": render_markdown(result, not_inline=left, not_inline_reason=reason),
        "comments": [inline_comment(f) for f in capped],
    }
    if result.head_sha:
        payload = {"commit_id": result.head_sha, **payload}
    return payload
