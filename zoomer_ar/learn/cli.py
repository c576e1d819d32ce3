"""Commands: `corpus build|stats|sample`, `train`, `evaluate`, `models list|promote|rollback`, `label`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from ..errors import InputError
from ..models import PATTERN_IDS

P = lambda: click.Path(path_type=Path)  # noqa: E731


def _models_root(models: Path | None) -> Path:
    from ..detect.ensemble import models_dir

    return Path(models) if models else models_dir()


def _must_exist(path: Path | None, what: str) -> None:
    """An explicit path that does not exist is an error (exit 2), never silently ignored."""
    if path is not None and not Path(path).exists():
        raise InputError(str(path), f"no such file or directory ({what})")


def _real_traces(traces: Path | None) -> Path:
    """--traces (must exist and hold LABELS.yaml) or the default ../shared/traces."""
    from .corpus import DEFAULT_TRACES

    if traces is None:
        return DEFAULT_TRACES
    _must_exist(traces, "--traces: the real traces with LABELS.yaml")
    if not (Path(traces) / "LABELS.yaml").is_file():
        raise InputError(str(traces), "no LABELS.yaml in this folder (--traces: the real traces with their labels)")
    return Path(traces)


@click.group()
def corpus() -> None:
    """The labelled training corpus (training_data/corpus/)."""


@corpus.command("build")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder for corpus.jsonl and MANIFEST.json (default training_data/corpus).")
@click.option("--n-synth", type=click.IntRange(min=0), default=4600, show_default=True, help="Synthetic jobs from the trace generator (with the examples and augmentations: ~5,100 cases).")
@click.option("--augment", "augment", type=click.IntRange(min=0), default=24, show_default=True, help="Augmented variants per real trace.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--small", is_flag=True, help="CI size: few example windows, five small real backgrounds.")
@click.option("--traces", type=P(), default=None, help="Real traces with LABELS.yaml (default ../shared/traces).")
@click.option("--examples", type=P(), default=None, help="Recorded scenario traces (default examples/traces).")
def corpus_build(out, n_synth, augment, seed, workers, small, traces, examples) -> None:
    """Build the corpus: scenario example traces, generated GPU/multi-rank jobs, augmented real traces."""
    from .corpus import DEFAULT_OUT, BuildConfig, build

    cfg = BuildConfig(n_synth=n_synth, augment_per_source=augment, seed=seed, workers=workers, small=small)
    if traces:
        cfg.traces = str(_real_traces(traces))
    if examples:
        _must_exist(examples, "--examples: the recorded scenario traces")
        cfg.examples = str(examples)
    warn = lambda s: click.echo(f"zoomer-ar: warning: {s}", err=True)  # noqa: E731
    if not (Path(cfg.traces) / "LABELS.yaml").is_file():
        warn(f"no LABELS.yaml under {cfg.traces}: the corpus gets no augmented real traces (give --traces)")
    if not Path(cfg.examples).is_dir():
        warn(f"no recorded example traces at {cfg.examples}: the corpus gets no example cases (give --examples)")
    m = build(cfg, Path(out) if out else DEFAULT_OUT, log=lambda s: click.echo(s, err=True))
    click.echo(f"{m['cases']} cases ({', '.join(f'{k} {v}' for k, v in m['by_source'].items())}) in {m['build_seconds']:.1f} s")
    click.echo(f"wrote {(Path(out) if out else DEFAULT_OUT) / 'corpus.jsonl'}")


@corpus.command("stats")
@click.argument("path", type=P(), required=False)
def corpus_stats(path) -> None:
    """Label counts per anti-pattern and source."""
    from .corpus import DEFAULT_OUT, label_counts, load_corpus

    cases = load_corpus(Path(path) if path else DEFAULT_OUT)  # InputError (one line) for a missing or bad corpus
    by_src: dict[str, int] = {}
    for c in cases:
        by_src[c.source] = by_src.get(c.source, 0) + 1
    click.echo(f"{len(cases)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(by_src.items())))
    click.echo(f"{'anti-pattern':25s} {'positive':>8s} {'negative':>8s} {'unknown':>8s}")
    for p, c in label_counts(cases).items():
        click.echo(f"{p:25s} {c['positive']:8d} {c['negative']:8d} {c['unknown']:8d}")


@corpus.command("sample")
@click.argument("seed", type=int)
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder for the generated rank-<r>.json traces and labels.yaml.")
@click.option("--plant", multiple=True, type=click.Choice(PATTERN_IDS), help="Force planted patterns.")
def corpus_sample(seed, out, plant) -> None:
    """Write one generated job as Kineto trace files (to look at, or to `analyze`)."""
    from ..synth.documents import write_documents
    from ..synth.generator import generate

    g = generate(seed, list(plant) if plant else None)
    out = Path(out)
    write_documents(g.documents, out)
    import yaml

    doc = json.loads(json.dumps({"labels": g.labels, "costs": g.costs, "truth": g.truth, "spec": g.spec.to_dict()},
                                default=float))
    (out / "labels.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))  # not *.json: analyze would try it as a trace
    click.echo(f"wrote {len(g.documents)} rank file(s) and labels.yaml to {out}; planted: {', '.join(g.spec.planted) or 'nothing'}")


@click.command("train")
@click.option("--data", type=P(), default=None, help="Corpus folder or corpus.jsonl (default training_data/corpus).")
@click.option("--out", type=P(), default=None, help="Model registry folder (default models/).")
@click.option("--labels", type=P(), default=None, help="Human verdicts (default: training_data/labels.jsonl under the current folder).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--traces", type=P(), default=None, help="Real traces for the card's evaluation (default ../shared/traces).")
@click.option("--cache", type=P(), default=None, help="Cache folder for real-trace features.")
@click.option("--promote", is_flag=True, help="Promote the new version through the gate.")
@click.option("--allow-dropped-labels", is_flag=True,
              help="With --promote: accept a version without a booster for a label the current model covers.")
def train_cmd(data, out, labels, seed, traces, cache, promote, allow_dropped_labels) -> None:
    """Train one LightGBM model per anti-pattern (grouped CV, calibration, thresholds); writes models/<version>/."""
    from .train import TrainConfig, train

    cfg = TrainConfig(seed=seed)
    if data:
        cfg.data = str(data)
    if out:
        cfg.out = str(out)
    if labels:
        cfg.labels = str(labels)
    if traces:
        cfg.traces = str(_real_traces(traces))
    if cache:
        cfg.cache = str(cache)
    if labels:
        _must_exist(labels, "--labels: the human verdicts file")
        if not Path(labels).is_file():
            raise InputError(str(labels), "not a file (--labels: the human verdicts JSONL)")
    if not Path(cfg.data).exists():
        raise InputError(cfg.data, "no corpus here: run `zoomer-ar corpus build` first")
    d = train(cfg, log=lambda s: click.echo(s, err=True))
    meta = json.loads((d / "meta.json").read_text())
    from .evaluate import format_corpus_table, format_real_table

    click.echo(format_corpus_table(meta["held_out"], f"Held-out corpus ({meta['data']['held_out']} cases)"))
    if meta.get("real"):
        click.echo(format_real_table(meta["real"]))
    click.echo(f"model {meta['version']} written to {d}")
    if promote:
        _promote(Path(cfg.out), meta["version"], traces, cache, False, allow_dropped_labels)


@click.command("evaluate")
@click.option("--model", "version", default=None, help="Model version (default CURRENT) or a version folder.")
@click.option("--models", type=P(), default=None, help="Model registry folder (default models/).")
@click.option("--data", type=P(), default=None, help="Corpus to score the held-out part of (default: the model's).")
@click.option("--traces", type=P(), default=None, help="Real traces with LABELS.yaml (default ../shared/traces).")
@click.option("--cache", type=P(), default=None, help="Cache folder for real-trace features.")
@click.option("--json", "as_json", is_flag=True, help="Print the evaluation as JSON.")
def evaluate_cmd(version, models, data, traces, cache, as_json) -> None:
    """Rules alone vs model alone vs ensemble, per anti-pattern: held-out corpus and real traces."""
    from ..detect.ensemble import schema_compatible, schema_mismatch_reason
    from .cases import held_out
    from .corpus import load_corpus
    from .evaluate import DEFAULT_CACHE, evaluate_cases, evaluate_real, format_corpus_table, format_real_table
    from .model import ModelBundle
    from .registry import current

    root = _models_root(models)
    if version and Path(version).is_dir():
        vdir = Path(version)
    else:
        v = version or current(root)
        if not v:
            raise InputError(str(root), "no model: give --model or promote one (`zoomer-ar models promote`)")
        vdir = root / v
    if not (vdir / "meta.json").is_file():
        raise InputError(str(vdir), "not a model version folder (no meta.json)")
    _must_exist(data, "--data: the corpus to score")
    traces_p = _real_traces(traces)
    bundle = ModelBundle(vdir)  # ModelLoadError (one line, exit 2) for a bad meta.json or booster
    if not schema_compatible(bundle.feature_schema_version):
        raise InputError(str(vdir), schema_mismatch_reason(bundle.version, bundle.feature_schema_version))
    out: dict = {"version": bundle.version, "warnings": []}
    from .train import resolve_project_path

    corpus_path = Path(data) if data else resolve_project_path(bundle.meta["data"]["corpus"])
    if corpus_path.exists():
        every = load_corpus(corpus_path)
        held = [c for c in every if c.source != "verdict" and held_out(c.group)]
        # the cases analyze would run the model on: the same feature-schema major version (schema_compatible)
        cases = [c for c in held if schema_compatible(bundle.feature_schema_version, c.feature_schema_version)]
        if not held:
            msg = (f"no held-out case (none of the groups of its {len(every)} cases is in the held-out 20%): nothing to score"
                   if every else "no held-out case (no case at all): nothing to score")
            if data:
                raise InputError(str(corpus_path), msg)
            out["warnings"].append(f"{corpus_path}: {msg}")
        elif not cases:
            msg = (f"all {len(held)} held-out cases are of feature schema "
                   f"{', '.join(sorted({c.feature_schema_version for c in held}))}, the model's is "
                   f"{bundle.feature_schema_version} (another major version): nothing to score (train a model on this "
                   "corpus with `zoomer-ar train`)")
            if data:
                raise InputError(str(corpus_path), msg)
            out["warnings"].append(f"{corpus_path}: {msg}")
        else:
            if len(cases) < len(held):
                out["warnings"].append(f"{corpus_path}: skipped {len(held) - len(cases)} of {len(held)} held-out cases of "
                                       f"another feature-schema major version than the model's {bundle.feature_schema_version}")
            newer = sorted({c.feature_schema_version for c in cases} - {bundle.feature_schema_version})
            if newer:
                out["warnings"].append(f"{corpus_path}: cases of feature schema {', '.join(newer)} scored by a model trained "
                                       f"on {bundle.feature_schema_version}, as analyze runs it (same major version)")
            out["held_out"] = evaluate_cases(bundle, cases)
    if (traces_p / "LABELS.yaml").is_file():
        pairs = {(a, b) for a, b in (bundle.meta.get("data", {}).get("verdict_real_pairs") or [])}
        out["real"] = evaluate_real(bundle, traces_p, Path(cache) if cache else DEFAULT_CACHE, exclude=pairs)
    for w in out["warnings"]:
        click.echo(f"zoomer-ar: warning: {w}", err=True)
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    click.echo(f"model {bundle.version}")
    if "held_out" in out:
        click.echo(format_corpus_table(out["held_out"], f"Held-out corpus ({out['held_out']['n']} cases, {corpus_path})"))
    elif not corpus_path.exists():
        click.echo(f"(corpus {corpus_path} not found: no held-out table)")
    else:
        click.echo("(no held-out table: see the warning above)")
    if "real" in out:
        click.echo(format_real_table(out["real"]))
    else:
        click.echo(f"(no LABELS.yaml under {traces_p}: no real-trace table)")


@click.group()
def models() -> None:
    """The model registry: models/<version>/, models/CURRENT."""


@models.command("list")
@click.option("--models", "root", type=P(), default=None, help="Model registry folder (default models/).")
def models_list(root) -> None:
    """Versions with their held-out macro-F1; * marks the current one."""
    from .registry import current, versions

    root = _models_root(root)
    vs = versions(root)
    named = current(root)
    if named and not any(v["current"] for v in vs):  # a dangling pointer: analyze runs on the rules alone
        click.echo(f"note: {root / 'CURRENT'} names {named}, which is not a model version here: "
                   "findings are the rules' alone (`zoomer-ar models promote VERSION` to set one)", err=True)
    if not vs:
        click.echo("no model versions (train one with `zoomer-ar train`)")
        return
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for v in vs:
        if v.get("error"):
            click.echo(f"{'*' if v['current'] else ' '} {v['version']}  {v['error']}")
            continue
        click.echo(f"{'*' if v['current'] else ' '} {v['version']}  {v['created']}  data {v['data_hash']}  cases {v['cases']}  "
                   f"macro-F1 model {fmt(v['macro_f1_model'])} rules {fmt(v['macro_f1_rules'])} ensemble {fmt(v['macro_f1_ensemble'])}"
                   f"{'  promoted' if v['promotion'] else ''}")


def _promote(root: Path, version: str, traces, cache, force: bool, allow_dropped_labels: bool = False) -> None:
    from .evaluate import DEFAULT_CACHE
    from .registry import GateError, promote

    if not (root / version / "meta.json").is_file():  # an unknown version is bad input (exit 2), not a refusal
        known = sorted(p.name for p in root.glob("v*") if (p / "meta.json").is_file()) if root.is_dir() else []
        raise InputError(str(root / version), f"no model version {version} (versions here: {', '.join(known) or 'none'})")
    traces_p = _real_traces(traces)
    try:
        rep = promote(root, version, traces_p, Path(cache) if cache else DEFAULT_CACHE, force, allow_dropped_labels)
    except GateError as exc:
        raise click.ClickException(str(exc)) from None
    if rep.get("noop"):
        n = rep["boosters"]
        click.echo(f"{version} is already the current model and loads ({n} booster{'s' if n != 1 else ''}): nothing to do")
        return
    real = rep.get("real") or {}
    held = rep.get("held_out") or {}
    cov = rep.get("coverage") or {}
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    mf = held.get("candidate") or {}
    rc = real.get("candidate") or {}
    click.echo(f"{version} is now current (real-trace labels right: ensemble {rc.get('ensemble')}, rules {rc.get('rules')} "
               f"of {real.get('labelled')}; held-out macro-F1 on {held.get('cases')} cases, {held.get('labels')} labels: "
               f"model {fmt(mf.get('model'))}, rules {fmt(mf.get('rules'))}, ensemble {fmt(mf.get('ensemble'))})"
               + ("" if rep["ok"] else f"  [forced past: {'; '.join(rep['reasons'])}]"))
    click.echo(f"labels with a booster: {len(cov.get('candidate') or [])} of {len(PATTERN_IDS)}"
               + (f" (current had {len(cov['current'])})" if cov.get("current") is not None else "")
               + (f"; dropped: {', '.join(cov['dropped'])}" if cov.get("dropped") else "")
               + (f"; added: {', '.join(cov['added'])}" if cov.get("added") else ""))
    for n in rep.get("notes") or []:
        click.echo(f"note: {n}")


@models.command("promote")
@click.argument("version")
@click.option("--models", "root", type=P(), default=None, help="Model registry folder (default models/).")
@click.option("--traces", type=P(), default=None, help="Real traces with LABELS.yaml for the gate (default ../shared/traces).")
@click.option("--cache", type=P(), default=None, help="Cache folder for real-trace features.")
@click.option("--force", is_flag=True, help="Promote even when the gate fails (recorded in HISTORY.jsonl).")
@click.option("--allow-dropped-labels", is_flag=True,
              help="Accept a version without a booster for a label the current model has one for (the rules alone there).")
def models_promote(version, root, traces, cache, force, allow_dropped_labels) -> None:
    """Make VERSION current if it passes the gate (no real-trace label lost, no label dropped, held-out
    macro-F1 on the common held-out cases not lower). Promoting the current version does nothing but check
    that it still loads (exit 2 naming the broken file otherwise)."""
    _promote(_models_root(root), version, traces, cache, force, allow_dropped_labels)


@models.command("rollback")
@click.option("--models", "root", type=P(), default=None, help="Model registry folder (default models/).")
def models_rollback(root) -> None:
    """Return to the version promoted before the current one (or to the rules alone)."""
    from .registry import GateError, rollback

    try:
        prev = rollback(_models_root(root))
    except GateError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"current model: {prev or 'none (rules only)'}")


@click.command("label")
@click.argument("target", type=P())
@click.option("--pattern", required=True, type=click.Choice(PATTERN_IDS), help="The anti-pattern judged.")
@click.option("--yes/--no", "verdict", required=True, help="Present with material cost (--yes) or not (--no).")
@click.option("--note", default="", help="Why (evidence, ticket).")
@click.option("--store", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Verdict file (default: training_data/labels.jsonl under the current folder).")
def label_cmd(target, pattern, verdict, note, store) -> None:
    """Record a human verdict on a trace, rank folder or analysed job (findings.json / its folder).

    The verdict is appended to ./training_data/labels.jsonl (relative to the folder you run from),
    or to --store; the absolute path written is printed. `train` run from the same folder uses it."""
    from .verdicts import labels_path, record

    if not Path(target).exists():
        raise InputError(str(target), "no such file or directory")
    path = labels_path(Path(store) if store else None)
    rec = record(Path(target), pattern, verdict, note, path, warn=lambda msg: click.echo(f"warning: {msg}", err=True))
    from ..features import FEATURE_SCHEMA_VERSION

    if rec["feature_schema_version"] != FEATURE_SCHEMA_VERSION:
        use = "`train` cannot use it (see the warning)"
    elif path != labels_path(None):  # train reads ./training_data/labels.jsonl unless told otherwise
        use = f"`train --labels {shlex.quote(str(path))}` uses it"
    else:
        use = "the next `train` run from this folder uses it"
    click.echo(f"recorded {rec['verdict']} {pattern} for {rec['job']} in {path}; {use}")


commands = [corpus, train_cmd, evaluate_cmd, models, label_cmd]
