"""Source mapping: resolve findings' Python frames to files and statements under a source folder.

Kineto frames look like `train.py(33): train_step` (the line is the function's `def`; the path is
relative to a sys.path entry, or absolute). A frame is resolved to the file under DIR whose path
shares the longest suffix with it; library frames were already dropped by the features stage.
Inside the function, the fix stage's `locate` finds the statement the finding is about (the
`.item()`, the `DataLoader(...)`, the `.to(...)`, the optimizer construction). When the function
holds no such statement (a DataLoader built in `main` but iterated in `train`), the same file and
then the whole folder are searched statically for that pattern. User code is parsed, never run.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from .errors import InputError
from .fix.api import locate, static_findings
from .fix.engine import decode, iter_python_files
from .models import Analysis, Finding, SourceFrame


class SourceIndex:
    """Python files under a folder, looked up by path suffix; file text cached."""

    def __init__(self, root: Path):
        if not root.is_dir():
            raise InputError(str(root), "source folder not found")
        self.root = root.resolve()
        self.files = [p for p in iter_python_files(self.root)]
        self.by_name: dict[str, list[Path]] = {}
        for p in self.files:
            self.by_name.setdefault(p.name, []).append(p)
        self._text: dict[Path, str | None] = {}

    def resolve(self, frame_file: str) -> Path | None:
        parts = PurePosixPath(frame_file.replace("\\", "/")).parts
        if not parts:
            return None
        best, best_len = None, 0
        for cand in self.by_name.get(parts[-1], []):
            rel = cand.relative_to(self.root).parts
            n = 0
            while n < min(len(rel), len(parts)) and rel[-1 - n] == parts[-1 - n]:
                n += 1
            if n > best_len or (n == best_len and best is not None and len(rel) < len(best.relative_to(self.root).parts)):
                best, best_len = cand, n
        return best

    def text(self, path: Path) -> str | None:
        if path not in self._text:
            try:
                self._text[path] = decode(path.read_bytes())[0]
            except (OSError, ValueError):
                self._text[path] = None
        return self._text[path]

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def _snippet(text: str, line: int, context: int = 1) -> str:
    lines = text.splitlines()
    lo, hi = max(1, line - context), min(len(lines), line + context)
    return "\n".join(f"{n:>5} | {lines[n - 1]}" for n in range(lo, hi + 1))


def _best_line(text: str, rel: str, frame: SourceFrame, pattern: str) -> int:
    """The statement to point at, by preference: a fixer's match inside the frame's function, a
    fixer's match elsewhere in the same file, a candidate site inside the function, the frame line."""
    inside = locate(text, frame.line, pattern, function=frame.function, path=rel)
    fixer_inside = sorted((m for m in inside if m.fixer), key=lambda m: (not m.fixable, m.line))
    if fixer_inside:
        return fixer_inside[0].line
    in_file = static_findings(text, rel, [pattern]) if _has_detector(pattern) else []
    in_file = sorted(in_file, key=lambda m: (not m.fixable, m.line))
    if in_file:
        return in_file[0].line
    if inside:
        return sorted(inside, key=lambda m: m.line)[0].line
    return frame.line


def _map_frame(index: SourceIndex, frame: SourceFrame, pattern: str) -> SourceFrame:
    path = index.resolve(frame.file)
    if path is None:
        return frame
    text = index.text(path)
    if text is None:
        return frame
    rel = index.rel(path)
    try:
        line = _best_line(text, rel, frame, pattern)
    except InputError:  # the file does not parse: keep the frame's own line
        line = frame.line
    return frame.model_copy(update={"resolved_path": rel, "resolved_line": line, "snippet": _snippet(text, line)})


def _has_detector(pattern: str) -> bool:
    from .fix.api import fixers_for

    return bool(fixers_for(pattern))


def _folder_fallback(index: SourceIndex, pattern: str, ran: list[Path] | None = None) -> list[SourceFrame]:
    """No usable frame in the trace: search the folder statically for the pattern, in the files the
    trace shows running (`ran`: other findings' resolved frames) where there are any, else in all."""
    if not _has_detector(pattern):
        return []
    out = []
    for path in ran or index.files:
        text = index.text(path)
        if text is None:
            continue
        rel = index.rel(path)
        try:
            matches = static_findings(text, rel, [pattern])
        except InputError:
            continue
        for m in matches[:3]:
            out.append(SourceFrame(file=rel, line=m.line, function="", resolved_path=rel, resolved_line=m.line,
                                   snippet=_snippet(text, m.line)))
    return out[:5]


def map_finding(index: SourceIndex, finding: Finding, ran: list[Path] | None = None) -> Finding:
    frames = [_map_frame(index, f, finding.pattern) for f in finding.evidence.frames]
    resolved = [f for f in frames if f.resolved_path]
    if not resolved:
        frames = _folder_fallback(index, finding.pattern, ran) + frames
    events = []
    for e in finding.evidence.events:
        events.append(e.model_copy(update={"frames": [_map_frame(index, f, finding.pattern) for f in e.frames[:1]]}))
    evidence = finding.evidence.model_copy(update={"frames": frames, "events": events})
    return finding.model_copy(update={"evidence": evidence})


def map_sources(analysis: Analysis, source_dir: Path) -> Analysis:
    """Every finding's frames resolved under source_dir. A finding whose evidence has no Python
    frame is looked for statically in the files the other findings' frames resolved to (the code
    the trace shows running); only when no frame resolves at all is the whole folder searched."""
    index = SourceIndex(Path(source_dir))
    ran: list[Path] = []
    for f in analysis.findings:
        for fr in f.all_frames():
            path = index.resolve(fr.file)
            if path is not None and path not in ran:
                ran.append(path)
    findings = [map_finding(index, f, ran) for f in analysis.findings]
    return analysis.model_copy(update={"findings": findings})


def files_ran(analysis: Analysis) -> list[str] | None:
    """The source files (relative to --source) that a mapped analysis's frames resolved to: the
    code the trace shows running. None (patch the whole folder) when no frame resolved there (a
    trace recorded without Python stacks, or a source folder that does not hold the traced code).

    A source folder often holds more than the program that was profiled (other entry points,
    scenario programs side by side, old experiments): patch.diff changes only the code the trace
    shows running, where the trace says which code that is."""
    files = {fr.resolved_path for f in analysis.findings for fr in f.all_frames() if fr.resolved_path}
    return sorted(files) or None
