"""`analyze` options for recording and cost attribution (`--record`, `--job`, `--gpu-hours`, ...).

Kept free of SQLAlchemy imports: `analyze` without `--record` never loads the database packages.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from ..models import Analysis
from . import weeks as W
from .cost import cost_attribution

RECORD_ONLY = ("job", "team", "owner", "gpu_type", "week", "recorded_at", "db")


def _week(_ctx, _param, value):  # noqa: ANN001
    if value is None:
        return None
    try:
        return W.parse_week(value)
    except W.WeekError as exc:
        raise click.BadParameter(str(exc)) from None


def _finite(_ctx, _param, value):  # noqa: ANN001
    # FloatRange lets nan through (every comparison with it is false) and inf past a min-only range
    if value is not None and not math.isfinite(value):
        raise click.BadParameter("must be a finite number")
    return value


def check_name(value: str, what: str) -> str:
    """`value` as a stored job, team or owner name; ValueError (one line) when it is empty, starts or ends with
    spaces, or holds a control or format character (a newline, NUL, ESC...: it would break every report, the
    digest's tables and history's lines). The service refuses the same characters (service.names.bad_chars)."""
    from ..service.names import bad_chars

    if not value.strip():
        raise ValueError(f"{what} may not be empty")
    bad = bad_chars(value)
    if bad:
        raise ValueError(f"{what} {value!r} holds a control character ({', '.join(repr(c) for c in bad)})")
    if value != value.strip():
        raise ValueError(f"{what} {value!r} may not start or end with spaces")
    from .names import canonical

    return canonical(value)  # one spelling of café (store/names.py)


def _name(what: str) -> Callable:
    def callback(_ctx, _param, value):  # noqa: ANN001, ANN202
        if value is None:
            return None
        try:
            return check_name(value, what)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return callback


job_name = _name("job name")
team_name = _name("team name")
owner_name = _name("owner name")


def _time(_ctx, _param, value):  # noqa: ANN001
    if value is None:
        return None
    try:
        return W.parse_time(value)
    except W.WeekError as exc:
        raise click.BadParameter(str(exc)) from None


def job_options(f: Callable) -> Callable:
    """Job, GPU, price and week options shared by `analyze --record` and `record`."""
    opts = [
        click.option("--job", default=None, callback=job_name,
                     help="Job name in the store (default: the analysis's job name: analyze's --name, else the trace's name)."),
        click.option("--team", default=None, callback=team_name, help="Team the job belongs to."),
        click.option("--owner", default=None, callback=owner_name, help="Owner of the job (person or alias)."),
        click.option("--gpu-type", default=None, callback=_name("GPU type"),
                     help="GPU model (default: from the trace's device properties)."),
        click.option("--gpus", type=click.IntRange(min=0, max=2**31 - 1), default=None,
                     help="GPUs the job runs on (default: the job's stored count, else the trace's world size)."),
        click.option("--gpu-hours", type=click.FloatRange(min=0, max=1e12), default=None, callback=_finite,
                     help="The job's GPU-hours this run stands for, e.g. its week (default: profiled wall time x GPUs)."),
        click.option("--gpu-hour-cost", type=click.FloatRange(min=0, max=1e6), default=None, metavar="USD", callback=_finite,
                     help="Price of one GPU-hour in dollars (default: the job's stored price)."),
        click.option("--week", default=None, callback=_week, metavar="YYYY-Www",
                     help="ISO week to record under, e.g. 2026-W48 (default: the trace's start time, else now)."),
        click.option("--recorded-at", default=None, callback=_time, metavar="ISO-TIME",
                     help="When the job ran (sets the week when --week is not given)."),
        click.option("--db", default=None, metavar="URL",
                     help="Store: SQLAlchemy URL or SQLite file (default: $ZOOMER_DB, else the user data folder)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def record_options(f: Callable) -> Callable:
    """All store options of `analyze`: --record plus job_options, those of RECORD_ONLY saying in their
    help that they need --record (refuse_record_only refuses them without it)."""
    f = job_options(f)
    for param in getattr(f, "__click_params__", []):
        if param.name in RECORD_ONLY:
            param.help = f"{param.help} Needs --record."
    return click.option("--record", is_flag=True, help="Store the analysis (see `zoomer-ar digest`, `zoomer-ar history`).")(f)


def record_options_from(store_opts: dict[str, Any]):
    from .record import RecordOptions

    return RecordOptions(
        job=store_opts.get("job"), team=store_opts.get("team"), owner=store_opts.get("owner"),
        gpu_type=store_opts.get("gpu_type"), gpus=store_opts.get("gpus"), gpu_hours=store_opts.get("gpu_hours"),
        gpu_hour_cost=store_opts.get("gpu_hour_cost"), week=store_opts.get("week"),
        recorded_at=store_opts.get("recorded_at"),
    )


def describe(result) -> str:  # noqa: ANN001 - RecordResult
    verb = {"recorded": "recorded", "exists": "already recorded", "refreshed": "re-recorded (newer version)"}[result.status]
    dev = str((result.cost or {}).get("hours_unit") or "GPU-hours").removesuffix("-hours")  # accelerator on MTIA
    price = f", ${result.gpu_hour_cost:,.2f}/{dev}-h" if result.gpu_hour_cost is not None else ""
    return (f"{verb}: job {result.job}, week {result.week}, {result.gpus} {dev}{'s' if result.gpus != 1 else ''}, "
            f"{result.gpu_hours:.6g} {dev}-hours{price} (analysis #{result.analysis_id})")


def refuse_record_only(store_opts: dict[str, Any]) -> None:
    """A store-only option (--team, --week, --db...) without --record is a usage error: checked by
    `analyze` before any work, so a typo costs no analysis and leaves no output folder."""
    if not store_opts.get("record"):
        given = [k for k in RECORD_ONLY if store_opts.get(k) is not None]
        if given:
            raise click.UsageError(f"--{given[0].replace('_', '-')} needs --record")


def apply_store_options(analysis: Analysis, store_opts: dict[str, Any], *, default_job: str | None = None) -> Analysis:
    """Attach the cost attribution to `analysis.features["cost_attribution"]`; with --record, store it first."""
    refuse_record_only(store_opts)
    if not store_opts.get("record"):
        cost = cost_attribution(analysis.features, analysis.findings, gpus=store_opts.get("gpus"),
                                gpu_hours=store_opts.get("gpu_hours"), gpu_hour_cost=store_opts.get("gpu_hour_cost"))
    else:
        from .record import record_analysis

        opts = record_options_from(store_opts)
        opts.job = opts.job or default_job
        result = record_analysis(analysis, opts, db=store_opts.get("db"))
        click.echo(describe(result), err=True)
        cost = result.cost
    analysis.features["cost_attribution"] = cost
    return analysis
