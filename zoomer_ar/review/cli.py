"""``zoomer-ar review``: the pre-merge bot (findings on the lines a change adds, as a PR review)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..errors import InputError
from .catalogue import SEVERITIES
from .config import DEFAULT_MAX_INLINE

FORMATS = ("md", "sarif", "github", "text", "json")


def _write(text: str, output: str | None) -> None:
    """stdout, or the file ``output`` replaced atomically (render.report.atomic_write: any failure is
    one ``cannot write`` line, exit 2, and leaves nothing behind)."""
    if output is None or output == "-":
        click.echo(text, nl=not text.endswith("\n"))
        return
    from ..render.report import atomic_write

    atomic_write(Path(output), text)


@click.command("review")
@click.argument("files", nargs=-1, type=click.Path())
@click.option("--repo", "repo", default=".", show_default=True, type=click.Path(file_okay=False),
              help="The git repository (or a folder inside it).")
@click.option("--base", default="HEAD", show_default=True,
              help="The base ref; the diff starts at its merge base with HEAD (what a pull request shows).")
@click.option("--head", default=None, help="The head ref (default: the working tree, e.g. under pre-commit).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="md", show_default=True,
              help="md: the PR comment; sarif: SARIF 2.1.0; github: the review payload; text: one line per finding; json: everything.")
@click.option("-o", "--output", default=None, help="Write the output to this file instead of stdout.")
@click.option("--trace", type=click.Path(exists=True), default=None, help="A trace of this code: attach measured cost to findings.")
@click.option("--db", default=None, help="The store (URL or path): attach what the pattern cost in recorded jobs.")
@click.option("--db-week", default=None, help="The store week to report (YYYY-Www; default: last week).")
@click.option("--select", default=None, help="Only these pattern ids or fixer names (comma-separated; replaces [tool.zoomer-ar] select).")
@click.option("--ignore", default=None, help="Skip these pattern ids or fixer names (replaces [tool.zoomer-ar] ignore).")
@click.option("--fail-on", type=click.Choice(("none", *SEVERITIES)), default=None,
              help="Exit with status 1 when a finding has this severity or higher (default: [tool.zoomer-ar] fail-on, else none).")
@click.option("--post", is_flag=True, help="Post to the pull request on GitHub (GITHUB_TOKEN, GITHUB_REPOSITORY, GITHUB_EVENT_PATH).")
@click.option("--pr", type=click.IntRange(min=1), default=None, help="Pull-request number for --post (default: from the event payload).")
@click.option("--github-repo", default=None, help="owner/name for --post (default: GITHUB_REPOSITORY).")
@click.option("--max-comments", type=click.IntRange(min=0), default=None,
              help=f"Most new inline comments per --post run (default: [tool.zoomer-ar] max-inline-comments, else {DEFAULT_MAX_INLINE}).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Processes for parsing (default: CPU count, at most 8).")
@click.option("--no-prefilter", is_flag=True, hidden=True, help="Parse every changed file (debugging the prefilter).")
def review_cmd(files, repo, base, head, fmt, output, trace, db, db_week, select, ignore, fail_on, post, pr, github_repo,
               max_comments, jobs, no_prefilter) -> int:
    """Review the Python files a change touches: performance anti-patterns on the changed lines.

    \b
    zoomer-ar review --base origin/main --head HEAD            # a branch, as its pull request shows it
    zoomer-ar review --base origin/main --head HEAD --format sarif -o zoomer.sarif
    zoomer-ar review                                           # the working tree against HEAD (pre-commit)
    zoomer-ar review --base "$BASE_SHA" --head "$HEAD_SHA" --post --fail-on high

    Exit status: 0 reviewed; 1 a finding at or above --fail-on (or GitHub refused the post);
    2 bad input (not a repository, unknown ref, a FILE that does not exist, invalid [tool.zoomer-ar],
    --post without its GitHub settings: token, repository, pull request).
    """
    from . import engine, render
    from .safe_text import quoted_path, readable, readable_all

    paths = _paths(repo, head, files) if files else []
    target = None
    if post:
        from .github import target_from_env

        target = target_from_env(pr=pr, repository=github_repo)  # fail fast, before the review
    result = engine.review(repo, base, head, paths=paths, select=select, ignore=ignore, trace=trace, db=db,
                           db_week=db_week, jobs=jobs, use_prefilter=not no_prefilter)
    cap = max_comments if max_comments is not None else (result.config_max_inline if result.config_max_inline is not None else DEFAULT_MAX_INLINE)
    # a file name that is not UTF-8 is written readably (safe_text): every output is valid UTF-8
    if fmt == "md":
        text = readable(render.render_markdown(result))
    elif fmt == "text":
        text = render.render_text(result)
    elif fmt == "sarif":
        from .sarif import to_sarif

        text = json.dumps(readable_all(to_sarif(result)), indent=2) + "\n"
    elif fmt == "github":
        text = json.dumps(readable_all(render.github_payload(result, max_comments=cap)), indent=2) + "\n"
    else:
        text = json.dumps(readable_all(result.model_dump(mode="json")), indent=2, ensure_ascii=False) + "\n"
    _write(text, output)
    for e in result.errors:
        where = f"{quoted_path(e.path)}:{e.line}:{e.column}" if e.line else quoted_path(e.path)
        click.echo(f"zoomer-ar: warning: {where}: {e.message} (not reviewed)", err=True)
    if target is not None:
        from .github import post as post_review

        outcome = post_review(result, target, max_comments=cap)
        click.echo(f"zoomer-ar: posted to {target.repository}#{target.pr}: {outcome.describe()}", err=True)
        for n in outcome.notes:
            click.echo(f"zoomer-ar: warning: {n}", err=True)
    threshold = fail_on or result.config_fail_on or "none"
    failing = engine.fail_count(result, threshold)
    if failing:
        click.echo(f"zoomer-ar: {failing} finding{'s' if failing != 1 else ''} at or above {threshold} (--fail-on)", err=True)
        return 1
    return 0


def _repo_root(repo: str) -> Path:
    from .diff import _repo

    r = _repo(repo)
    if r.working_tree_dir is None:
        raise InputError(repo, "a bare repository has no working tree to review")
    return Path(r.working_tree_dir).resolve()


def _paths(repo: str, head: str | None, files: tuple[str, ...]) -> list[str]:
    """FILES relative to the repository root; one that is neither on disk nor (with --head) in the head
    commit is bad input (InputError, exit 2) rather than a silently empty review."""
    root = _repo_root(repo)
    out = []
    for f in files:
        rel = _rel(root, f)
        if not (Path(f).exists() or Path(f).is_symlink() or _in_head(repo, head, rel)):
            where = "on disk" + (f" or in {head}" if head is not None else "")
            raise InputError(f, f"no such file or folder ({where})")
        out.append(rel)
    return out


def _in_head(repo: str, head: str | None, rel: str) -> bool:
    if head is None:
        return False
    from .diff import _commit, _repo

    tree = _commit(_repo(repo), head, "head").tree
    if rel in ("", "."):
        return True
    try:
        tree / rel
    except KeyError:
        return False
    return True


def _rel(root: Path, f: str) -> str:
    p = Path(f)
    if not p.is_absolute():
        p = Path.cwd() / p
    try:
        return p.resolve().relative_to(root).as_posix()
    except ValueError:
        raise InputError(f, f"not inside the repository {root}") from None


commands = [review_cmd]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(review_cmd.main(standalone_mode=False))
