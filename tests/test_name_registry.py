"""The process-wide name registry behind RankTrace.name_codes (zoomer_ar/load/columns.py): a trace's cached
map to registry ids must never be used against another registry (a trace pickled between processes, as
the streaming path's rank workers hand theirs back, or a registry that started again)."""

from __future__ import annotations

import pickle

import numpy as np

from zoomer_ar.features import names as N
from zoomer_ar.load import columns as C
from zoomer_ar.load import load_job

TRACE = "examples/traces/clean"


def _steps(trace) -> list[str]:
    return sorted({trace.names[i] for i in trace.name_codes(N.is_profiler_step).tolist()})


def test_codes_survive_pickling_into_another_registry(monkeypatch):
    (trace,) = load_job(TRACE).ranks
    want = _steps(trace)
    assert want and all(n.startswith("ProfilerStep#") for n in want)
    blob = pickle.dumps(trace)
    # "another process": an empty registry whose ids mean other names
    monkeypatch.setattr(C, "_NAME_IDS", {})
    monkeypatch.setattr(C, "_NAME_LIST", [])
    monkeypatch.setattr(C, "_VERDICTS", {})
    monkeypatch.setattr(C, "_GENERATION", [object()])
    other = load_job(TRACE).ranks[0]
    other.names = list(reversed(other.names))  # registers the names in another order
    other.name_codes(N.is_profiler_step)
    back = pickle.loads(blob)
    back.__dict__.pop("_name_codes", None)  # a predicate the other process had not asked about
    assert _steps(back) == want
    assert np.array_equal(back.mask_names(N.is_profiler_step), trace.mask_names(N.is_profiler_step))


def test_registry_starting_again_invalidates_cached_ids(monkeypatch):
    (trace,) = load_job(TRACE).ranks
    want = _steps(trace)
    monkeypatch.setattr(C, "_VERDICTS_MAX", len(trace.names) + 1)  # the next trace overflows it
    (other,) = load_job(TRACE).ranks
    other.names = [f"x{i}" for i in range(len(other.names))]
    assert _steps(other) == []
    trace.__dict__.pop("_name_codes", None)
    assert _steps(trace) == want
