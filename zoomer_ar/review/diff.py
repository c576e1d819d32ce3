"""The diff under review, read with GitPython: which Python files changed, and which of their lines.

The reviewed range is what a pull request shows: from the merge base of BASE and HEAD to HEAD
(``git diff BASE...HEAD``), renames detected, three lines of context (GitHub's hunks, so a line we
comment on is one GitHub accepts). HEAD ``None`` means the working tree (pre-commit: the staged
state, since pre-commit stashes what is not staged).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

from ..errors import InputError
from ..fix.lines import LineMap, split_lines

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
    blob: str | None = None  # the new side's blob id (None: read the working tree)
    old_blob: str | None = None  # the old side's blob id (None: an added file)
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

    def in_python_lines(self, text: str, old_text: str | None = None) -> "FileDiff":
        """This diff with Python's line numbers of the new side ``text`` instead of git's.

        They differ only where a lone ``\\r`` ends a line (old-Mac line endings): git counts
        ``\\n`` only, so to git such a file is one long line and any change modifies "line 1".
        The git lines the diff adds become all the Python lines in them; with the old side's text
        (``old_text``) the added lines are narrowed to those a Python-line diff changes."""
        lm = LineMap(text)
        if lm.identity:
            return self
        added = {n for g in self.added for n in range(lm.first(g), lm.last(g) + 1)}
        deletions = {lm.last(k) if k > 0 else 0 for k in self.deletions}
        if old_text is not None:
            exact_added: set[int] = set()
            exact_gaps: set[int] = set()
            ops = difflib.SequenceMatcher(None, split_lines(old_text), split_lines(text), autojunk=False).get_opcodes()
            for tag, i1, i2, j1, j2 in ops:
                if tag in ("replace", "insert"):
                    exact_added.update(range(j1 + 1, j2 + 1))
                if tag in ("replace", "delete"):
                    exact_gaps.add(j1)  # the new line before the gap
            added &= exact_added
            deletions = exact_gaps
        hunks = [(lm.first(a), lm.last(b)) for a, b in self.hunks]
        return replace(self, added=added, deletions=deletions, hunks=hunks)


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
    base: str = ""  # the refs as given
    head: str | None = None

    def read(self, fd: FileDiff) -> bytes:
        """The new-side content of a changed file."""
        if self.head_sha is None or fd.blob is None:
            return (self.root / fd.path).read_bytes()
        return self.repo.odb.stream(bytes.fromhex(fd.blob)).read()  # type: ignore[attr-defined]

    def read_old(self, fd: FileDiff) -> bytes | None:
        """The old-side content of a changed file (None: an added file)."""
        if fd.old_blob is None:
            return None
        return self.repo.odb.stream(bytes.fromhex(fd.old_blob)).read()  # type: ignore[attr-defined]


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


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def unquote(path: bytes) -> str:
    """A path as git prints it: C-quoted (``"a\\tb"``, octal bytes) when it has special characters."""
    if not (path.startswith(b'"') and path.endswith(b'"') and len(path) >= 2):
        return path.decode("utf-8", "surrogateescape")
    body = path[1:-1].decode("latin-1")
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body) + 1 and all(ch in "01234567" for ch in body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, ord(nxt)))
            i += 2
            continue
        out.append(ord(c))
        i += 1
    return bytes(out).decode("utf-8", "surrogateescape")


def _strip_prefix(path: str, prefix: str) -> str:
    return path[len(prefix):] if path.startswith(prefix) else path


def parse_git_diff(data: bytes) -> list[FileDiff]:
    """Files of ``git diff -p -M --full-index`` output (deleted files left out)."""
    files: list[FileDiff] = []
    for section in re.split(rb"(?m)^(?=diff --git )", data):
        if not section.startswith(b"diff --git "):
            continue
        head, sep, hunks = section.partition(b"\n@@ ")
        header = head.split(b"\n")
        new_path: str | None = None
        old_path: str | None = None
        status = "modified"
        blob: str | None = None
        old_blob: str | None = None
        binary = False
        deleted = False
        for line in header[1:]:
            if line.startswith(b"+++ "):
                target = line[4:].rstrip(b"\t")
                if target != b"/dev/null":
                    new_path = _strip_prefix(unquote(target), "b/")
                else:
                    deleted = True
            elif line.startswith(b"--- "):
                source = line[4:].rstrip(b"\t")
                if source != b"/dev/null":
                    old_path = _strip_prefix(unquote(source), "a/")
            elif line.startswith((b"rename to ", b"copy to ")):
                new_path = unquote(line.split(b" to ", 1)[1])
                status = "renamed" if line.startswith(b"rename") else "copied"
            elif line.startswith((b"rename from ", b"copy from ")):
                old_path = unquote(line.split(b" from ", 1)[1])
            elif line.startswith(b"new file mode"):
                status = "added"
            elif line.startswith(b"deleted file mode"):
                deleted = True
            elif line.startswith(b"index "):
                ids = line[6:].split(b" ")[0].split(b"..")
                if len(ids) == 2 and ids[1].strip(b"0"):
                    blob = ids[1].decode()
                if len(ids) == 2 and ids[0].strip(b"0"):
                    old_blob = ids[0].decode()
            elif line.startswith(b"Binary files ") or line.startswith(b"GIT binary patch"):
                binary = True
        if deleted:
            continue
        if new_path is None:  # binary, mode-only or pure rename: the path from the first line
            rest = header[0][len(b"diff --git "):]
            if rest.startswith(b'"'):  # "a/..." then b/... or "b/..."
                m = re.match(rb'"(?:[^"\\]|\\.)*" ', rest)
                new_path = _strip_prefix(unquote(rest[m.end():] if m else rest), "b/")
            elif len(rest) % 2 == 1 and rest[: (len(rest) - 1) // 2][2:] == rest[(len(rest) + 1) // 2:][2:]:
                new_path = unquote(rest[(len(rest) + 1) // 2:][2:])  # "a/P b/P"
            else:
                new_path = unquote(rest.rsplit(b" b/", 1)[-1])
        fd = FileDiff(path=new_path, old_path=old_path if old_path != new_path else None, status=status, blob=blob,
                      old_blob=old_blob, binary=binary)
        if sep:
            parse_patch(b"@@ " + hunks, fd)
        files.append(fd)
    return files


def _no_merge_base(repo, base: str, head: str) -> str:
    """Why there is no pull-request diff between two commits without a common ancestor, and the way out."""
    import git

    try:
        shallow = repo.git.rev_parse("--is-shallow-repository").strip() == "true"
    except git.GitCommandError:
        shallow = False
    why = (f"base {base!r} and head {head!r} have no common ancestor in {repo.working_tree_dir}, so the change cannot be "
           "told apart from the base branch's own later commits")
    if shallow:
        return why + (": this is a shallow clone; fetch their history (`git fetch --unshallow`, or actions/checkout "
                      "with `fetch-depth: 0`)")
    return why + ": unrelated histories"


def collect(repo_dir: str | Path, base: str, head: str | None, *, paths: Iterable[str] = ()) -> DiffResult:
    """Changed ``*.py`` files and notebooks (``*.ipynb``) between the merge base of ``base`` and ``head`` and ``head``.

    ``paths`` (relative to the repository root) limits the review to those files (pre-commit
    passes the staged file names). One ``git diff`` run through GitPython, parsed here (GitPython's
    own diff objects cost a second per thousand files)."""
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
        if not bases:  # diffing BASE..HEAD instead would review every later change of the base branch as the PR's
            raise InputError(None, _no_merge_base(repo, base, head))
        mb = bases[0]
    cmd = [repo.git.GIT_PYTHON_GIT_EXECUTABLE or "git", "-c", "core.quotepath=off", "diff", "-p", "-M", "--full-index",
           "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/", "--dst-prefix=b/", mb.hexsha]
    if head_c is not None:
        cmd.append(head_c.hexsha)
    cmd += ["--", *paths] if paths else []
    try:
        data = repo.git.execute(cmd, stdout_as_string=False, with_extended_output=False)
    except git.GitCommandError as exc:
        err = str(exc.stderr or exc).strip()
        raise InputError(None, f"git diff failed: {err.splitlines()[-1] if err else exc}") from None
    files = [f for f in parse_git_diff(data) if f.path.endswith(".py") or f.path.lower().endswith(".ipynb")]
    if head_c is None:
        for f in files:
            f.blob = None  # the working tree: read from disk
    files.sort(key=lambda f: f.path)
    return DiffResult(root=root, base_sha=base_c.hexsha, head_sha=head_c.hexsha if head_c is not None else None,
                      merge_base_sha=mb.hexsha, files=files, repo=repo, base=base, head=head)
