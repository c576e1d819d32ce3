"""Units of the review: hunk parsing, touched spans, suggestions from text edits, exclusions,
severities and the comment template."""

from __future__ import annotations

import pytest

from zoomer_ar.fix.base import TextEdit
from zoomer_ar.models import PATTERN_IDS
from zoomer_ar.review import catalogue
from zoomer_ar.review.config import ReviewConfig, load_text
from zoomer_ar.review.diff import FileDiff, parse_patch
from zoomer_ar.review.models import ReviewFinding, ReviewResult
from zoomer_ar.review.render import parse_inline_marker, render_inline, render_markdown
from zoomer_ar.review.suggest import fence, rewrite, split_lines


def _fd(patch: str) -> FileDiff:
    fd = FileDiff("x.py")
    parse_patch(patch.encode(), fd)
    return fd


def test_parse_patch_added_modified_deleted_and_hunks():
    fd = _fd("@@ -1,3 +1,4 @@\n a\n-b\n+B\n c\n+d\n@@ -20,4 +21,3 @@ def f():\n x\n-y\n z\n w\n")
    assert fd.added == {2, 4}
    assert fd.hunks == [(1, 4), (21, 23)]
    assert 21 in fd.deletions and 1 in fd.deletions  # the gaps after new lines 21 and 1
    assert fd.in_one_hunk(1, 4) and not fd.in_one_hunk(4, 21) and fd.hunk_of(10) is None


def test_parse_patch_new_file_empty_side_and_no_newline_marker():
    fd = _fd("@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\n")
    assert fd.added == {1, 2} and fd.hunks == [(1, 2)]
    gone = _fd("@@ -1,2 +0,0 @@\n-a\n-b\n")
    assert gone.added == set() and gone.hunks == [] and gone.deletions == {0}
    assert _fd("Binary files a/x.py and b/x.py differ\n").binary


def test_touches_spans_and_blocks():
    fd = FileDiff("x.py", added={10}, deletions={20})
    assert fd.touches(8, 12) and fd.touches(10, 10) and not fd.touches(11, 19)
    assert fd.touches(18, 25) and not fd.touches(21, 25)
    assert not fd.touches(15, 20) and fd.touches(15, 20, block=True)  # a deletion after a loop's last line
    assert not fd.touches(20, 20, block=True)  # one-line statements are never "enclosing"


def test_rewrite_whole_lines_from_edits():
    src = "a = 1\nloader = DataLoader(ds)\nb = 2\n"
    lines = split_lines(src)
    rw = rewrite(lines, [TextEdit(line=2, column=10, end_line=2, end_column=24, text="DataLoader(ds, num_workers=4)")])
    assert (rw.first, rw.last, rw.suggestion) == (2, 2, "loader = DataLoader(ds, num_workers=4)")
    stmt = rewrite(lines, [TextEdit(line=2, column=1, end_line=3, end_column=1, text="if i % 10 == 0:\n    x()\n")])
    assert (stmt.first, stmt.last, stmt.suggestion) == (2, 2, "if i % 10 == 0:\n    x()")
    two = rewrite(lines, [TextEdit(line=1, column=5, end_line=1, end_column=6, text="0"),
                          TextEdit(line=3, column=5, end_line=3, end_column=6, text="3")])
    assert (two.first, two.last, two.suggestion) == (1, 3, "a = 0\nloader = DataLoader(ds)\nb = 3")
    assert two.diff("x.py") == "@@ -1 +1 @@\n-a = 1\n+a = 0\n@@ -3 +3 @@\n-b = 2\n+b = 3\n"
    removed = rewrite(lines, [TextEdit(line=1, column=1, end_line=2, end_column=1, text="")])
    assert removed.suggestion == ""  # an empty suggestion deletes the line
    assert rewrite(lines, []) is None
    crlf = split_lines("a = 1\r\nb = 2\r\n")
    assert rewrite(crlf, [TextEdit(line=2, column=5, end_line=2, end_column=6, text="3")]).suggestion == "b = 3"


def test_fence_outgrows_backticks_in_the_body():
    assert fence("x = 1") == "```suggestion\nx = 1\n```"
    assert fence("s = '```'").startswith("````suggestion\n") and fence("s = '```'").endswith("\n````")
    assert fence("", "suggestion") == "```suggestion\n```"


@pytest.mark.parametrize("pattern, path, hit", [
    ("tests/", "tests/test_a.py", True),
    ("tests/", "pkg/tests/test_a.py", True),
    ("tests/", "mytests/a.py", False),
    ("legacy/*.py", "legacy/old.py", True),
    ("legacy/*.py", "src/legacy/old.py", False),
    ("*_pb2.py", "proto/x_pb2.py", True),
    ("./scripts", "scripts/run.py", True),
    ("gen", "src/gen/a.py", True),
    ("gen", "src/generated.py", False),
])
def test_exclude_patterns(pattern, path, hit):
    assert ReviewConfig(exclude=[pattern]).excluded(path) is hit


def test_config_reads_only_its_table():
    assert load_text(None).select == []
    assert load_text("[project]\nname='x'\n").source == "pyproject.toml"
    cfg = load_text('[tool.zoomer-ar]\nselect = "sync-point, dataloader-workers"\noptions = { dataloader-bound = { num_workers = 8 } }\n')
    assert cfg.select == ["sync-point", "dataloader-workers"] and cfg.options == {"dataloader-bound": {"num_workers": 8}}


def test_default_severities_cover_every_pattern_and_overrides_win():
    assert set(catalogue.DEFAULT_SEVERITY) == set(PATTERN_IDS)
    assert catalogue.severity_for("sync-point", "loop-synchronize") == "high"
    assert catalogue.severity_for("sync-point", "loop-synchronize", {"sync-point": "low"}) == "low"
    assert catalogue.severity_for("sync-point", "loop-synchronize", {"sync-point": "low", "loop-synchronize": "info"}) == "info"
    assert catalogue.title("sync-point") == "Host synchronisations drain the GPU queue every step"


def _finding(**kw) -> ReviewFinding:
    base = dict(rule_id="sync-point", fixer="loop-item-sync", title="T", severity="high", message="msg | with pipe",
                path="a.py", line=3, column=1, end_line=3, end_column=5, statement_line=3, fingerprint="ab" * 16 + ":1",
                comment_line=3)
    return ReviewFinding(**{**base, **kw})


def test_inline_body_has_a_marker_and_the_suggestion():
    body = render_inline(_finding(suggestion="x = 1"))
    assert "```suggestion\nx = 1\n```" in body and parse_inline_marker(body) == ("sync-point", "ab" * 16 + ":1")
    assert parse_inline_marker("a human comment") is None
    assert "```diff" in render_inline(_finding(fix_diff="@@ -3 +3 @@\n-a\n+b\n"))


def test_summary_is_shortened_to_fit_githubs_limit():
    findings = [_finding(line=i, message="m" * 300, fix_diff="@@ -1 +1 @@\n-" + "a" * 500 + "\n+b\n") for i in range(1, 400)]
    r = ReviewResult(repo="/r", base="main", base_sha="a" * 40, head="f", head_sha="b" * 40, merge_base_sha="a" * 40,
                     files_changed=1, findings=findings)
    text = render_markdown(r)
    assert len(text) <= 65_000 and "… and" in text and "| `sync-point` |" in text
    assert "msg \\| with pipe" in render_markdown(r.model_copy(update={"findings": [_finding()]}))
