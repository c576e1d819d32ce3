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
from ..models import Analysis

RELAUNCH_SCHEMA_VERSION = "1.0"


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid")
    launcher: Literal["python", "torchrun"] = "python"
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
            cmd = ["torchrun"]
            if c.nnodes:
                cmd.append(f"--nnodes={c.nnodes}")
            if c.nproc_per_node:
                cmd.append(f"--nproc_per_node={c.nproc_per_node}")
            for k, v in sorted(self.launcher_args.items()):
                cmd.append(f"--{k}" if v is True else f"--{k}={v}")
        else:
            cmd = ["python"]
        cmd.append(c.script)
        cmd.extend(c.args)
        for k, v in sorted(self.config_overrides.items()):
            value = json.dumps(v) if isinstance(v, (bool, list, dict)) or v is None else str(v)
            cmd.append(f"{k}={value}" if self.override_style == "hydra" else f"--{k}={value}")
        return cmd

    def shell_command(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(x) for x in self.argv())
        return f"{env} {cmd}".strip()


def json_schema() -> dict:
    return RelaunchSpec.model_json_schema()


def spec_from_analysis(analysis: Analysis, *, argv: list[str] | None = None, patch: str | None = None) -> RelaunchSpec:
    env: dict[str, str] = {}
    overrides: dict[str, Any] = {}
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
        if r.get("notes"):
            notes.append(f"{f.pattern}: {r['notes']}")
    gain = combined_impact(acted_on)
    world = analysis.job.world_size
    cmd = Command()
    if argv:
        script, *args = argv
        cmd = Command(launcher="torchrun" if world > 1 else "python", script=script, args=args,
                      nproc_per_node=world if world > 1 else None)
    elif world > 1:
        cmd = Command(launcher="torchrun", nproc_per_node=world)
    return RelaunchSpec(
        job=analysis.job.name,
        trace_sha256=[r.sha256 for r in analysis.job.ranks],
        command=cmd,
        env=env,
        config_overrides=overrides,
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
