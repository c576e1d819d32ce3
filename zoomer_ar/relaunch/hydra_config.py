"""A Hydra program's config, read statically, and the findings' settings fitted to its keys.

Hydra composes the config from ``config_path``/``config_name`` of ``@hydra.main`` (relative to the
file that declares it) and the primary file's ``defaults`` list (``- group: option`` loads
``group/option.yaml`` under ``group``). In struct mode it rejects an override of a key the config
lacks (``Could not override 'compile'. Key 'compile' is not in struct``) unless written
``+key=value``; and a key the program never reads changes nothing. So an override is carried:

* as is, when the config has the key;
* renamed, when one key clearly is that setting (``dataloader.num_workers`` -> ``data.workers``:
  a ``workers``/``num_workers`` key under a data/dataloader group, the only one);
* as ``+key=value``, when the config lacks it but the program reads it by name
  (``cfg.get("compile", False)``: the key is a string constant of its source);
* not at all otherwise, with a note.

The YAML is read with ``yaml.safe_load``; the program is never imported or run. A config that
cannot be found this way (a ConfigStore dataclass, ``pkg://`` paths, names built at run time) is
reported as unknown and the caller says the overrides are unchecked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .program import HydraMain

#: files of one composed config read at most (primary, defaults, their defaults)
MAX_FILES = 64
#: YAML files larger than this are not read
MAX_BYTES = 2 << 20
_PACKAGE = re.compile(r"^#\s*@package\s+(\S+)", re.M)

#: names a setting goes by in configs: the findings' leaf -> the leaves taken for the same setting
LEAF_SYNONYMS: dict[str, tuple[str, ...]] = {
    "num_workers": ("num_workers", "workers", "n_workers", "num_data_workers", "loader_workers", "dataloader_workers"),
    "pin_memory": ("pin_memory", "pin_mem"),
    "persistent_workers": ("persistent_workers",),
    "prefetch_factor": ("prefetch_factor",),
}
#: names a group of settings goes by: the findings' group -> path segments taken for it
GROUP_SYNONYMS: dict[str, tuple[str, ...]] = {
    "dataloader": ("dataloader", "data_loader", "loader", "loaders", "data", "dataset", "datasets", "datamodule",
                   "train_loader", "train_dataloader", "input", "inputs"),
    "ddp": ("ddp", "distributed", "dist", "parallel", "strategy"),
    "sharding": ("sharding", "sharder", "planner"),
}


@dataclass
class HydraConfig:
    """The composed config's keys (nested dicts, values as read) and the files it came from."""

    tree: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    base: Path | None = None  # the folder of the file declaring @hydra.main: files are named from there

    def where(self) -> str:
        def name(p: Path) -> str:
            try:
                return p.relative_to(self.base.resolve()).as_posix() if self.base else str(p)
            except ValueError:
                return str(p)

        return ", ".join(name(p) for p in self.files[:3]) + (
            f" and {len(self.files) - 3} more" if len(self.files) > 3 else "")

    def has(self, key: str) -> bool:
        node: Any = self.tree
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    def parent_is_node(self, key: str) -> bool:
        """The key's parent exists and holds keys (or is the root): ``+key`` adds a leaf there."""
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        if not parent:
            return True
        node: Any = self.tree
        for part in parent.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return isinstance(node, dict)

    def leaves(self) -> list[str]:
        out: list[str] = []

        def walk(node: dict, prefix: str) -> None:
            for k, v in node.items():
                key = f"{prefix}{k}"
                if isinstance(v, dict):
                    walk(v, key + ".")
                else:
                    out.append(key)

        walk(self.tree, "")
        return out


def _read_yaml(path: Path) -> tuple[Any, str | None]:
    """(document, its ``# @package`` header) of a YAML file; raises OSError/YAMLError/ValueError."""
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_BYTES >> 20} MiB")
    text = path.read_text(encoding="utf-8")
    m = _PACKAGE.search(text.split("\n\n", 1)[0])
    return yaml.safe_load(text), (m.group(1) if m else None)


def _place(tree: dict, package: str, doc: dict) -> None:
    node = tree
    for part in [p for p in package.split(".") if p]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    _merge(node, doc)


def _merge(into: dict, doc: dict) -> None:
    for k, v in doc.items():
        k = str(k)
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _choices(args: list[str]) -> dict[str, str]:
    """Group choices on the recorded command line (``data=imagenet``, ``+model=big``)."""
    out: dict[str, str] = {}
    for a in args:
        if "=" in a and not a.startswith(("~", "-")):
            k, v = a.split("=", 1)
            out[k.lstrip("+")] = v
    return out


def _yaml_name(name: str) -> str:
    return name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"


class _Composer:
    def __init__(self, root: Path, choices: dict[str, str]):
        self.root = root
        self.choices = choices
        self.files: list[Path] = []

    def load(self, rel: str, group: str, package: str | None, tree: dict, depth: int = 0) -> None:
        """Load ``root/rel`` (a file of ``group``) into ``tree`` at its package; its own defaults first."""
        path = (self.root / rel).resolve()
        if depth > 8 or len(self.files) >= MAX_FILES or path in self.files:
            return
        if not path.is_file():
            raise FileNotFoundError(str(self.root / rel))
        self.files.append(path)
        doc, header = _read_yaml(path)
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise ValueError(f"{path.name} is not a mapping")
        defaults = doc.pop("defaults", None) or []
        if package is None:
            package = header or group.replace("/", ".")
        package = {"_global_": "", "_group_": group.replace("/", ".")}.get(package, package)
        if package.startswith("_global_."):
            package = package[len("_global_."):]
        for entry in defaults if isinstance(defaults, list) else []:
            self._default(entry, group, package, tree, depth)
        _place(tree, package, doc)

    def _default(self, entry: Any, group: str, package: str, tree: dict, depth: int) -> None:
        base = f"{group}/" if group else ""
        if isinstance(entry, str):
            if entry != "_self_":  # another config of the same group
                self.load(base + _yaml_name(entry), group, package, tree, depth + 1)
            return
        if not isinstance(entry, dict) or len(entry) != 1:
            return
        (key, option), = entry.items()
        key = str(key)
        optional = key.startswith("optional ")
        key = key.split(" ", 1)[-1] if key.startswith(("optional ", "override ")) else key
        sub, _, pkg = key.partition("@")
        sub_group = f"{base}{sub}" if not sub.startswith("/") else sub.lstrip("/")
        if sub_group.split("/", 1)[0] == "hydra":  # Hydra's own groups (launcher, sweeper): not the job's keys
            return
        option = self.choices.get(sub_group.replace("/", "."), self.choices.get(sub, option))
        if option is None or option == "???" or isinstance(option, (list, dict)):
            return
        sub_package = pkg if pkg else None
        if sub_package is None:
            sub_package = sub_group.replace("/", ".")
        try:
            self.load(f"{sub_group}/{_yaml_name(str(option))}", sub_group, sub_package, tree, depth + 1)
        except FileNotFoundError:
            if not optional:
                raise


def find_config(hydra: HydraMain | None, args: list[str]) -> tuple[HydraConfig | None, str]:
    """The program's composed config, or (None, why not), read without running it.

    ``--config-path``/``-cp`` and ``--config-name``/``-cn`` on the recorded command line win over
    the decorator's, as they do for Hydra."""
    if hydra is None:
        return None, "no @hydra.main entry point to read config_path/config_name from"
    config_path, config_name = hydra.config_path, hydra.config_name
    for i, a in enumerate(args):
        for long, short in (("--config-path", "-cp"), ("--config-name", "-cn")):
            value = None
            if a in (long, short) and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(long + "="):
                value = a.split("=", 1)[1]
            if value is not None:
                if long == "--config-path":
                    config_path = value
                else:
                    config_name = value
    if not hydra.static and (config_path is None or config_name is None):
        return None, f"@hydra.main in {hydra.file.name} names its config with an expression, not a literal"
    if config_name is None:
        return None, f"@hydra.main in {hydra.file.name} gives no config_name"
    if config_path is None or config_path.startswith("pkg://"):
        return None, f"@hydra.main in {hydra.file.name} gives no config folder on disk (config_path {config_path!r})"
    root = Path(config_path.removeprefix("file://"))
    root = root if root.is_absolute() else hydra.file.parent / root
    composer = _Composer(root, _choices(args))
    tree: dict[str, Any] = {}
    try:
        composer.load(_yaml_name(config_name), "", "", tree)
    except FileNotFoundError as exc:
        return None, f"{exc.args[0]} is not on disk (a ConfigStore config is not read)"
    except (OSError, ValueError, yaml.YAMLError) as exc:
        return None, f"the config does not read as YAML ({str(exc).splitlines()[0] if str(exc) else exc!r})"
    return HydraConfig(tree, composer.files, hydra.file.parent), ""


def _group_matches(segments: list[str], group: str) -> bool:
    names = GROUP_SYNONYMS.get(group, (group,))
    return any(s.lower() in names or s.lower().startswith(tuple(f"{n}_" for n in names)) for s in segments)


def match_key(key: str, cfg: HydraConfig) -> tuple[str | None, list[str]]:
    """The config key that sets ``key``, else None and the keys that matched when more than one did.

    ``key`` itself when the config has it; else the one leaf named like it (its synonyms) under a
    group named like its group (``dataloader.num_workers`` -> ``data.workers``,
    ``train.loader.num_workers``); a key without group (``compile``) matches one leaf of that name."""
    if cfg.has(key):
        return key, []
    group, _, leaf = key.rpartition(".")
    names = LEAF_SYNONYMS.get(leaf, (leaf,))
    hits = []
    for candidate in cfg.leaves():
        *parents, last = candidate.split(".")
        if last.lower() not in names:
            continue
        if group and not _group_matches(parents, group.rsplit(".", 1)[-1]):
            continue
        hits.append(candidate)
    if len(hits) == 1:
        return hits[0], []
    return None, hits


def can_add(key: str, cfg: HydraConfig, strings: frozenset[str]) -> bool:
    """``+key=value`` is a valid choice: the config lacks the key, its parent is a node of the config
    (or the root), and the program reads the key by name (``cfg.get("compile", False)``,
    ``OmegaConf.select(cfg, "data.workers")``: a string constant of its source), so the added key
    reaches code that reads it. A key read as an attribute (``cfg.compile``) is not counted: on a
    config without it that read would already have failed."""
    if cfg.has(key) or not cfg.parent_is_node(key):
        return False
    return key in strings or key.rsplit(".", 1)[-1] in strings
