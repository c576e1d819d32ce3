"""Review stage: the pre-merge bot. The fixers' static detectors on the lines a change adds.

    from zoomer_ar.review import review
    result = review("path/to/repo", base="origin/main", head="HEAD")
    for f in result.findings:
        print(f.path, f.line, f.rule_id, f.severity, f.suggestion)

Outputs: ``render.render_markdown`` (reports/review_comment.md.j2), ``sarif.to_sarif`` (SARIF
2.1.0), ``render.github_payload`` (a GitHub review), ``github.post`` (posting to a pull request).
See docs/review.md.
"""

from __future__ import annotations

from .engine import fail_count, review
from .models import Evidence, FileNote, ReviewFinding, ReviewResult

__all__ = ["Evidence", "FileNote", "ReviewFinding", "ReviewResult", "fail_count", "review"]
