"""The diff under review, read with GitPython: which Python files changed, and which of their lines.

The reviewed range is what a pull request shows: from the merge base of BASE and HEAD to HEAD
(``git diff BASE...HEAD``), renames detected, three lines of context (GitHub's hunks, so a line we
comment on is one GitHub accepts). HEAD ``None`` means the working tree (pre-commit: the staged
state, since pre-commit stashes what is not staged).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..errors import InputError

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class FileDiff:
    """One changed file on the new side.

    ``added``: new-side line numbers the diff adds (a modified line is a deleted plus an added one).
    ``deletions``: places where lines were removed, as the new line number *before* the gap (0: at
    the top of the file).
    ``hunks``: new-side line ranges (first, last) of the hunks, context included: the lines a
    review comment may be placed on.
    """

    path: str
    old_path: str | None = None
    status: str = "modified"  # added | modified | renamed | deleted | copied
    binary: bool = False
    added: set[int] = field(default_factory=set)
    deletions: set[int] = field(default_factory=set)
    hunks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.deletions)

    def hunk_of(self, line: int) -> int | None:
        for i, (a, b) in enumerate(self.hunks):
            if a <= line <= b:
                return i
        return None

    def in_one_hunk(self, first: int, last: int) -> bool:
        i = self.hunk_of(first)
        return i is not None and self.hunks[i][0] <= first <= last <= self.hunks[i][1]

    def touches(self, first: int, last: int, *, block: bool = False) -> bool:
        """Whether lines first..last overlap an added line or enclose a deletion. ``block``: the
        span is a compound statement (a loop), so a deletion right after its last line may have
        been the tail of its body and counts too."""
        if last - first < len(self.added):
            if any(n in self.added for n in range(first, last + 1)):
                return True
        elif any(first <= n <= last for n in self.added):
            return True
        return any(first <= k < last or (block and k == last > first) for k in self.deletions)

    def first_added(self, first: int, last: int) -> int | None:
        hits = [n for n in self.added if first <= n <= last]
        return min(hits) if hits else None


def parse_patch(patch: bytes, fd: FileDiff) -> None:
    """Fill ``fd`` from a unified diff body (its hunks, as GitPython gives it)."""
    head = patch[:4096]
    if head.startswith((b"Binary files", b"GIT binary patch")) or b"\nBinary files " in head:
        fd.binary = True
        return
    new = 0
    gaps: set[int] = set()
    for raw in patch.split(b"\n"):
        m = _HUNK_RE.match(raw)
        if m:
            new_start, new_len = int(m.group(3)), int(m.group(4) if m.group(4) is not None else b"1")
            if new_len:
                fd.hunks.append((new_start, new_start + new_len - 1))
                new = new_start
            else:  # nothing on the new side: the gap is after line new_start
                new = new_start + 1
            continue
        tag = raw[:1]
        if tag == b"+":
            fd.added.add(new)
            new += 1
        elif tag == b" ":
            new += 1
        elif tag == b"-":
            gaps.add(new - 1)
        # "\\ No newline at end of file": no line
    fd.deletions = gaps


@dataclass
class DiffResult:
    root: Path
    base_sha: str
    head_sha: str | None  # None: the working tree
    merge_base_sha: str
    files: list[FileDiff]
    repo: object = None  # git.Repo

    def read(self, fd: FileDiff) -> bytes:
        """The new-side content of a changed file."""
        if self.head_sha is None:
            return (self.root / fd.path).read_bytes()
        import git

        repo: git.Repo = self.repo  # type: ignore[assignment]
        blob = repo.commit(self.head_sha).tree / fd.path
        return blob.data_stream.read()


def _repo(path: str | Path):
    try:
        import git
    except ImportError as exc:  # pragma: no cover - GitPython is a dependency
        raise InputError(None, f"zoomer-ar review needs GitPython ({exc})") from None
    try:
        return git.Repo(str(path), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise InputError(str(path), "not a git repository") from None


def _commit(repo, ref: str, what: str):
    import git

    try:
        return repo.commit(ref)
    except (git.BadName, ValueError, git.GitCommandError) as exc:
        raise InputError(None, f"{what} {ref!r} is not a commit in {repo.working_tree_dir}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def collect(repo_dir: str | Path, base: str, head: str | None, *, paths: Iterable[str] = ()) -> DiffResult:
    """Changed ``*.py`` files between the merge base of ``base`` and ``head`` and ``head``.

    ``paths`` (relative to the repository root) limits the review to those files (pre-commit
    passes the staged file names)."""
    import git

    repo = _repo(repo_dir)
    if repo.bare or repo.working_tree_dir is None:
        raise InputError(str(repo_dir), "a bare repository has no working tree to review")
    root = Path(repo.working_tree_dir)
    base_c = _commit(repo, base, "base")
    head_c = _commit(repo, head, "head") if head is not None else None
    mb = base_c
    if head_c is not None:
        try:
            bases = repo.merge_base(base_c, head_c)
        except git.GitCommandError:
            bases = []
        mb = bases[0] if bases else base_c
    spec = [p for p in paths] or None
    try:
        diffs = mb.diff(head_c if head_c is not None else None, paths=spec, create_patch=True, M=True, no_ext_diff=True)
    except git.GitCommandError as exc:
        raise InputError(None, f"git diff failed: {str(exc.stderr or exc).strip().splitlines()[-1] if str(exc.stderr or exc).strip() else exc}") from None
    files: list[FileDiff] = []
    for d in diffs:
        new_path = d.b_path
        if d.deleted_file or new_path is None:
            continue  # nothing left to review
        if not new_path.endswith(".py"):
            continue
        status = "added" if d.new_file else "renamed" if d.renamed_file else "copied" if getattr(d, "copied_file", False) else "modified"
        fd = FileDiff(path=new_path, old_path=d.a_path if d.a_path != new_path else None, status=status)
        parse_patch(d.diff or b"", fd)
        files.append(fd)
    files.sort(key=lambda f: f.path)
    return DiffResult(root=root, base_sha=base_c.hexsha, head_sha=head_c.hexsha if head_c is not None else None,
                      merge_base_sha=mb.hexsha, files=files, repo=repo)
