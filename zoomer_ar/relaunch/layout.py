"""How a multi-rank job was spread over nodes, from what its records say (never guessed).

torchrun needs ``--nnodes`` and ``--nproc_per_node``: a 2x8 job relaunched as
``--nproc_per_node=16`` starts 16 processes on one node. The layout is taken from, in order:

* job.json (the capture helper's, rank 0) and its nested ``env``/``distributed``/``launch``/
  ``metadata`` objects: ``local_world_size``/``LOCAL_WORLD_SIZE``/``nproc_per_node``,
  ``nnodes``/``num_nodes``/``GROUP_WORLD_SIZE``, ``hosts``/``hostnames`` (a list);
* the hostnames of the per-rank records (job.json and ``job.ranks/rank-N.json``), when they cover
  every rank;
* the first rank trace's ``distributedInfo`` (the same keys).

When none of them says, the layout is unknown and the caller says so in a note.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCAL_KEYS = ("local_world_size", "LOCAL_WORLD_SIZE", "nproc_per_node", "NPROC_PER_NODE")
NODES_KEYS = ("nnodes", "NNODES", "num_nodes", "n_nodes", "node_count", "GROUP_WORLD_SIZE", "group_world_size")
HOSTS_KEYS = ("hosts", "hostnames", "nodes")
NESTED = ("env", "environ", "environment", "distributed", "dist", "launch", "launcher", "torchrun", "metadata")
#: rank records (job.ranks/rank-N.json) read at most
MAX_RANK_FILES = 4096


@dataclass(frozen=True)
class Layout:
    """nnodes x nproc_per_node, either None when unknown; ``source`` says where it was read."""

    nnodes: int | None
    nproc_per_node: int | None
    source: str = ""
    problem: str = ""


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int) and v > 0:
        return v
    if isinstance(v, str) and v.strip().isdigit() and int(v) > 0:
        return int(v)
    return None


def _facts(doc: Any, depth: int = 0) -> tuple[int | None, int | None, list[str] | None]:
    """(local world size, node count, host list) a record states, looking into its nested objects."""
    if not isinstance(doc, dict) or depth > 2:
        return None, None, None
    local = next((v for k in LOCAL_KEYS if (v := _int(doc.get(k)))), None)
    nodes = next((v for k in NODES_KEYS if (v := _int(doc.get(k)))), None)
    hosts = next((v for k in HOSTS_KEYS if isinstance(v := doc.get(k), list) and v
                  and all(isinstance(h, str) and h for h in v)), None)
    for k in NESTED:
        if local and nodes:
            break
        sub_local, sub_nodes, sub_hosts = _facts(doc.get(k), depth + 1)
        local, nodes, hosts = local or sub_local, nodes or sub_nodes, hosts or sub_hosts
    return local, nodes, hosts


def _solve(world: int, local: int | None, nodes: int | None, hosts: list[str] | None, where: str) -> Layout | None:
    if nodes is None and hosts:
        nodes = len(set(hosts))
    if local and nodes:
        if local * nodes == world:
            return Layout(nodes, local, where)
        return Layout(None, None, where, f"{where} says {nodes} node(s) x {local} process(es), not the {world} ranks")
    if local:
        if world % local == 0:
            return Layout(world // local, local, where)
        return Layout(None, None, where, f"{where} gives {local} processes per node, which does not divide "
                                         f"{world} ranks")
    if nodes:
        if world % nodes == 0:
            return Layout(nodes, world // nodes, where)
        return Layout(None, None, where, f"{where} gives {nodes} nodes, which do not share {world} ranks evenly")
    return None


def _rank_hosts(folder: Path, job: dict, world: int) -> Layout | None:
    """From the per-rank records' hostnames, when every rank left one."""
    records = [job]
    ranks_dir = folder / "job.ranks"
    if ranks_dir.is_dir():
        for p in sorted(ranks_dir.glob("rank-*.json"))[:MAX_RANK_FILES]:
            try:
                records.append(json.loads(p.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
    hosts: dict[int, str] = {}
    for r in records:
        if isinstance(r, dict) and isinstance(r.get("rank"), int) and isinstance(r.get("hostname"), str):
            hosts[r["rank"]] = r["hostname"]
    if set(hosts) != set(range(world)):
        return None
    counts = Counter(hosts.values())
    where = "the per-rank job records' hostnames"
    if len(set(counts.values())) != 1:
        spread = ", ".join(f"{h}: {n}" for h, n in sorted(counts.items()))
        return Layout(len(counts), None, where, f"{where} show uneven nodes ({spread}); torchrun starts as many "
                                                "processes on every node")
    return Layout(len(counts), next(iter(counts.values())), where)


def _trace_top(rank_paths: list[str]) -> dict:
    if not rank_paths:
        return {}
    try:
        from ..surgery.ops import peek_top

        dist = peek_top(Path(rank_paths[0])).get("distributedInfo")
    except Exception:  # noqa: BLE001 - an unreadable head only means the layout is not known from it
        return {}
    return dist if isinstance(dist, dict) else {}


def node_layout(world: int, job: dict, folder: Path | None, rank_paths: list[str]) -> Layout:
    """The job's node layout from its records; Layout(None, None) when they do not say."""
    found = _solve(world, *_facts(job), "job.json") if job else None
    if found is None and job and folder is not None:
        found = _rank_hosts(folder, job, world)
    if found is None:
        found = _solve(world, *_facts(_trace_top(rank_paths)), "the trace's distributedInfo")
    return found or Layout(None, None)
