"""`zoomer-ar analyze`: trace (file or rank folder) -> terminal summary + findings.json, report.md, report.html."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import click

from .analyze import analyze_path
from .errors import InputError
from .fix.catalogue import FACT_UNLOCKS  # opt-in fixers a job's recorded facts select
from .load.job import job_name_of, missing_reason, recorded_job
from .load.reader import reading_progress
from .progress import bar_factory
from .render import render_html, render_markdown, render_text, write_outputs
from .render.report import findings_json
from .same_input import is_same_input
from .store.options import apply_store_options, job_name, record_options, refuse_record_only  # --record and cost attribution (zoomer_ar/store)



def unlocked_by_facts(job_facts: dict, has_accelerator: bool = False) -> set[str]:
    """The opt-in fixers whose FACT_UNLOCKS condition the recorded job facts (and the trace) meet."""
    out = set()
    for name, (section, key, host_only) in FACT_UNLOCKS.items():
        value = job_facts.get(section)
        if isinstance(value, dict) and value.get(key) is True and not (host_only and has_accelerator):
            out.add(name)
    return out


def _ran_on_accelerator(analysis) -> bool:
    return bool((analysis.features or {}).get("has_accelerator"))


def patch_fixers(findings, fix_select: str | None = None, unlocked: set[str] | frozenset = frozenset()
                 ) -> tuple[list[str], list[str]]:
    """(fixers patch.diff runs, opt-in fixers held back): every non-opt-in fixer of a finding's
    pattern, plus what ``--fix-select`` names (fixer names or pattern ids, opt-in ones included),
    plus the opt-in fixers in ``unlocked`` (see unlocked_by_facts) of the findings' patterns."""
    from .fix.engine import split_ids
    from .fix.registry import load_registry

    reg = load_registry()
    explicit = {f.name for f in reg.resolve(split_ids(fix_select))} if fix_select else set()
    chosen, held = set(explicit), set()
    for pattern in {f.pattern for f in findings if f.fixers}:
        for fixer in reg.by_pattern(pattern):
            if not fixer.opt_in or fixer.name in unlocked:
                chosen.add(fixer.name)
            elif fixer.name not in explicit:
                held.add(fixer.name)
    return sorted(chosen), sorted(held)


def write_fix_outputs(analysis, target: Path, source_dir: Path | None, trace_path: Path,
                      fixers: list[str] | None = None, notes: list[str] | None = None) -> dict[str, Path]:
    """patch.diff (with --source: the ``fixers`` given, else patch_fixers' default choice),
    relaunch.yaml and optimize.ipynb beside the reports; ``notes`` receives a line for each
    finding whose fixers ran and changed nothing (so a finding without a patch is never silent)."""
    from .notebook import notebook_json
    from .relaunch import render_spec, spec_from_analysis
    from .render.report import atomic_write

    out: dict[str, Path] = {}
    patch_name = None
    patched: set[str] = set()
    job = recorded_job(trace_path)  # the capture helper's job.json: read once
    if source_dir is not None:
        from .fix.api import run_directory
        from .sourcemap import files_ran, patch_scopes

        if fixers is None:
            fixers = patch_fixers(analysis.findings, None, unlocked_by_facts(job, _ran_on_accelerator(analysis)))[0]
        only = files_ran(analysis)
        # nothing located in the traced code: nothing to patch (map_sources' note says why)
        # and in them only the functions the findings point at (their frames' and located statements')
        result = (run_directory(source_dir, select=fixers, only=only, scopes=patch_scopes(analysis, source_dir))
                  if fixers and only else None)
        if result is not None and notes is not None:
            notes.extend(_skipped_source_notes([f.error_line() for f in result.skipped]))
            notes.extend(f"source: notebook cells left out (not patched, the other cells were), {f.error_line()}"
                         for f in result.files if f.left_out)
        diff = result.diff_bytes() if result else b""
        if diff:
            atomic_write(target / "patch.diff", diff)
            out["patch.diff"] = target / "patch.diff"
            patch_name = "patch.diff"
            patched = {m.pattern for f in result.changed for m in f.findings if m.fixable}
        if notes is not None and result is not None:
            from .fix.registry import load_registry

            reg = load_registry()
            unread = {Path(f.path).as_posix() for f in result.skipped}
            read = [p for p in only if Path(p).as_posix() not in unread]  # a file that did not parse has its own note
            where = ", ".join(Path(p).name for p in read)
            for f in analysis.findings:  # a finding's `fixers` are pattern ids; patch.diff ran fixer names
                ran = sorted({fx.name for p in f.fixers for fx in reg.by_pattern(p) if fx.name in fixers})
                if ran and read and f.pattern not in patched:
                    held = sorted({fx.name for p in f.fixers for fx in reg.by_pattern(p)
                                   if fx.opt_in and fx.name not in fixers})
                    lead, rest = ((f"patch.diff has no fix for {f.pattern}",  # an opt-in one may make one
                                   f"the opt-in {', '.join(held)} was left out (--fix-select {','.join(held)} adds it)")
                                  if held else (f"no automatic fix for {f.pattern}", "its recommendation says what to do"))
                    notes.append(f"{lead}: {', '.join(ran)} found nothing to change in {where}; {rest}")
    spec = spec_from_analysis(analysis, argv=_recorded_argv(job), patch=patch_name, source_dir=source_dir,
                              **_recorded_launch(job),
                              patched=patched)
    atomic_write(target / "relaunch.yaml", render_spec(spec))
    out["relaunch.yaml"] = target / "relaunch.yaml"
    atomic_write(target / "optimize.ipynb", notebook_json(analysis, has_patch=patch_name is not None))
    out["optimize.ipynb"] = target / "optimize.ipynb"
    return out


def _recorded_argv(job: dict) -> list[str] | None:
    """The job's command line from the capture helper's job.json (its ``sys.argv``), as recorded:
    every argument the program ran with, its required ones (--out) included, or the relaunch fails."""
    argv = job.get("argv")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return None
    return list(argv)


MAX_SKIPPED_NOTES = 5


def _skipped_source_notes(errors: list[str]) -> list[str]:
    """A note per source file the fixers could not read (does not parse, too large, too deeply
    nested): no patch touches it, and the user should know why (``zoomer-ar fix`` says so too)."""
    out = [f"source: not patched, {line}" for line in errors[:MAX_SKIPPED_NOTES]]
    if len(errors) > MAX_SKIPPED_NOTES:
        out.append(f"source: {len(errors) - MAX_SKIPPED_NOTES} more files not patched for the same reasons "
                   "(`zoomer-ar fix` lists them)")
    return out


def _recorded_launch(job: dict) -> dict[str, str | None]:
    """How job.json says the job was started: its interpreter (``python``) and, for ``python -m
    NAME``, the module (``module``); None where it does not say (a job.json of an older capture)."""
    python, module = job.get("executable"), job.get("module")
    return {"python": python if isinstance(python, str) and python else None,
            "module": module if isinstance(module, str) and module else None}


#: every file ``analyze`` writes into its output folder: what a new run does not write is removed,
#: so a reused folder never pairs new findings with an earlier run's patch or spec
OUTPUT_FILES = ("findings.json", "report.md", "report.html", "patch.diff", "relaunch.yaml", "optimize.ipynb")
default_job_name = job_name_of  # the job's name when --name is not given (load/job.py)


def _holds_other_input(folder: Path, path: Path) -> bool:
    """True when ``folder`` holds something other than this input's earlier results: another
    input's findings.json (same_input.py: by path, or by its rank files when runs started from
    different folders share zoomer-out/), or files that are not findings at all."""
    if not folder.exists():
        return False
    if not folder.is_dir():
        return True
    if not any(folder.iterdir()):
        return False
    try:
        recorded = json.loads((folder / "findings.json").read_text(encoding="utf-8"))["job"]
        return not is_same_input(recorded, path)
    except (OSError, ValueError, KeyError, TypeError):
        return True


def refuse_out_in_job(out_dir: Path, job: Path) -> None:
    """--out that is the input job folder or inside it: refused before any work (exit 2). The reports
    would land among the rank files, and a later analysis of the folder reads them with the ranks
    (findings.json skipped with a note on every run)."""
    out_real, job_real = Path(os.path.realpath(out_dir)), Path(os.path.realpath(job))
    same = out_real == job_real or (out_dir.exists() and os.path.samefile(out_dir, job))  # a bind mount too
    if same or job_real in out_real.parents:
        where = "is the input job folder" if same else "is inside the input job folder"
        raise InputError(str(out_dir), f"--out {where} {job}; give a folder outside it (or leave --out out: "
                                       "zoomer-out/<job>)")


def default_out_dir(job_name: str, path: Path, root: Path = Path("zoomer-out")) -> Path:
    """``root/<job>``, or ``<job>-2``, ``-3``... when that folder holds another input's results:
    two traces with the same name (worker0 of two runs) never overwrite each other, and analysing
    the same input again reuses its folder. The job's name is made one folder name (folder_name): a
    --name of `../x` or `team/run` wrote outside root or below it."""
    job_name = folder_name(job_name)
    candidate, n = root / job_name, 1
    while _holds_other_input(candidate, path):
        n += 1
        candidate = root / f"{job_name}-{n}"
    return candidate


def default_out_root(path: Path) -> tuple[Path, Path | None]:
    """Where zoomer-out/ goes without --out: the current folder, except when the input is a rank folder
    that holds the current folder (`cd job && zoomer-ar analyze .`): the reports would sit inside the
    rank folder, where an --out is refused (refuse_out_in_job); zoomer-out/ then goes beside the rank
    folder, and the second item names the rank folder (for the note that says so). A rank folder with
    no folder beside it (`/`) is refused."""
    root = Path("zoomer-out")
    if not path.is_dir():
        return root, None
    job_real = Path(os.path.realpath(path))
    if job_real not in Path(os.path.realpath(root)).parents:
        return root, None
    if job_real.parent == job_real:
        raise InputError(str(path), "the default output folder would be inside the input job folder; "
                                    "give --out a folder outside it")
    return Path(os.path.relpath(job_real.parent / "zoomer-out")), job_real


def folder_name(job_name: str) -> str:
    """The job's name as one folder name inside zoomer-out/: path separators become `_`, and a name
    that would name no folder of its own (empty, `.`, `..`) gets a `_` in front."""
    name = job_name.replace("/", "_").replace("\\", "_").replace("\0", "_")
    return name if name.strip(".").strip() else f"_{name}"


def prepare_out_dir(out_dir: Path) -> list[Path]:
    """Create the output folder before the analysis runs, so a folder that cannot be one (an
    existing file, a read-only place) is a one-line input error, not an internal error after the
    work; returns the folders it created (removed again if the analysis fails)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(str(out_dir), "--out is an existing file, not a folder")
    missing = [p for p in [out_dir, *out_dir.parents] if not p.exists()][::-1]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out_dir, prefix=".zoomer-probe.", delete=True)
        probe.close()
    except OSError as exc:
        _remove_empty(missing)
        raise InputError(str(out_dir), f"cannot write the output folder ({exc.strerror or exc})") from None
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders prepare_out_dir made (deepest first) when they are still empty: a failed
    analysis leaves no empty zoomer-out/<job> behind."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return


def had_outputs(target: Path) -> bool:
    """True when ``target`` already holds an analysis (its findings.json): only then are files
    named like this tool's outputs taken for an earlier run's, never in a folder of the user's."""
    return (target / "findings.json").is_file()


def remove_stale_outputs(target: Path, written: dict[str, Path]) -> list[str]:
    """Remove this tool's output files (OUTPUT_FILES, by name) that this run did not write; other
    files in the folder are the user's and stay."""
    removed = []
    for name in OUTPUT_FILES:
        stale = target / name
        if name not in written and stale.is_file():
            stale.unlink()
            removed.append(name)
    return removed


def write_all_outputs(analysis, target: Path, source_dir: Path | None, trace_path: Path, fixers: list[str],
                      notes: list[str]) -> dict[str, Path]:
    """The reports and the fix outputs, rendered into a hidden folder in ``target`` and only then moved
    into place, findings.json last: Ctrl-C or a failure while they are rendered (the fixers on a large
    --source tree take seconds) leaves the folder as it was, never a new findings.json beside an
    earlier run's reports or patch, nor a findings.json without its reports."""
    import shutil

    from .errors import OutputError

    try:
        staging = Path(tempfile.mkdtemp(dir=target, prefix=".zoomer-writing."))
    except OSError as exc:
        raise OutputError(str(target), f"cannot write the output folder ({exc.strerror or exc})") from None
    try:
        staged = write_outputs(analysis, staging)
        staged.update(write_fix_outputs(analysis, staging, source_dir, trace_path, fixers, notes))
        written: dict[str, Path] = {}
        for name in sorted(staged, key=lambda n: n == "findings.json"):
            written[name] = _move_into_place(staged[name], target / name)
        return written
    except OutputError as exc:  # named as the file it stands for, not its staged copy
        staged_path = Path(exc.path)
        if staged_path.parent == staging:
            raise OutputError(str(target / staged_path.name), exc.reason) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(src: Path, dest: Path) -> Path:
    """``src`` renamed over ``dest``; a ``dest`` that is not a regular file (/dev/null, a FIFO) is
    written into, never replaced, as render.report.atomic_write does."""
    from .errors import OutputError
    from .render.report import is_special_file

    try:
        if is_special_file(dest):
            with open(dest, "wb") as fh:
                fh.write(src.read_bytes())
        else:
            os.replace(src, dest)
    except OSError as exc:
        raise OutputError(str(dest), exc.strerror or str(exc)) from None
    return dest


def _sigterm_unwinds(command):
    """SIGTERM (a job scheduler's stop) unwinds the command like Ctrl-C: the output folder it made,
    temporary files and --steps cuts are removed, exit 143 (zoomer_ar/sigterm.py)."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        from .sigterm import sigterm_unwinds

        with sigterm_unwinds():
            return command(*args, **kwargs)

    return run


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Folder for findings.json, report.md, report.html, relaunch.yaml, optimize.ipynb and, with "
                   "--source, patch.diff (default: zoomer-out/<job>, "
                   "or <job>-2, -3... when that holds another input's results; zoomer-out/ goes beside the "
                   "rank folder when the current folder is inside it).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "md", "html"]), default="text", show_default=True,
              help="What to print on stdout.")
@click.option("--name", default=None, callback=job_name,
              help="Job name (default: the file or folder name); no control characters.")
@click.option("--source", "source_dir", type=click.Path(path_type=Path), default=None,
              help="The training code (a folder): map findings to source lines and write patch.diff, the fixers' "
                   "changes to the functions the findings point at.")
@click.option("--fix-select", default=None, metavar="IDS",
              help="Also apply these fixers (names or pattern ids, comma-separated) in patch.diff, opt-in ones included.")
@click.option("--no-files", is_flag=True, help="Print only; write no files (no --out folder, no zoomer-out/).")
@click.option("--progress/--no-progress", default=None, help="Progress bar on long loads (default: when stderr is a terminal).")
# --- hook (docs/huge-traces.md): streaming path and annotated trace
@click.option("--stream/--no-stream", "stream", default=None,
              help="Streaming analysis (default: above ZOOMER_STREAM_THRESHOLD, 512 MiB of JSON).")
@click.option("--annotate", "annotate_out", type=click.Path(path_type=Path), default=None,
              help="Write the trace with markers at each finding's worst events (e.g. OUT.json.gz; Perfetto).")
@click.option("--steps", "steps_text", default=None, metavar="N..M",
              help="Analyse only ProfilerStep#N..#M of each rank (cut out first by the streaming `trace slice`, "
                   "into a temporary folder: any trace size, little memory).")
# --- end hook
@record_options
@_sigterm_unwinds
def analyze(path: Path, out_dir: Path | None, fmt: str, name: str | None, source_dir: Path | None,
            fix_select: str | None, no_files: bool, progress: bool | None, stream: bool | None = None,
            annotate_out: Path | None = None, steps_text: str | None = None, **store_opts) -> None:
    """Analyse a Kineto trace (a .json/.json.gz file, or a folder of per-rank files as one job)."""
    show = sys.stderr.isatty() if progress is None else progress
    refuse_record_only(store_opts)  # --team, --week... without --record: before any work
    if no_files and out_dir is not None:  # options that would be silently ignored
        raise click.UsageError("--out names the folder for the report files, and --no-files writes none: give one")
    if fix_select and source_dir is None:
        raise click.UsageError("--fix-select chooses the fixers of patch.diff, which needs --source (the training code)")
    if fix_select and no_files:
        raise click.UsageError("--fix-select chooses the fixers of patch.diff, and --no-files writes no patch.diff")
    if fix_select:  # an unknown id is a one-line error before any work
        patch_fixers([], fix_select)
    if source_dir is not None and not source_dir.is_dir():  # so is a --source that is no folder
        reason = ("a file, not a folder: give --source the folder that holds the program" if source_dir.exists()
                  else "source folder not found")
        raise InputError(str(source_dir), reason)
    from .stream import check_stream_settings

    check_stream_settings()  # a bad ZOOMER_STREAM or ZOOMER_STREAM_THRESHOLD: exit 2 before --steps cuts anything
    steps = None
    if steps_text is not None:  # a window of steps (zoomer_ar/step_window.py): refused before any work
        from .step_window import parse_steps

        steps = parse_steps(steps_text)
        if annotate_out is not None:
            raise click.UsageError("--annotate marks the whole trace: with --steps, cut the steps out first "
                                   "(`zoomer-ar trace slice TRACE OUT --steps N..M`) and annotate that")
        if not path.exists():
            raise InputError(str(path), missing_reason(path))
    name = name or default_job_name(path)
    if out_dir is not None and path.is_dir():  # the reports would sit among the ranks (findings.json read as one)
        refuse_out_in_job(out_dir, path)
    if annotate_out is not None:  # never over the trace itself, nor into its rank folder
        from .annotate import is_file_output, refuse_own_inputs
        from .load.job import rank_files
        from .surgery.guard import refuse_dir_as_file, refuse_file_as_dir, refuse_inside

        if is_file_output(annotate_out):  # else a folder: one annotated copy per trace file in it
            refuse_dir_as_file(annotate_out)
        else:
            refuse_file_as_dir(annotate_out)
        if path.is_dir():
            refuse_inside(annotate_out, path, what="annotated trace")
        try:  # nor over a trace file of the job under another name (a rank folder of links to OUT's files)
            refuse_own_inputs(annotate_out, rank_files(path) if path.is_dir() else [path])
        except OSError:  # an unreadable folder: the analysis says so
            pass
    target: Path | None = None  # --no-files: no folder is chosen (that reads zoomer-out/ and may hash the input)
    if out_dir is not None:
        target = out_dir
    elif not no_files:
        root, around = default_out_root(path)
        target = default_out_dir(name, path, root)
        if around is not None:
            click.echo(f"note: the current folder is inside the rank folder {around}: the reports go to {target}, "
                       "beside it, not among its rank files (--out chooses another folder)", err=True)
    created = [] if target is None else prepare_out_dir(target)
    try:
        bars = bar_factory(show)
        with reading_progress(bars):
            if steps is None:
                analysis = analyze_path(path, name=name, progress_factory=bars, stream=stream)
            else:
                analysis = _analyze_steps(path, steps, name, bars, stream)
        if source_dir is not None:
            from .sourcemap import map_sources

            analysis = map_sources(analysis, source_dir)
        analysis = apply_store_options(analysis, store_opts)  # cost attribution; stores it with --record
    except BaseException:  # a store that cannot be reached, Ctrl-C: no empty output folder left behind
        _remove_empty(created)
        raise
    unlocked = unlocked_by_facts(recorded_job(path), _ran_on_accelerator(analysis)) if source_dir is not None else set()
    chosen, held = patch_fixers(analysis.findings, fix_select, unlocked) if source_dir is not None else ([], [])
    if target is not None:
        earlier = had_outputs(target)
        fix_notes: list[str] = []
        try:
            written = write_all_outputs(analysis, target, source_dir, path, chosen, fix_notes)
        except BaseException:
            _remove_empty(created)
            raise
        for line in fix_notes:
            click.echo(f"note: {line}", err=True)
        removed = remove_stale_outputs(target, written) if earlier else []
        if fmt != "text":  # the text summary lists the files; other formats own stdout
            click.echo(f"zoomer-ar: wrote {target}{os.sep}", err=True)
    if annotate_out is not None:  # hook (zoomer_ar/annotate.py)
        from .annotate import annotate

        from .surgery.io import replaced_note, take_replaced

        take_replaced()
        with reading_progress(bar_factory(show)):  # the copy reads each trace again: a bar each
            report = annotate(analysis, annotate_out)
        click.echo(report.line(), err=True)
        replaced = replaced_note()
        if replaced:  # as the trace commands say it
            click.echo(f"note: {replaced}", err=True)
    if fmt == "json":
        click.echo(findings_json(analysis), nl=False)
    elif fmt == "md":
        click.echo(render_markdown(analysis), nl=False)
    elif fmt == "html":
        click.echo(render_html(analysis), nl=False)
    else:
        click.echo(render_text(analysis), nl=False)
        if target is not None:
            click.echo(f"\nwrote {', '.join(str(p) for p in written.values())}")
            if removed:
                click.echo(f"removed from {target} (an earlier run's, not this one's): {', '.join(removed)}")
            for name in sorted(unlocked & set(chosen)):
                section, key, host_only = FACT_UNLOCKS[name]
                why = " and the trace shows no accelerator" if host_only else ""
                # "selected", not "included": it ran on the source, and a note says when it found nothing to change
                click.echo(f"opt-in fix {name} selected (job.json records {section}.{key} = true{why})")
            if held:
                click.echo(f"opt-in fixes left out of patch.diff: {', '.join(held)} (add them with --fix-select; "
                           "docs/fixers.md says why each is opt-in)")


def _analyze_steps(path: Path, steps: tuple[int, int], name: str, bars, stream: bool | None):
    """analyze --steps: each rank cut to the steps in a temporary folder, analysed, told as `path`'s."""
    from .step_window import cut_steps, name_originals, told_as_originals

    with tempfile.TemporaryDirectory(prefix="zoomer-steps-") as tmp:  # SIGTERM unwinds (_sigterm_unwinds): the cuts go too
        cut, originals, skipped, notes = cut_steps(path, steps, Path(tmp), progress_factory=bars)
        try:
            analysis = analyze_path(cut, name=name, progress_factory=bars, stream=stream)
        except InputError as exc:  # said of the files given, not of the temporary cuts
            raise told_as_originals(exc, Path(tmp), path, originals) from None
    return name_originals(analysis, path, steps, originals, skipped, notes)


commands = [analyze]
