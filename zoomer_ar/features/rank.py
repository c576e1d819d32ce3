"""Per-rank feature extraction: everything that can be measured inside one rank's trace.

The parts, each a module of this package, run in this order over one RankContext (context.py): the
profiler steps (steps.py), torch.compile windows (startup.py), the device side (gpu.py, with the idle
gaps in idle.py), the host side (host.py), the operators' shapes and dtypes (operators.py), memory
growth (memory.py). Order matters twice: the steps bound the others' windows, and evidence created
after the idle gaps carry their launching call's Python frames (RankContext.launcher)."""

from __future__ import annotations

import numpy as np

from ..load.columns import RankTrace
from .context import RankContext, RankFeatures
from .gpu import gpu_features
from .host import host_features
from .memory import memory_features
from .operators import operator_features
from .startup import compile_windows
from .steps import profiler_steps

__all__ = ["RankFeatures", "rank_features"]


def rank_features(trace: RankTrace, window: tuple[int, int] | None = None) -> RankFeatures:
    """The rank's features; `window` (index, count) where the trace is one time window of the rank
    (features/windows.py: the parts then also record what the windows' merge needs)."""
    c = RankContext(trace)
    c.window = window
    rf = RankFeatures(rank=trace.rank, t0=c.t0)
    rf.v["has_python_stacks"] = c.frames.available
    step_starts, step_ends = profiler_steps(c, rf)
    c.compiles = compiles, recompiles = compile_windows(c, step_starts)  # host-side; gpu_features relates them to idle time
    rf.v["startup_compiles"], rf.v["recompiles"] = len(compiles), len(recompiles)
    rf.v["recompile_ms_total"] = float(trace.dur[np.asarray(recompiles, dtype=np.int64)].sum()) / 1000.0
    gpu_features(c, rf, step_starts, step_ends)
    host_features(c, rf, step_starts, step_ends)
    operator_features(c, rf)
    memory_features(c, rf, step_starts, step_ends)
    if recompiles:
        rf.evidence["recompiles"] = c.worst(np.asarray(recompiles, dtype=np.int64),
                                            detail=lambda i: "torch.compile compiling again: a recompilation")
    rf.evidence_keys = c.keys
    return rf
