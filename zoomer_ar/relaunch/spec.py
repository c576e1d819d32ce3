"""The relaunch spec: what to change at launch (environment, launcher arguments, config overrides),
where to run it, the patch it pairs with and the gain the fixes it carries predict. JSON Schema
published in docs/relaunch.schema.json.

Schema history: 1.1 recorded interpreter and module; 1.2 adds ``cwd``, the folder the recorded job
ran in (job.json's ``cwd``), where ``zoomer-ar relaunch`` applies the patch and starts the command
(a 1.1 spec loads with ``cwd`` null: the current folder, as before). A spec of another major version
(a newer zoomer-ar's), or whose torchrun layout is below one process or one node or past any machine
(MAX_NPROC_PER_NODE, MAX_NNODES), is refused, as are launcher_args the command line cannot carry once
(check_launcher_arg: repeating the command's layout, not an option name, any on a python launch).

A setting is put on the command line only in a form the program takes (argparse: one of its
options, replacing a recorded occurrence; Hydra: a key of its config read statically, renamed to
the config's own key or added with ``+key`` when the program reads it by name); settings that
raise DataLoader workers are left out when the program's loaders are over iterable-style datasets
(as the dataloader-workers fixer judges them). A worker count is the most: `zoomer-ar relaunch`
lowers it to the machine it runs on (workers.py), and a note says what the gain assumes.
``expected_gain`` counts only the findings whose fix the relaunch carries: a patch hunk for the
pattern, or its main setting actually set.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..detect.combine import combined_impact
from ..errors import InputError
from ..load.job import recorded_job
from ..models import Analysis, Finding
from .hydra_config import can_add, find_config, match_key
from .layout import Layout, node_layout
from .loaders import is_worker_key, refused_loaders
from .program import HYDRA_ARG, ProgramCli, find_script, scan_program, style_from_args
from .trace_folder import retarget
from .workers import count_note

RELAUNCH_SCHEMA_VERSION = "1.2"
_MAJOR = RELAUNCH_SCHEMA_VERSION.split(".")[0]
#: the versions a spec may say it is: this major version, any minor one
SCHEMA_VERSION_PATTERN = rf"^{_MAJOR}\.[0-9]+$"
#: torchrun's layout bounds: no machine runs more processes than this (a node of the largest CPU servers has
#: 768 hardware threads, of GPU servers 16 GPUs), and no cluster has more nodes; beyond them a spec is refused
#: rather than left to start 10**9 processes
MAX_NPROC_PER_NODE = 1024
MAX_NNODES = 65536
#: the launcher_args torchrun reads the command's own fields for: its option -> the Command field that writes it
COMMAND_OWNED = {"nnodes": "nnodes", "nproc_per_node": "nproc_per_node", "module": "module"}
#: nproc_per_node words torchrun takes besides a count
NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid")
    launcher: Literal["python", "torchrun"] = "python"
    python: str | None = Field(default=None, description="The interpreter the recorded job ran on (job.json's "
                                "executable); None: `python` on PATH.")
    module: str | None = Field(default=None, description="Run as `python -m MODULE` (the recorded job was started "
                               "so); `script` is then the module's file, for reference.")
    script: str = "train.py"
    args: list[str] = Field(default_factory=list)
    # strict: a count, never `true` (which pydantic would read as 1) or a string
    nproc_per_node: int | None = Field(default=None, ge=1, le=MAX_NPROC_PER_NODE, strict=True,
                                       description=f"torchrun's processes per node (1 to {MAX_NPROC_PER_NODE}); "
                                       "None: torchrun's default.")
    nnodes: int | None = Field(default=None, ge=1, le=MAX_NNODES, strict=True,
                               description=f"torchrun's node count (1 to {MAX_NNODES}); None: one node.")


class ExpectedGain(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ms_per_step: float = 0.0
    pct_of_step: float = 0.0
    gpu_hours_per_1000_steps: float = 0.0
    from_findings: list[str] = Field(default_factory=list)


class RelaunchSpec(BaseModel):
    """A schema'd description of how to relaunch the job with the recommended changes. Schema 1.2
    added `cwd` (the folder the recorded job ran in); a 1.1 spec, without it, still loads."""

    model_config = ConfigDict(extra="forbid")
    schema_version: str = Field(default=RELAUNCH_SCHEMA_VERSION, json_schema_extra={"pattern": SCHEMA_VERSION_PATTERN},
                                description=f"MAJOR.MINOR; this zoomer-ar reads major version {_MAJOR} (1.1, 1.2...).")
    job: str
    trace_sha256: list[str] = Field(default_factory=list)
    command: Command = Field(default_factory=Command)
    cwd: str | None = Field(default=None, description="The folder the recorded job ran in (job.json's cwd; "
                            "schema 1.2): `zoomer-ar relaunch` applies the patch and starts the command there "
                            "unless --cwd says otherwise; a relative path is taken from the spec's folder, as "
                            "`patch` is. None: the current folder.")
    env: dict[str, str] = Field(default_factory=dict)
    launcher_args: dict[str, str | int | bool] = Field(
        default_factory=dict, description="More torchrun options, without their dashes: `true` writes the flag, "
        "`false` leaves it out, another value `--KEY=VALUE`. Not nnodes, nproc_per_node or module when the command "
        "sets them (command.*): torchrun would get the option twice.")
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    override_style: Literal["hydra", "argparse"] = "hydra"
    patch: str | None = None
    expected_gain: ExpectedGain = Field(default_factory=ExpectedGain)
    notes: list[str] = Field(default_factory=list)

    @field_validator("schema_version")
    @classmethod
    def _readable_version(cls, v: str) -> str:
        """A spec of another major version (a newer zoomer-ar wrote it) may mean fields this one reads otherwise:
        refused rather than run as if it were this version's."""
        if not re.fullmatch(r"[0-9]+\.[0-9]+", v):
            raise ValueError(f"{v!r} is not a version (MAJOR.MINOR, e.g. {RELAUNCH_SCHEMA_VERSION})")
        if not re.fullmatch(SCHEMA_VERSION_PATTERN, v):
            raise ValueError(f"{v!r} is not one this zoomer-ar reads ({_MAJOR}.x; major version {v.split('.')[0]} is "
                             "another zoomer-ar's): write the spec again with this version (zoomer-ar analyze)")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        """Names and values the operating system takes (no process can be given an empty name, one
        holding '=' or a NUL byte, or a value holding NUL)."""
        for k, v in env.items():
            if not k or "=" in k or "\0" in k:
                raise ValueError(f"{k!r} is not an environment variable name (empty, or holds '=' or a NUL byte)")
            if "\0" in v:
                raise ValueError(f"the value of {k} holds a NUL byte")
        return env

    @model_validator(mode="after")
    def _launcher_args(self) -> RelaunchSpec:
        """torchrun options the command line can carry once each: names without dashes or spaces, not one the
        command's own fields set, and a layout within the bounds command.nnodes/nproc_per_node have."""
        if self.launcher_args and self.command.launcher != "torchrun":
            raise ValueError(f"launcher_args ({', '.join(sorted(self.launcher_args))}) are torchrun's options, but "
                             "command.launcher is python: set it to torchrun, or remove them")
        for key, value in self.launcher_args.items():
            check_launcher_arg(key, value, self.command)
        return self

    @model_validator(mode="after")
    def _runnable_words(self) -> RelaunchSpec:
        """No word of the command line holds a NUL byte (no process can be given one)."""
        bad = next((w for w in self.argv() if "\0" in w), None)
        if bad is not None:
            raise ValueError(f"a word of the command line holds a NUL byte: {bad!r}")
        return self

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
                if v is not False:  # false: the flag left out (`--standalone=False` is an error to torchrun)
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

    def shell_command(self, *, in_cwd: bool = False) -> str:
        """The command line with its environment; ``in_cwd``: preceded by ``cd CWD &&`` when the
        spec records where the job ran."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(x) for x in self.argv())
        line = f"{env} {cmd}".strip()
        return f"cd {shlex.quote(self.cwd)} && {line}" if in_cwd and self.cwd else line


_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def _owned_option(key: str) -> str | None:
    """The command-owned torchrun option `key` names: itself, its dashed spelling (nproc-per-node), or an
    abbreviation argparse would take for it (nnode, nproc)."""
    norm = key.replace("-", "_")
    for option in COMMAND_OWNED:
        if norm == option or (len(norm) >= 2 and option.startswith(norm) and option != "module"):
            return option
    return None


def _count(text: str, what: str, top: int) -> int:
    if not text.isdigit() or not 1 <= int(text) <= top:
        raise ValueError(f"{what}: {text!r} is not a count from 1 to {top:,}")
    return int(text)


def check_launcher_arg(key: str, value: str | int | bool, command: Command) -> None:
    """ValueError (one line) for a launcher_args entry the command line cannot carry as written."""
    if not _OPTION_NAME.fullmatch(key):
        raise ValueError(f"launcher_args key {key!r} is not a torchrun option name (write it without its dashes, "
                         "e.g. rdzv_endpoint; no spaces or '=')")
    option = _owned_option(key)
    if option is None:
        return
    field_name = COMMAND_OWNED[option]
    if getattr(command, field_name) is not None:
        raise ValueError(f"launcher_args.{key} repeats command.{field_name}: the command would carry "
                         f"--{option} twice (torchrun takes the last); keep one of them")
    what = f"launcher_args.{key}"
    if option == "module":
        return
    if isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not a count")
    text = str(value).strip()
    if option == "nnodes":  # N, or MIN:MAX for an elastic job
        parts = text.split(":")
        if len(parts) > 2:
            raise ValueError(f"{what}: {text!r} is not N or MIN:MAX nodes")
        low, high = (_count(p, what, MAX_NNODES) for p in (parts[0], parts[-1]))
        if low > high:
            raise ValueError(f"{what}: {text!r} has more nodes at least ({low}) than at most ({high})")
    elif text not in NPROC_WORDS:
        _count(text, what, MAX_NPROC_PER_NODE)


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


@dataclass
class _Fit:
    """The findings' settings fitted to the program's command line."""

    carried: dict[str, Any]  # the name on the command line (option without dashes, config key) -> value
    source: dict[str, str]  # that name -> the findings' key it sets
    args: list[str]  # the recorded arguments, less those a carried setting replaces
    style: Literal["hydra", "argparse"]
    left: dict[str, Any] = field(default_factory=dict)  # the findings' key -> value, not carried
    why: str = ""  # why the left ones are not
    notes: list[str] = field(default_factory=list)


def _recorded_occurrences(args: list[str], option: str, cli: ProgramCli) -> tuple[list[str], bool]:
    """``args`` without the recorded occurrences of ``option`` (its aliases, ``--opt=V``, ``--opt V``,
    ``-jV``, an unambiguous abbreviation); False when one is there in a form that cannot be removed
    safely (an option that takes other than one value given as ``--opt V...``)."""
    names = cli.aliases.get(option, (option,))
    longs = [n for n in names if n.startswith("--")]
    others = set(cli.options.values())
    single = option in cli.single_value
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out += args[i:]
            break
        head = a.split("=", 1)[0]
        abbrev = (head.startswith("--") and len(head) > 3 and any(n.startswith(head) for n in longs)
                  and sum(o.startswith(head) for o in others) == 1)
        if head in names or abbrev:
            if "=" in a:
                i += 1
                continue
            if not single:
                return args, False
            i += 2
            continue
        short = next((n for n in names if len(n) == 2 and a.startswith(n) and len(a) > 2), None)
        if short and single:
            i += 1
            continue
        out.append(a)
        i += 1
    return out, True


def _fit_argparse(overrides: dict[str, Any], args: list[str], cli: ProgramCli) -> _Fit:
    """argparse takes only the keys one of its value-taking options sets, renamed to that option (a
    boolean is left out: how a flag takes it differs from program to program); a recorded
    occurrence of the option is replaced, not followed by a second one."""
    fit = _Fit({}, {}, list(args), "argparse", why=f"its argparse options have no such setting ({cli.evidence})")
    for key, value in overrides.items():
        option = cli.option_for(key)
        if option and not isinstance(value, (bool, list, dict)) and value is not None:
            kept, ok = _recorded_occurrences(fit.args, option, cli)
            if ok:
                fit.args = kept
                fit.carried[option.lstrip("-")] = value
                fit.source[option.lstrip("-")] = key
                continue
            fit.notes.append(f"{key}={_value_text(value)} is not set: {option} is on the recorded command line "
                             "taking other than one value, which is not replaced safely; set it there yourself.")
        fit.left[key] = value
    return fit


def _fit_hydra(overrides: dict[str, Any], args: list[str], cli: ProgramCli) -> _Fit:
    """Hydra takes a key its config has (or renamed to the config's own key for that setting), a key
    it lacks as ``+key`` only when the program reads it by name; a recorded ``k=v`` for a key set
    again is dropped (Hydra rejects a key given twice). Without a config to check against (no
    @hydra.main, a ConfigStore config, the source not given) every key is taken, as written, and
    a note says they are unchecked."""
    fit = _Fit({}, {}, list(args), "hydra")
    config, why_not = find_config(cli.hydra, args) if cli.hydra is not None else (None, "")
    if config is None:
        fit.carried = dict(overrides)
        fit.source = {k: k for k in overrides}
        if overrides and (cli.hydra is not None or not cli.files):
            why = why_not or cli.evidence
            fit.notes.append(f"The overrides are not checked against the program's Hydra config ({why}): Hydra "
                             "rejects a key its config lacks unless written +key=value, and a key the program does "
                             "not read changes nothing.")
    else:
        renamed, ambiguous = [], []
        for key, value in overrides.items():
            name, hits = match_key(key, config)
            if name is None and can_add(key, config, cli.strings):
                name = f"+{key}"
            if name is None:
                fit.left[key] = value
                if hits:
                    ambiguous.append(f"{key} (matches {', '.join(hits[:4])})")
                continue
            fit.carried[name] = value
            fit.source[name] = key
            if name != key and not name.startswith("+"):
                renamed.append(f"{key} as {name}")
        fit.why = (f"the Hydra config ({config.where()}) has no such key and the program does not read it by name "
                   f"({cli.evidence}); Hydra rejects a key its config lacks unless written +key=value")
        if ambiguous:
            fit.why += f"; more than one key could be meant: {'; '.join(ambiguous)}"
        if renamed:
            fit.notes.append(f"Set under the config's own keys ({config.where()}): {', '.join(renamed)}.")
    keys = {_hydra_key(k) for k in fit.carried}
    fit.args = [a for a in args if not (HYDRA_ARG.match(a) and _hydra_key(a) in keys)]
    return fit


def _fit_overrides(overrides: dict[str, Any], args: list[str], cli: ProgramCli) -> _Fit:
    """The overrides the command line carries, in the form the program takes them (see _fit_argparse
    and _fit_hydra); an unknown command line takes none."""
    if cli.style == "hydra":
        return _fit_hydra(overrides, args, cli)
    if cli.style == "argparse":
        return _fit_argparse(overrides, args, cli)
    return _Fit({}, {}, list(args), "hydra", left=dict(overrides),
                why=f"how it takes settings is unknown ({cli.evidence})")


def program_cli(script: str, args: list[str], source_dir: Path | None) -> ProgramCli:
    """How the recorded script takes settings: from its source when --source holds it, else from
    the recorded arguments."""
    found = find_script(script, source_dir)
    return scan_program(found, source_dir) if found else style_from_args(args)


def _workers_guard(overrides: dict[str, Any], cli: ProgramCli) -> tuple[dict[str, Any], list[str]]:
    """The overrides less those raising DataLoader workers when the program's loaders a command-line
    setting reaches are over iterable-style datasets (the dataloader-workers fixer's verdict), with
    a note saying why."""
    keys = [k for k in overrides if is_worker_key(k)]
    if not keys or not cli.files:
        return overrides, []
    refused, _ = refused_loaders(cli.files)
    if not refused:
        return overrides, []
    kept = {k: v for k, v in overrides.items() if k not in keys}
    settings = ", ".join(f"{k}={_value_text(overrides[k])}" for k in sorted(keys))
    where = ", ".join(str(r) for r in refused[:3]) + (f" and {len(refused) - 3} more" if len(refused) > 3 else "")
    return kept, [f"Workers not raised ({settings} left out): the DataLoader at {where} is not taken for a map-style "
                  "one, so the dataloader-workers fixer leaves it alone too; each worker iterates its own copy of an "
                  "iterable-style dataset, so N workers would yield every sample N times. Split the stream by "
                  "torch.utils.data.get_worker_info() in __iter__ (or use a map-style dataset), then raise "
                  "num_workers."]


def _left_note(fit: _Fit, origin: dict[str, Finding], patch: str | None, patched: set[str]) -> str:
    """The note for overrides the command line cannot carry: which, why, and where they go instead."""
    left = fit.left
    settings = ", ".join(f"{k}={_value_text(v)}" for k, v in sorted(left.items()))
    patterns = sorted({origin[k].pattern for k in left} & patched)
    missing = sorted(k for k in left if origin[k].pattern not in patched)
    parts = [f"Not on the command line: {settings}; {fit.why}."]
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
                    "point --out elsewhere to keep the earlier trace for `zoomer-ar compare` (a program recording "
                    "with zoomer_ar.capture refuses a folder that holds its earlier capture).")
    return None


#: modules a notebook kernel runs as: its command line starts a kernel that waits for a notebook to connect
KERNEL_MODULES = ("ipykernel_launcher", "ipykernel", "colab_kernel_launcher")


def _unreplayable(argv: list[str], module: str | None) -> str | None:
    """Why a recorded command line cannot be replayed as a command (the job's code is not on it), else None:
    ``python -c CODE`` and ``python -`` (sys.argv[0] is "-c" or "-", the code itself not recorded) and a
    notebook kernel (replaying its command starts an idle kernel)."""
    what = None
    if argv[0] in ("-c", "-"):
        what = f"started as `python {argv[0]}`, whose code sys.argv does not hold"
    elif (module or "").split(".")[0] in KERNEL_MODULES or Path(argv[0]).stem in KERNEL_MODULES:
        what = "run in a notebook kernel, whose command line starts an idle kernel, not the notebook's code"
    if what is None:
        return None
    return (f"TEMPLATE: job.json records the job as {what}: command.script ({TEMPLATE_SCRIPT}) and command.args are "
            "placeholders; put the code in a script and fill them in before `zoomer-ar relaunch` runs it; "
            "config_overrides are shown Hydra-style (key=value), write them the way the script takes its settings.")


def _absolute_folder(folder: Path | None) -> Path | None:
    """The analysed trace folder as an absolute path (analysis.job.path is as given, relative to where
    analyze runs)."""
    return folder.absolute() if folder is not None else None


def _carries(f: Finding, patched: set[str], set_keys: set[str]) -> bool:
    """The relaunch carries the finding's fix: ``patch`` holds a hunk for its pattern, or its main
    setting is set (the first config override its rule lists, else its environment)."""
    if f.pattern in patched:
        return True
    r = f.relaunch or {}
    keys = list(r.get("config_overrides") or {})
    if keys:
        return keys[0] in set_keys
    return bool(r.get("env"))


def _layout_command(world: int, job: dict, folder: Path | None, analysis: Analysis
                    ) -> tuple[int | None, int | None, list[str]]:
    """(nnodes, nproc_per_node, notes) for a multi-rank job from what its records say (layout.py);
    (None, None, []) for one process. An unknown layout starts every rank on one node, and a note
    says it was not known rather than passing that off as the job's layout."""
    if world <= 1:
        return None, None, []
    layout = node_layout(world, job, folder, [r.path for r in analysis.job.ranks])
    if (layout.nproc_per_node or 0) > MAX_NPROC_PER_NODE or (layout.nnodes or 0) > MAX_NNODES:
        layout = Layout(None, None, layout.source, f"{layout.source} says {layout.nnodes or '?'} node(s) x "
                        f"{layout.nproc_per_node or '?'} process(es), past what torchrun can be asked for (at most "
                        f"{MAX_NNODES:,} nodes of {MAX_NPROC_PER_NODE:,} processes)")
    if layout.nproc_per_node is not None:
        if not layout.nnodes or layout.nnodes == 1:
            return layout.nnodes, layout.nproc_per_node, []
        return layout.nnodes, layout.nproc_per_node, [
            f"The job ran on {layout.nnodes} nodes with {layout.nproc_per_node} processes each ({layout.source}): "
            "run the command on every node, with the rendezvous the job used (--node_rank and "
            "--master_addr/--master_port, or --rdzv_backend/--rdzv_endpoint), which is not recorded."]
    why = layout.problem or ("job.json and the trace's distributedInfo record no LOCAL_WORLD_SIZE, nnodes or "
                             "host list")
    if layout.nnodes:
        return layout.nnodes, None, [f"The {world} ranks ran on {layout.nnodes} nodes, but not as many on each "
                                     f"({why}): set command.nproc_per_node yourself."]
    if world > MAX_NPROC_PER_NODE:  # more than one node runs: the command cannot start them all on one
        return None, None, [f"How the {world} ranks were spread over nodes is not known ({why}), and more than "
                            f"{MAX_NPROC_PER_NODE:,} cannot start on one node: set command.nnodes and "
                            "command.nproc_per_node to the job's layout (the command as written starts torchrun's "
                            "default, one process)."]
    return None, world, [f"How the {world} ranks were spread over nodes is not known ({why}): the command starts "
                         f"all {world} on one node (--nproc_per_node={world}); for a multi-node job set "
                         "command.nnodes and command.nproc_per_node to its layout."]


def spec_from_analysis(analysis: Analysis, *, argv: list[str] | None = None, patch: str | None = None,
                       source_dir: Path | None = None, patched: set[str] | frozenset = frozenset(),
                       python: str | None = None, module: str | None = None, cwd: str | None = None,
                       job: dict | None = None) -> RelaunchSpec:
    """The spec for an analysis: the recorded command line (``argv``, from job.json) replayed as
    recorded, on the recorded interpreter (``python``), as the recorded module (``module``: the
    job ran as ``python -m``) and in the recorded folder (``cwd``), plus the findings' settings in
    the form the program takes them (``source_dir`` holds its source, read statically;
    ``patched``: the patterns whose fix ``patch`` carries, which settings the command line cannot
    take are left to); without ``argv`` a template to complete. ``job``: the capture helper's
    job.json (default: the one beside the analysed trace), for ``cwd`` when not given and the
    node layout of a multi-rank job."""
    if job is None:
        job = recorded_job(Path(analysis.job.path)) if analysis.job.path else {}
    folder = Path(analysis.job.path) if analysis.job.path else None
    folder = folder if folder is None or folder.is_dir() else folder.parent
    env: dict[str, str] = {}
    overrides: dict[str, Any] = {}
    origin: dict[str, Finding] = {}
    notes: list[str] = []
    acted_on: list[Finding] = []
    for f in analysis.findings:
        r = f.relaunch or {}
        if not r and not f.fixers:
            continue
        acted_on.append(f)
        env.update({str(k): str(v) for k, v in (r.get("env") or {}).items()})
        overrides.update(r.get("config_overrides") or {})
        origin.update({k: f for k in (r.get("config_overrides") or {})})
        if r.get("notes"):
            notes.append(f"{f.pattern}: {r['notes']}")
    unreplayable = _unreplayable(argv, module) if argv else None
    if unreplayable:  # a template that says why, not a command that runs something else
        argv = None
    world = analysis.job.world_size
    launcher: Literal["python", "torchrun"] = "torchrun" if world > 1 else "python"
    style: Literal["hydra", "argparse"] = "hydra"
    nnodes, nproc, layout_notes = _layout_command(world, job if argv else {}, folder, analysis)
    patched = set(patched)
    if argv:
        script, *recorded_args = argv
        cwd = cwd or (job.get("cwd") if isinstance(job.get("cwd"), str) and job.get("cwd") else None)
        # the folder the recorded run's capture is in, named on its command line, becomes a fresh one
        args, folder_notes = retarget(recorded_args, _absolute_folder(folder), cwd, job)
        cli = program_cli(script, args, source_dir)
        overrides, guard_notes = _workers_guard(overrides, cli)
        fit = _fit_overrides(overrides, args, cli)
        unread = sorted(k for k in fit.source.values() if is_worker_key(k)) if not cli.files else []
        if unread:
            guard_notes.append(f"The datasets behind {', '.join(unread)} were not read (the program's source was not "
                               "given): over an iterable-style dataset every worker yields every sample, unless its "
                               "__iter__ splits the stream by torch.utils.data.get_worker_info().")
        overrides, args, style = fit.carried, fit.args, fit.style
        set_keys = set(fit.source.values())
        cmd = Command(launcher=launcher, python=python, module=module, script=script, args=args,
                      nproc_per_node=nproc, nnodes=nnodes)
        left_note = _left_note(fit, origin, patch, patched) if fit.left else None
        out_note = None if folder_notes else _out_note(args)
        notes += folder_notes + guard_notes + fit.notes + [n for n in (left_note, out_note, count_note(overrides)) if n]
        if cwd:
            notes.append(f"Runs in {cwd}, the folder the recorded job ran in (job.json's cwd): `zoomer-ar relaunch` "
                         "applies the patch and starts the command there; --cwd runs it elsewhere.")
    else:
        set_keys = set(overrides)  # a template lists them all, to be written the way the script takes them
        cwd = None
        cmd = Command(launcher=launcher, script=TEMPLATE_SCRIPT, nproc_per_node=nproc, nnodes=nnodes)
        notes.insert(0, unreplayable or TEMPLATE_NOTE)
        notes += [n for n in (count_note(overrides),) if n]
    notes += layout_notes
    counted = [f for f in acted_on if _carries(f, patched if patch else set(), set_keys)]
    uncounted = sorted({f.pattern for f in acted_on} - {f.pattern for f in counted})
    gain = combined_impact(counted)
    if uncounted:
        notes.append(f"Not in expected_gain: {', '.join(uncounted)}: neither {'the patch' if patch else 'a patch'} "
                     "nor this command carries their fix.")
    return RelaunchSpec(
        job=analysis.job.name,
        trace_sha256=[r.sha256 for r in analysis.job.ranks],
        command=cmd,
        cwd=cwd,
        env=env,
        config_overrides=overrides,
        override_style=style,
        patch=patch,
        expected_gain=ExpectedGain(
            ms_per_step=round(gain.ms_per_step, 4), pct_of_step=round(gain.pct_of_step, 3),
            gpu_hours_per_1000_steps=round(gain.gpu_hours_per_1000_steps, 6),
            from_findings=[f.pattern for f in counted],
        ),
        notes=notes + ["Gains count only the findings whose fix the patch or this command carries, combined without "
                       "counting a finding within another (launch-bound, sync-point and dataloader-bound measure "
                       "parts of idle-gpu's idle time) and capped at the step; other overlaps remain, so the figure "
                       "is an upper bound."],
    )


def _joined_surrogates(value: Any) -> Any:
    """``value`` with each UTF-16 surrogate pair in its strings joined into the character it encodes: YAML
    reads a JSON escape of a character past U+FFFF ("\\ud83d\\ude00", as specs written before render.yaml_value
    have it) as two lone surrogates, which no command line or environment can carry. A lone surrogate (an
    undecodable byte of a recorded argument, surrogateescape) is kept."""
    if isinstance(value, str):
        if not any("\ud800" <= ch <= "\udfff" for ch in value):
            return value
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    if isinstance(value, list):
        return [_joined_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_joined_surrogates(k): _joined_surrogates(v) for k, v in value.items()}
    return value


#: a spec analyze writes is a few KB; a larger file is not one (YAML of hundreds of MB took a minute and a GB)
MAX_SPEC_BYTES = 1 << 20


def load_spec(path: Path) -> RelaunchSpec:
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():  # a FIFO would be waited on for ever
        raise InputError(str(path), "not a regular file (a device, a FIFO or a socket), not a relaunch spec")
    try:
        if p.is_file() and p.stat().st_size > MAX_SPEC_BYTES:
            raise InputError(str(path), f"{p.stat().st_size:,} bytes: not a relaunch spec (a spec is at most "
                                        f"{MAX_SPEC_BYTES >> 20} MiB; analyze writes a few KB)")
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InputError(str(path), f"not a readable YAML relaunch spec ({str(exc).splitlines()[0]})") from None
    if data is not None and not isinstance(data, dict):  # a list or a scalar: not '... argument after ** must be a mapping'
        kind = "list" if isinstance(data, list) else type(data).__name__
        raise InputError(str(path), f"invalid relaunch spec: a YAML {kind}, not a mapping of schema_version, job, "
                                    "command...")
    try:
        return RelaunchSpec(**_joined_surrogates(data or {}))
    except (ValidationError, TypeError) as exc:
        msg = exc.errors()[0] if isinstance(exc, ValidationError) else {"msg": str(exc), "loc": ()}
        loc = ".".join(str(x) for x in msg.get("loc", ()))
        raise InputError(str(path), f"invalid relaunch spec: {loc + ': ' if loc else ''}{msg['msg']}") from None
