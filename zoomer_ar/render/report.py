"""Report rendering: findings.json, report.md and report.html (self-contained), terminal summary."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from functools import lru_cache
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from ..detect.combine import combined_impact, within_present
from ..errors import OutputError
from ..models import Analysis
from ..paths import REPORTS_DIR
from ..features.names import device_noun
from .filters import bottleneck_summary, install


@lru_cache(maxsize=1)
def _env() -> Environment:
    """One environment per process: it keeps the compiled templates (the loader still reloads a template
    whose file changed), so a service or a batch renders each one once, not once per analysis."""
    env = Environment(
        loader=FileSystemLoader(str(REPORTS_DIR)),
        autoescape=select_autoescape(enabled_extensions=("html", "j2.html"), default_for_string=False),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return install(env)


def _fixer_names(analysis: Analysis) -> dict[str, list[tuple[str, bool]]]:
    """For each id in the findings' `fixers` (pattern ids or fixer names): the fixers it stands for,
    as (name, opt-in); the reports mark the opt-in ones, which a patch applies only when selected.
    Read from the fixer files' source (fix/catalogue.py); the registry where that does not read."""
    ids = sorted({i for x in analysis.findings for i in x.fixers})
    if not ids:
        return {}
    from ..fix import catalogue

    out: dict[str, list[tuple[str, bool]]] = {}
    for i in ids:
        found = catalogue.resolve([i])
        if found is not None:
            out[i] = [(e.name, e.opt_in) for e in found]
            continue
        try:
            from ..fix.registry import load_registry

            out[i] = [(f.name, bool(f.opt_in)) for f in load_registry().resolve([i])]
        except Exception:  # an id the registry does not know, or a broken fixer file: shown as written
            out[i] = [(i, False)]
    return out


def narrow_gpu_span(features: dict) -> float | None:
    """The GPU's span (first to last device op, ms) where it covers less than half of the profiled
    time: GPU busy is a share of that span (LABELS' definition), so "GPU busy 100%" of a 2 us span
    in a 13 s trace must say what it is a share of. None where the span is most of the trace."""
    span, wall = features.get("gpu_span_ms"), features.get("wall_ms")
    if features.get("gpu_busy_pct") is None or span is None or not wall or span >= 0.5 * wall:
        return None
    return span


def _context(analysis: Analysis) -> dict:
    # "GPU", or "accelerator" where the trace's device is not a GPU (MTIA): cost lines then say
    # accelerator-hours (features.names.device_noun; findings.json keeps its gpu_hours keys)
    dev = device_noun(analysis.features)
    return {"a": analysis, "findings": analysis.findings, "job": analysis.job, "f": analysis.features,
            "fixer_names": _fixer_names(analysis), "avoidable": combined_impact(analysis.findings),
            "within": within_present(analysis.findings), "gpu_span": narrow_gpu_span(analysis.features),
            "bottleneck": bottleneck_summary(analysis.bottleneck.summary, analysis.features),
            "dev": dev, "Dev": dev[:1].upper() + dev[1:]}


def render_markdown(analysis: Analysis) -> str:
    return _env().get_template("report.md.j2").render(**_context(analysis))


def render_html(analysis: Analysis) -> str:
    return _env().get_template("report.html.j2").render(**_context(analysis))


def render_text(analysis: Analysis) -> str:
    return _env().get_template("summary.txt.j2").render(**_context(analysis))


def _umask() -> int:
    """The process umask, read without changing it where Linux exposes it (os.umask sets it while
    reading, which a thread writing a file at that moment would see)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def is_special_file(path: Path) -> bool:
    """``path`` exists and is not a regular file (``/dev/stdout``, ``/dev/null``, a FIFO): an output
    there is written into, never replaced by a file. False where it is not there yet (or unreadable:
    the write says why)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it), with the mode a plain
    open() would give it under the user's umask: mkstemp creates 0600, which would hide the
    reports from the group and the web server that serve them. Any failure (a full disk, a folder
    in the way, ``path`` a folder) is one OutputError and leaves nothing behind: no temporary file,
    no folder this call created. Text is UTF-8 (surrogate escapes kept: undecodable file names).
    A ``path`` that is not a regular file (``/dev/stdout``, ``/dev/null``, a FIFO) is written into,
    never replaced by a file."""
    if path.is_dir():
        raise OutputError(str(path), "it is a directory")
    payload = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    if is_special_file(path):
        try:
            with open(path, "wb") as fh:
                fh.write(payload)
        except OSError as exc:
            raise OutputError(str(path), exc.strerror or str(exc)) from None
        return
    created: list[Path] = []  # folders made here, removed again on failure
    tmp: str | None = None
    try:
        for d in reversed([d for d in (path.parent, *path.parent.parents) if not d.exists()]):
            d.mkdir()
            created.append(d)
        fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        for d in reversed(created):
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(exc, (OSError, UnicodeError)):  # the output's fault, said in one line
            raise OutputError(str(path), getattr(exc, "strerror", None) or str(exc) or type(exc).__name__) from None
        raise


def findings_json(analysis: Analysis) -> str:
    return json.dumps(analysis.model_dump(mode="json"), indent=2, allow_nan=False, default=str) + "\n"


def write_outputs(analysis: Analysis, out_dir: Path) -> dict[str, Path]:
    out = {
        "findings.json": out_dir / "findings.json",
        "report.md": out_dir / "report.md",
        "report.html": out_dir / "report.html",
    }
    atomic_write(out["findings.json"], findings_json(analysis))
    atomic_write(out["report.md"], render_markdown(analysis))
    atomic_write(out["report.html"], render_html(analysis))
    return out
