"""`zoomer-ar trace filter|slice|sample|split|merge|compress|repair|check`: streaming trace surgery."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import InputError
from ..load.reader import reading_progress
from ..progress import bar_factory
from ..sigterm import sigterm_unwinds
from . import ops
from .io import replaced_note, take_replaced
from .validate import check_trace

_COMPRESSION = click.Choice(["gzip", "zstd", "none"])
_COMP_HELP = ("Output compression (default: from OUT's suffix: .gz gzip, .zst zstd (needs `zstandard`), else none; "
              "an OUT named for another compression is refused).")


def _range(text: str, option: str, *, ints: bool = False) -> tuple[float, float]:
    """N..M (also N:M, N-M; a single N is N..N); InputError naming the option otherwise."""
    conv = int if ints else float
    for sep in ("..", ":", "-"):
        if sep in text.strip().lstrip("-"):
            a, b = text.split(sep, 1) if sep != "-" else text.rsplit("-", 1)
            try:
                return conv(a), conv(b)
            except ValueError:
                break
    try:
        v = conv(text)
        return v, v
    except ValueError:
        kind = "integers" if ints else "numbers"
        raise InputError(None, f"{option} {text!r}: expected N..M ({kind})") from None


def _ints(text: str | None, option: str = "--ranks") -> list[int] | None:
    """0,2,4..7 -> [0, 2, 4, 5, 6, 7]; InputError (exit 2, one line) for anything else, a reversed
    range (3..2) or a list that names nothing."""
    if text is None:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if ".." in part:
                a, b = (int(v) for v in part.split("..", 1))
                if b < a:
                    raise InputError(None, f"{option} {text!r}: {part} is reversed (give N..M with N <= M)")
                out += list(range(a, b + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise InputError(None, f"{option} {text!r}: expected ranks like 0,2,4..7") from None
    if not out:
        raise InputError(None, f"{option} {text!r}: names no rank")
    return out


def _done(st: ops.Stats) -> None:
    """The one-line result on stdout; skipped inputs, notes and warnings on stderr, one line each."""
    for s in st.skipped:
        click.echo(f"note: skipped {s}", err=True)
    for n in st.notes:
        click.echo(f"note: {n}", err=True)
    replaced = replaced_note()
    if replaced:
        click.echo(f"note: {replaced}", err=True)
    for w in st.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(f"wrote {st.line()}")


@click.group(name="trace")
@click.pass_context
def trace(ctx: click.Context) -> None:
    """Streaming trace surgery: cut, filter, sample, split, merge, recompress, repair and check Kineto traces.

    Inputs and outputs may be .json, .json.gz or (with the `zstandard` package) .json.zst; files of
    any size stream through. Outputs are valid Chrome traces (this tool, HTA and Perfetto open them):
    an input with events they would refuse is refused (exit 2). An existing output file is replaced
    (a note says so); an output named for another compression than asked is refused. Nothing is
    left behind by a command that fails or is interrupted (Ctrl-C, SIGTERM).
    """
    take_replaced()
    ctx.with_resource(reading_progress(bar_factory(sys.stderr.isatty())))  # a bar for each read of a big file
    ctx.with_resource(sigterm_unwinds())  # SIGTERM unwinds like Ctrl-C (zoomer_ar/sigterm.py)


@trace.command(name="slice")
@click.argument("src", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--steps", help="Keep ProfilerStep#N..M (inclusive), e.g. 3..5 (CPU and GPU side of those steps: the kernels "
                              "and copies launched in them too). Steps the trace lacks are left out, with a note.")
@click.option("--window", help="Keep a time window START..END in ms from the rank's first complete event (as evidence times).")
@click.option("--absolute", is_flag=True, help="--window is in the trace's own timestamps (us, or ns for ns traces).")
@click.option("--compression", type=_COMPRESSION, default=None, help=_COMP_HELP)
@click.option("--level", type=int, default=None, help="Compression level.")
def slice_cmd(src: Path, out: Path, steps: str | None, window: str | None, absolute: bool, compression, level) -> None:
    """Keep steps N..M or a time window of SRC (events overlapping it are kept whole; for steps, also
    the GPU work launched in them, wherever it runs). A window that holds no event is refused (exit 2)."""
    st = ops.slice_trace(
        src, out, steps=_range(steps, "--steps", ints=True) if steps else None,  # type: ignore[arg-type]
        window_ms=_range(window, "--window") if window else None, absolute=absolute, compression=compression,
        level=level,
    )
    _done(st)


@trace.command(name="filter")
@click.argument("src", type=click.Path(exists=True, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--cat", "cats", multiple=True,
              help="Keep only these categories (repeatable), e.g. --cat kernel --cat cpu_op. Names match both schemas: "
                   "kernel~Kernel, cpu_op~Operator, cuda_runtime~Runtime, gpu_memcpy~Memcpy, gpu_memset~Memset.")
@click.option("--exclude-cat", "exclude_cats", multiple=True, help="Drop these categories, e.g. --exclude-cat python_function.")
@click.option("--name", default=None, help="Keep only events whose name matches this regular expression.")
@click.option("--exclude-name", default=None, help="Drop events whose name matches this regular expression.")
@click.option("--pid", "pids", multiple=True, help="Keep only these pids.")
@click.option("--tid", "tids", multiple=True, help="Keep only these tids.")
@click.option("--ph", "phases", multiple=True, help="Keep only these phases (X, i, s, f, ...).")
@click.option("--ranks", default=None, help="SRC is a job folder: keep these ranks, e.g. 0,2,4..7 (OUT is a folder).")
@click.option("--compression", type=_COMPRESSION, default=None, help=_COMP_HELP)
@click.option("--level", type=int, default=None, help="Compression level.")
def filter_cmd(src: Path, out: Path, cats, exclude_cats, name, exclude_name, pids, tids, phases, ranks,
               compression, level) -> None:
    """Keep chosen categories, names, pids, tids or phases of SRC (metadata events always stay).

    With a job folder as SRC, every chosen rank file is filtered into the folder OUT, under its own
    name (with --compression: the suffix of that compression, e.g. x.json -> x.json.gz)."""
    filters = dict(cats=cats, exclude_cats=exclude_cats, name=name, exclude_name=exclude_name, pids=pids, tids=tids,
                   phases=phases, compression=compression, level=level)
    if src.is_dir():
        st = ops.filter_job(src, out, ranks=_ints(ranks), **filters)
    else:
        if ranks is not None:
            raise InputError(None, "--ranks needs a job folder as SRC")
        st = ops.filter_trace(src, out, **filters)
    _done(st)


@trace.command(name="sample")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("-k", "--count", type=int, default=None, help="How many ranks (evenly spaced, first and last included).")
@click.option("--seed", type=int, default=None, help="Pick the ranks at random with this seed instead.")
@click.option("--ranks", default=None, help="Exactly these ranks, e.g. 0,3,7 or 0..3 (not with -k or --seed).")
@click.option("--compression", type=_COMPRESSION, default=None, help="Re-compress the copies (default: copy as they are).")
def sample_cmd(src: Path, out: Path, count: int | None, seed: int | None, ranks: str | None, compression) -> None:
    """Copy a sample of the ranks of the job folder SRC into the folder OUT (each rank file is read
    through first: one that is not a valid trace is skipped with a note)."""
    if count is None and ranks is None:
        raise InputError(None, "give -k N or --ranks")
    _done(ops.sample_job(src, out, count, ranks=_ints(ranks), seed=seed, compression=compression))


@trace.command(name="split")
@click.argument("src", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--steps-per-file", type=int, default=1, show_default=True, help="Steps per output file.")
@click.option("--max-files", type=int, default=256, show_default=True, help="Refuse to write more files than this.")
@click.option("--compression", type=_COMPRESSION, default="gzip", show_default=True, help="Compression of the outputs.")
def split_cmd(src: Path, out: Path, steps_per_file: int, max_files: int, compression) -> None:
    """Split SRC into one trace per ProfilerStep (in the folder OUT)."""
    _done(ops.split_trace(src, out, steps_per_file=steps_per_file, max_files=max_files, compression=compression))


@trace.command(name="merge")
@click.argument("src", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--compression", type=_COMPRESSION, default=None, help=_COMP_HELP)
@click.option("--level", type=int, default=None, help="Compression level.")
def merge_cmd(src: tuple[Path, ...], out: Path, compression, level) -> None:
    """Merge per-rank files (a job folder, or several files and folders: a folder stands for its rank
    files) into one trace OUT, one track group per rank."""
    source: Path | list[Path] = src[0] if len(src) == 1 and src[0].is_dir() else list(src)  # folders: their ranks
    _done(ops.merge_job(source, out, compression=compression, level=level))


@trace.command(name="compress")
@click.argument("src", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--zstd", "use_zstd", is_flag=True, help="zstd (needs the `zstandard` package) instead of gzip.")
@click.option("--none", "plain", is_flag=True, help="Decompress to plain JSON.")
@click.option("--level", type=int, default=None, help="Compression level (gzip 1-9, default 6; zstd 1-22, default 3).")
def compress_cmd(src: Path, out: Path, use_zstd: bool, plain: bool, level: int | None) -> None:
    """Re-compress SRC into OUT (gzip by default; the suffix of OUT decides when it is .gz/.zst/.json)."""
    if use_zstd and plain:
        raise InputError(None, "--zstd and --none exclude each other")
    comp = "zstd" if use_zstd else "none" if plain else None
    if comp is None:
        name = out.name.lower()
        comp = "zstd" if name.endswith((".zst", ".zstd")) else "none" if name.endswith(".json") else "gzip"
    _done(ops.compress_trace(src, out, compression=comp, level=level))


@trace.command(name="repair")
@click.argument("src", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--compression", type=_COMPRESSION, default=None, help=_COMP_HELP)
@click.option("--level", type=int, default=None, help="Compression level.")
def repair_cmd(src: Path, out: Path, compression, level) -> None:
    """Write OUT, a copy of SRC that HTA, Perfetto and json.load open, where the profiler wrote SRC as
    invalid JSON: event names it did not escape (with_stack Python frames holding quotes, Windows
    backslashes, control characters; pytorch/pytorch#146900) are re-escaped, every other byte kept.
    `zoomer-ar analyze` repairs such files by itself."""
    _done(ops.repair_trace(src, out, compression=compression, level=level))


def _check_targets(paths: tuple[Path, ...]) -> list[Path]:
    """The files `trace check` reads: each file named, and a folder's trace files (its ranks)."""
    from ..load.job import no_traces_reason, rank_files
    from ..stream.source import is_trace_file

    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            held = rank_files(p, is_trace_file)
            if not held:
                raise InputError(str(p), no_traces_reason(p, is_trace_file))
            files.extend(held)
        else:
            files.append(p)
    return files


@trace.command(name="check")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
def check_cmd(paths: tuple[Path, ...]) -> None:
    """Check that traces are valid Chrome traces (the structure Perfetto needs, the field types
    `zoomer-ar analyze` needs); exit 2 if not, naming the first problem. A trace without events, or
    with only metadata events, is refused as `analyze` refuses it. A folder checks its trace files
    (a job's ranks)."""
    bad: list[tuple[Path, str]] = []  # (file, its first problem)
    for p in _check_targets(paths):
        n, problems = check_trace(p)
        if problems:
            bad.append((p, problems[0]))
            click.echo(f"{p}: {n:,} events, {len(problems)} problem(s):")
            for pr in problems:
                click.echo(f"  {pr}")
        else:
            click.echo(f"{p}: valid ({n:,} events)")
    if len(bad) == 1:
        raise InputError(str(bad[0][0]), f"not a valid Chrome trace: {bad[0][1]}")
    if bad:
        raise InputError(f"{len(bad)} files", f"not valid Chrome traces (first: {bad[0][0]}: {bad[0][1]})")


commands = [trace]
