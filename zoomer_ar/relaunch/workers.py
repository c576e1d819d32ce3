"""DataLoader worker counts a relaunch sets, fitted to the machine `zoomer-ar relaunch` runs on.

A spec is written where the trace is analysed, which need not be where the job runs again, and the
trace holds no core count; so the spec's worker count (``dataloader.num_workers=4``,
``--num-workers=4``) is the most, and `zoomer-ar relaunch` lowers it to what this machine has, as
the dataloader-workers fixer's ``DATALOADER_WORKERS`` does when the patched program runs: the CPUs
the relaunch may use (its affinity where the OS has one), shared by the node's training processes
(``command.nproc_per_node`` under torchrun), one core left to each. With none left (one core per
process) the settings that need workers (``num_workers``, ``persistent_workers``,
``prefetch_factor``) are left out: a worker would only take turns with training on that core
(the dataloader_bound scenario pinned to one core: 50.8 ms/step with 0 workers, 55.1 with 1).
"""

from __future__ import annotations

import os

from .hydra_config import LEAF_SYNONYMS
from .loaders import is_worker_key

#: the leaves a worker count goes by (``dataloader.num_workers``, ``--num-workers``, ``data.workers``)
COUNT_LEAVES = frozenset(LEAF_SYNONYMS["num_workers"])


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the OS keeps one (Linux: a container's or
    taskset's share), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1].lstrip("-+").replace("-", "_").lower()


def is_count_key(key: str, value: object) -> bool:
    """A setting that is a DataLoader worker count: a count leaf with an integer value."""
    return _leaf(key) in COUNT_LEAVES and isinstance(value, int) and not isinstance(value, bool)


def fitted_count(most: int, cpus: int, processes: int = 1) -> int:
    """Workers for one training process: ``cpus`` shared by ``processes``, one core left to each, at most ``most``."""
    return max(0, min(most, cpus // max(1, processes) - 1))


def fit_overrides(overrides: dict[str, object], cpus: int, processes: int = 1) -> tuple[dict[str, object], str | None]:
    """``overrides`` with each worker count lowered to what ``cpus`` CPUs for ``processes`` training
    processes leave (all worker settings left out when that is none), and a line saying what changed
    (None: nothing did)."""
    counts = {k: v for k, v in overrides.items() if is_count_key(k, v)}
    if not counts:
        return overrides, None
    share = f"{cpus} usable CPU{'s' if cpus != 1 else ''}" + (f" for {processes} training processes" if processes > 1 else "")
    most = max(int(v) for v in counts.values())  # type: ignore[call-overload]
    fitted = fitted_count(most, cpus, processes)
    if fitted == 0:
        dropped = sorted(k for k in overrides if is_worker_key(k))
        kept = {k: v for k, v in overrides.items() if k not in dropped}
        return kept, (f"this machine has {share}: no core left for DataLoader workers besides training, so "
                      f"{', '.join(dropped)} {'are' if len(dropped) > 1 else 'is'} left out (a worker would only take "
                      "turns with training on that core); the spec's dataloader-bound gain does not apply here")
    if all(int(v) <= fitted for v in counts.values()):  # type: ignore[call-overload]
        return overrides, None
    out = {k: (min(int(v), fitted) if k in counts else v) for k, v in overrides.items()}  # type: ignore[call-overload]
    changed = ", ".join(f"{k}={overrides[k]} -> {out[k]}" for k in sorted(counts) if out[k] != overrides[k])
    return out, (f"worker count fitted to this machine ({share}, one core left to each training process): {changed}")


def count_note(overrides: dict[str, object]) -> str | None:
    """The spec's note on the worker counts it carries: the most, fitted where the job runs, and
    what the dataloader-bound gain assumes."""
    counts = sorted(f"{k}={v}" for k, v in overrides.items() if is_count_key(k, v))
    if not counts:
        return None
    return (f"{', '.join(counts)} is the most: `zoomer-ar relaunch` lowers it to the machine it runs on (its usable "
            "CPUs per training process, one core left to each: 1 worker on 2 cores; on a single core the worker "
            "settings are left out). The dataloader-bound part of expected_gain assumes those workers get cores "
            "the training does not use: on a machine other jobs keep busy they take turns with training instead, "
            "and loading in workers can be slower than loading in the training process.")
