"""The relaunch spec: what to change at launch (environment, launcher arguments, config overrides),
the patch it pairs with and the gain the findings predict. JSON Schema published in docs/."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..detect.combine import combined_impact
from ..errors import InputError
from ..models import Analysis, Finding
from .program import HYDRA_ARG, ProgramCli, find_script, scan_program, style_from_args

RELAUNCH_SCHEMA_VERSION = "1.1"


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid")
    launcher: Literal["python", "torchrun"] = "python"
    python: str | None = Field(default=None, description="The interpreter the recorded job ran on (job.json's "
                                "executable); None: `python` on PATH.")
    module: str | None = Field(default=None, description="Run as `python -m MODULE` (the recorded job was started "
                               "so); `script` is then the module's file, for reference.")
    script: str = "train.py"
    args: list[str] = Field(default_factory=list)
    nproc_per_node: int | None = None
    nnodes: int | None = None


class ExpectedGain(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ms_per_step: float = 0.0
    pct_of_step: float = 0.0
    gpu_hours_per_1000_steps: float = 0.0
    from_findings: list[str] = Field(default_factory=list)


class RelaunchSpec(BaseModel):
    """A schema'd description of how to relaunch the job with the recommended changes."""

    model_config = ConfigDict(extra="forbid")
    schema_version: str = RELAUNCH_SCHEMA_VERSION
    job: str
    trace_sha256: list[str] = Field(default_factory=list)
    command: Command = Field(default_factory=Command)
    env: dict[str, str] = Field(default_factory=dict)
    launcher_args: dict[str, str | int | bool] = Field(default_factory=dict)
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    override_style: Literal["hydra", "argparse"] = "hydra"
    patch: str | None = None
    expected_gain: ExpectedGain = Field(default_factory=ExpectedGain)
    notes: list[str] = Field(default_factory=list)

    def argv(self) -> list[str]:
        """The exact command line (without the environment)."""
        c = self.command
        if c.launcher == "torchrun":
            # the recorded interpreter's own torchrun (torch.distributed.run is what `torchrun` runs)
            cmd = [c.python, "-m", "torch.distributed.run"] if c.python else ["torchrun"]
            if c.nnodes:
                cmd.append(f"--nnodes={c.nnodes}")
            if c.nproc_per_node:
                cmd.append(f"--nproc_per_node={c.nproc_per_node}")
            for k, v in sorted(self.launcher_args.items()):
                cmd.append(f"--{k}" if v is True else f"--{k}={v}")
            if c.module:
                cmd.append("--module")
        else:
            cmd = [c.python or "python"]
            if c.module:
                cmd.append("-m")
        cmd.append(c.module or c.script)
        cmd.extend(c.args)
        for k, v in sorted(self.config_overrides.items()):
            value = _value_text(v)
            cmd.append(f"{k}={value}" if self.override_style == "hydra" else f"--{k}={value}")
        return cmd

    def is_template(self) -> bool:
        """True when no recorded command stood behind the spec: its script is a placeholder."""
        return self.command.script == TEMPLATE_SCRIPT

    def shell_command(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(x) for x in self.argv())
        return f"{env} {cmd}".strip()


def json_schema() -> dict:
    return RelaunchSpec.model_json_schema()


#: the script name of a spec no job.json recorded the command for: a placeholder, never run
TEMPLATE_SCRIPT = "<script.py>"
TEMPLATE_NOTE = (f"TEMPLATE: no job.json (zoomer_ar.capture) beside the trace recorded the job's command, so "
                 f"command.script ({TEMPLATE_SCRIPT}) and command.args are placeholders: fill them in before "
                 "`zoomer-ar relaunch` runs it; config_overrides are shown Hydra-style (key=value), write them "
                 "the way the script takes its settings.")


def _value_text(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (bool, list, dict)) or v is None else str(v)


def _hydra_key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def _fit_overrides(overrides: dict[str, Any], args: list[str], cli: ProgramCli
                   ) -> tuple[dict[str, Any], list[str], Literal["hydra", "argparse"], dict[str, Any]]:
    """(overrides the command line carries, recorded args, their style, overrides it cannot carry).

    Hydra takes every key (a recorded ``k=v`` for a key set again is dropped: Hydra rejects a key
    given twice); argparse only the keys one of its value-taking options sets, renamed to that
    option (a boolean is left out: how a flag takes it differs from program to program); an
    unknown command line takes none."""
    if cli.style == "hydra":
        kept = [a for a in args if not (HYDRA_ARG.match(a) and _hydra_key(a) in overrides)]
        return dict(overrides), kept, "hydra", {}
    carried: dict[str, Any] = {}
    left: dict[str, Any] = {}
    for key, value in overrides.items():
        option = cli.option_for(key) if cli.style == "argparse" else None
        if option and not isinstance(value, (bool, list, dict)) and value is not None:
            carried[option.lstrip("-")] = value
        else:
            left[key] = value
    return carried, args, "argparse" if cli.style == "argparse" else "hydra", left


def program_cli(script: str, args: list[str], source_dir: Path | None) -> ProgramCli:
    """How the recorded script takes settings: from its source when --source holds it, else from
    the recorded arguments."""
    found = find_script(script, source_dir)
    return scan_program(found, source_dir) if found else style_from_args(args)


def _left_note(left: dict[str, Any], cli: ProgramCli, origin: dict[str, Finding], patch: str | None,
               patched: set[str]) -> str:
    """The note for overrides the command line cannot carry: which, why, and where they go instead."""
    settings = ", ".join(f"{k}={_value_text(v)}" for k, v in sorted(left.items()))
    why = (f"its argparse options have no such setting ({cli.evidence})" if cli.style == "argparse"
           else f"how it takes settings is unknown ({cli.evidence})")
    patterns = sorted({origin[k].pattern for k in left} & patched)
    missing = sorted(k for k in left if origin[k].pattern not in patched)
    parts = [f"Not on the command line: {settings}; {why}."]
    if patch and patterns:
        parts.append(f"{patch} carries the {', '.join(patterns)} fix in the code.")
    if missing:
        parts.append(f"Set {', '.join(missing)} in the program's code or config yourself.")
    return " ".join(parts)


def _out_note(args: list[str]) -> str | None:
    """A note when the replayed command writes where the recorded run wrote (its --out)."""
    for i, a in enumerate(args):
        value = a.split("=", 1)[1] if a.startswith("--out=") else None
        if a == "--out" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None:
            return (f"The command is the recorded one: it writes where the recorded run wrote (--out {value}); "
                    "point --out elsewhere to keep the earlier trace for `zoomer-ar compare`.")
    return None


def spec_from_analysis(analysis: Analysis, *, argv: list[str] | None = None, patch: str | None = None,
                       source_dir: Path | None = None, patched: set[str] | frozenset = frozenset(),
                       python: str | None = None, module: str | None = None) -> RelaunchSpec:
    """The spec for an analysis: the recorded command line (``argv``, from job.json) replayed as
    recorded, on the recorded interpreter (``python``) and as the recorded module (``module``: the
    job ran as ``python -m``), plus the findings' settings in the form the program takes them
    (``source_dir`` holds its source, read statically; ``patched``: the patterns whose fix ``patch``
    carries, which settings the command line cannot take are left to); without ``argv`` a template
    to complete."""
    env: dict[str, str] = {}
    overrides: dict[str, Any] = {}
    origin: dict[str, Finding] = {}
    notes: list[str] = []
    used: list[str] = []
    acted_on = []
    for f in analysis.findings:
        r = f.relaunch or {}
        if not r and not f.fixers:
            continue
        used.append(f.pattern)
        acted_on.append(f)
        env.update({str(k): str(v) for k, v in (r.get("env") or {}).items()})
        overrides.update(r.get("config_overrides") or {})
        origin.update({k: f for k in (r.get("config_overrides") or {})})
        if r.get("notes"):
            notes.append(f"{f.pattern}: {r['notes']}")
    gain = combined_impact(acted_on)
    world = analysis.job.world_size
    launcher: Literal["python", "torchrun"] = "torchrun" if world > 1 else "python"
    style: Literal["hydra", "argparse"] = "hydra"
    if argv:
        script, *args = argv
        cli = program_cli(script, args, source_dir)
        overrides, args, style, left = _fit_overrides(overrides, args, cli)
        cmd = Command(launcher=launcher, python=python, module=module, script=script, args=args,
                      nproc_per_node=world if world > 1 else None)
        left_note = _left_note(left, cli, origin, patch, set(patched)) if left else None
        notes += [n for n in (left_note, _out_note(args)) if n]
    else:
        cmd = Command(launcher=launcher, script=TEMPLATE_SCRIPT, nproc_per_node=world if world > 1 else None)
        notes.insert(0, TEMPLATE_NOTE)
    return RelaunchSpec(
        job=analysis.job.name,
        trace_sha256=[r.sha256 for r in analysis.job.ranks],
        command=cmd,
        env=env,
        config_overrides=overrides,
        override_style=style,
        patch=patch,
        expected_gain=ExpectedGain(
            ms_per_step=round(gain.ms_per_step, 4), pct_of_step=round(gain.pct_of_step, 3),
            gpu_hours_per_1000_steps=round(gain.gpu_hours_per_1000_steps, 6), from_findings=used,
        ),
        notes=notes + ["Gains are combined without counting a finding within another (launch-bound, sync-point and "
                       "dataloader-bound measure parts of idle-gpu's idle time) and capped at the step; other "
                       "overlaps remain, so the figure is an upper bound."],
    )


def load_spec(path: Path) -> RelaunchSpec:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(str(path), f"not a readable YAML relaunch spec ({str(exc).splitlines()[0]})") from None
    try:
        return RelaunchSpec(**(data or {}))
    except (ValidationError, TypeError) as exc:
        msg = exc.errors()[0] if isinstance(exc, ValidationError) else {"msg": str(exc), "loc": ()}
        loc = ".".join(str(x) for x in msg.get("loc", ()))
        raise InputError(str(path), f"invalid relaunch spec: {loc + ': ' if loc else ''}{msg['msg']}") from None
