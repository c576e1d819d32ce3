"""A rank's summary merged from time windows of its trace (features/windows.py, issue #8) equals the
summary of the whole trace: every feature value (to 1e-9 relative), the phases, the collectives, the
evidence (but ties and short_kernels' file order, as the module's table says) and, within 1.5 points, the
timeline. On every corpus trace with at least 4 ProfilerSteps and a generated 54-step trace, cut into 2
windows and into one window a step by window_rows (the file cutter's rules, in memory)."""

from __future__ import annotations

import math
import pickle
import sys

import numpy as np
import pytest

from zoomer_ar.features import names as N
from zoomer_ar.features.extract import RankSummary, summarise_rank
from zoomer_ar.features.windows import (
    median_of_counts, merge_windows, percentile_of_counts, summarise_window, window_rows, window_trace,
)
from zoomer_ar.load import load_job
from zoomer_ar.load.columns import PH_COMPLETE, RankTrace

from conftest import REPO, all_trace_files

REL = 1e-9
TIMELINE_POINTS = 0.75  # measured at most 0.46 busy-% points over the corpus (K = 2, 3, 5, 20)
TS_MS = 2e-4  # evidence times are rounded to 1e-4 ms in each window and again when shifted


def steps_of(trace: RankTrace) -> int:
    m = trace.mask_names(N.is_profiler_step) & ~trace.mask_cat("gpu_user_annotation") & (trace.ph == PH_COMPLETE)
    return int(m.sum())


def windowed(trace: RankTrace, count: int, pickled: bool = False) -> tuple[RankSummary, float]:
    rows = window_rows(trace, count)
    parts = []
    for k, r in enumerate(rows):
        wt = window_trace(trace, r)
        s = summarise_window(wt, k, len(rows))
        parts.append((pickle.loads(pickle.dumps(s)) if pickled else s, wt.ts_base))
    return merge_windows(parts)


def close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= max(REL * max(abs(a), abs(b)), 1e-9)
    return a == b and type(a) is type(b)


def differences(trace: RankTrace, whole: RankSummary, merged: RankSummary, base: float,
                skip: tuple[str, ...] = ()) -> list[str]:
    """What differs between the whole rank's summary and the merged one, beyond the declared bounds (values
    and evidence kinds in `skip` aside)."""
    out = []
    a, b = whole.features.v, merged.features.v
    for k in sorted(set(a) | set(b)):
        if k.startswith("_") or k in skip:
            continue
        if k not in a or k not in b or not close(a[k], b[k]):
            out.append(f"v[{k}]: {a.get(k, 'missing')} vs {b.get(k, 'missing')}")
    for k in whole.phases:
        if not close(whole.phases[k], merged.phases.get(k)):
            out.append(f"phases[{k}]: {whole.phases[k]} vs {merged.phases.get(k)}")
    if whole.start_unix_s != merged.start_unix_s or whole.runtime_calls != merged.runtime_calls:
        out.append("start_unix_s / runtime_calls")
    if abs((whole.features.t0 + trace.ts_base) - (merged.features.t0 + base)) > 1e-6:
        out.append("t0")
    for ctype in set(whole.features.collectives) | set(merged.features.collectives):
        ca, cb = whole.features.collectives.get(ctype), merged.features.collectives.get(ctype)
        xa, xb = whole.features.collectives_exposed.get(ctype), merged.features.collectives_exposed.get(ctype)
        if (ca is None or cb is None or ca[0].size != cb[0].size or np.abs(ca[0] + trace.ts_base - cb[0] - base).max() > 1e-6
                or np.abs(ca[1] - cb[1]).max() > 1e-9 or np.abs(xa - xb).max() > 1e-6):
            out.append(f"collectives[{ctype}]")
    ta, tb = whole.features.timeline(), merged.features.timeline()
    if len(ta) != len(tb) or any(abs(p.t_ms - q.t_ms) > 1e-3 or abs(p.busy_pct - q.busy_pct) > TIMELINE_POINTS
                                 for p, q in zip(ta, tb)):
        out.append("timeline")
    for kind in set(whole.features.evidence) | set(merged.features.evidence):
        if kind in skip:
            continue
        ea, eb = whole.features.evidence.get(kind), merged.features.evidence.get(kind)
        if ea is None or eb is None or len(ea) != len(eb):
            out.append(f"evidence[{kind}]: {None if ea is None else len(ea)} vs {None if eb is None else len(eb)} events")
            continue
        if kind == "short_kernels":  # the first 5 in file order: a window does not know the file's order
            continue
        if sorted((e.name, e.dur_ms) for e in ea) != sorted((e.name, e.dur_ms) for e in eb):
            out.append(f"evidence[{kind}]: {[(e.name[:40], e.dur_ms) for e in ea]} vs {[(e.name[:40], e.dur_ms) for e in eb]}")
            continue
        for e in eb:  # each merged event is one of the whole's events of its name and duration, at its time
            same = [x for x in ea if (x.name, x.dur_ms) == (e.name, e.dur_ms)]
            if not any(abs(x.ts_ms - e.ts_ms) <= TS_MS for x in same) and len(same) == 1:
                out.append(f"evidence[{kind}] {e.name[:40]} at {e.ts_ms} vs {same[0].ts_ms}")
        keys_a = sorted(whole.features.evidence_keys.get(id(e), -1.0) for e in ea)
        keys_b = sorted(merged.features.evidence_keys.get(id(e), -1.0) for e in eb)
        if not all(abs(x - y) <= 1e-6 * max(abs(x), 1.0) for x, y in zip(keys_a, keys_b)):
            out.append(f"evidence_keys[{kind}]")
    return out


# ----------------------------------------------------------------------------------------- percentiles


@pytest.mark.parametrize("seed", range(40))
def test_percentile_of_counts_is_numpys(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    values = rng.integers(0, 12, n).astype(np.float64) * rng.choice([1.0, 0.1, 1.7]) if seed % 2 else rng.random(n) * 1e4
    vals, counts = np.unique(values, return_counts=True)
    for q in (0, 1, 10, 25, 50, 90, 95, 99.9, 100):
        assert percentile_of_counts(vals, counts, q) == float(np.percentile(values, q)), (seed, q)
    assert median_of_counts(vals, counts) == float(np.median(values)), seed


def test_percentile_of_counts_of_nothing():
    assert percentile_of_counts(np.empty(0), np.empty(0, dtype=np.int64), 50) is None
    assert median_of_counts(np.empty(0), np.empty(0, dtype=np.int64)) is None


def test_merge_of_no_windows_is_an_error():
    with pytest.raises(ValueError, match="no windows"):
        merge_windows([])


def test_bad_windows_are_one_line_errors(stepped_traces):
    _, trace, _ = stepped_traces[0]
    with pytest.raises(ValueError, match="not .summarise_window's summary"):
        merge_windows([(summarise_rank(trace), 0.0)])  # a whole rank's summary carries no window state
    with pytest.raises(ValueError, match="window 2 of 2 does not exist"):
        summarise_window(trace, 2, 2)


# ----------------------------------------------------------------------------------------- corpus


@pytest.fixture(scope="module")
def stepped_traces() -> list[tuple[str, RankTrace, int]]:
    """Every corpus trace whose first rank has at least 4 CPU-side ProfilerSteps."""
    out = []
    for p in all_trace_files():
        try:
            trace = load_job(p).ranks[0]
        except Exception:  # not a trace the loader reads (an execution trace, a memory dump)
            continue
        n = steps_of(trace)
        if n >= 4 and isinstance(trace, RankTrace):
            out.append((str(p.relative_to(p.parents[2])), trace, n))
    if not out:
        pytest.skip("no corpus trace with 4 or more ProfilerSteps")
    return out


def test_corpus_has_the_stepped_traces(stepped_traces):
    assert len(stepped_traces) >= 7, [name for name, _, _ in stepped_traces]


@pytest.mark.parametrize("per_step", [False, True], ids=["2-windows", "window-per-step"])
def test_merged_windows_equal_the_whole_rank(stepped_traces, per_step):
    failures = {}
    for name, trace, n in stepped_traces:
        whole = summarise_rank(trace)
        merged, base = windowed(trace, n if per_step else 2)
        diff = differences(trace, whole, merged, base)
        if diff:
            failures[name] = diff
        assert merged.features.v.get("_w_union_overlap_us", 0.0) == 0.0, name  # the windows' middles stayed apart
    assert not failures, failures


def test_one_window_is_the_whole_rank(stepped_traces):
    name, trace, _ = stepped_traces[0]
    merged, base = windowed(trace, 1)
    assert not differences(trace, summarise_rank(trace), merged, base), name


def test_pickled_windows_merge_alike(stepped_traces):
    """Window summaries are computed in worker processes: pickled, they merge to the same summary."""
    name, trace, n = max(stepped_traces, key=lambda x: len(x[1]))
    merged, base = windowed(trace, n, pickled=True)
    assert not differences(trace, summarise_rank(trace), merged, base), name


def test_merge_leaves_its_windows_as_they_were(stepped_traces):
    """Merging the same windows twice gives the same summary (the merge changes none of its inputs)."""
    name, trace, _ = next(x for x in stepped_traces if "trace_diff/test" in x[0])
    rows = window_rows(trace, 3)
    parts = []
    for k, r in enumerate(rows):
        wt = window_trace(trace, r)
        parts.append((summarise_window(wt, k, len(rows)), wt.ts_base))
    before = pickle.dumps([p[0] for p in parts])
    first, base = merge_windows(parts)
    second, _ = merge_windows(parts)
    assert pickle.dumps([p[0] for p in parts]) == before
    assert not differences(trace, first, second, base), name


def test_window_state_stays_small(stepped_traces):
    """A window's summary holds per-step and edge state, not its events: far smaller than its rows."""
    name, trace, n = max(stepped_traces, key=lambda x: len(x[1]))
    rows = window_rows(trace, 2)
    for k, r in enumerate(rows):
        s = summarise_window(window_trace(trace, r), k, len(rows))
        assert "_gpu_union" not in s.features.v
        assert len(pickle.dumps(s)) < 8 * r.size, (name, k)


def test_normal_path_records_no_window_state(stepped_traces):
    _, trace, _ = stepped_traces[0]
    s = summarise_rank(trace)
    assert not any(k.startswith("_w") for k in s.features.v) and "_w" not in s.phases


def test_time_sliced_and_stepped_windows_of_every_trace():
    """Every corpus trace the loader reads, in 3 windows (equal time slices where it has no ProfilerSteps,
    at most one a step where it has some): windows without device work, start-up calls judged by the rank's
    typical call, graph captures across the cuts, host-basis phases."""
    failures, n = {}, 0
    for p in all_trace_files():
        try:
            trace = load_job(p).ranks[0]
        except Exception:  # not a trace the loader reads
            continue
        if not isinstance(trace, RankTrace):
            continue
        n += 1
        merged, base = windowed(trace, 3)
        diff = differences(trace, summarise_rank(trace), merged, base)
        if diff:
            failures[str(p)] = diff
    assert n >= 60 and not failures, failures


# ----------------------------------------------------------------------------------------- generated


def test_generated_trace_windows(tmp_path):
    """benchmarks/gen_trace.py's synthetic 54-step trace: 2 windows and one a step."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gen_trace

    path = tmp_path / "synthetic.json"
    gen_trace.generate(path, 0.005, synthetic=True, quiet=True)
    trace = load_job(path).ranks[0]
    n = steps_of(trace)
    assert n >= 40
    whole = summarise_rank(trace)
    for count in (2, 7, n):
        merged, base = windowed(trace, count)
        assert not differences(trace, whole, merged, base), count


# ----------------------------------------------------------------------------------------- with the file cutter


@pytest.mark.parametrize("rel", [
    "hta/trace_diff/test/test.json.gz",  # collectives running across the cuts beside compute
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # nanosecond timestamps
    "hta/cpu_only_full/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",  # no device: host phases
    "kineto/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
])
def test_window_files_read_by_the_streaming_reader(shared_traces, tmp_path, rel):
    """The real path: surgery.partition cuts the file, the streaming reader reads each window (tiny
    slices, pruning on), summarise_window and merge_windows give the whole rank's summary."""
    from zoomer_ar.stream import load_job_streaming
    from zoomer_ar.surgery.partition import partition_trace

    path = shared_traces / rel
    trace = load_job(path).ranks[0]
    whole = summarise_rank(trace)
    for count in (2, steps_of(trace)):
        out = tmp_path / f"k{count}"
        files = partition_trace(path, out, windows=count).files
        parts = []
        for k, f in enumerate(files):
            wt = load_job_streaming(f, workers=1, slice_bytes=1 << 16, prune_rows=0).ranks[0]
            parts.append((summarise_window(wt, k, len(files)), wt.ts_base))
        merged, base = merge_windows(parts)
        assert len(files) == count
        assert not differences(trace, whole, merged, base), (rel, count)


def test_an_edge_reaching_into_a_middle_is_measured(stepped_traces, monkeypatch):
    """The merge is exact while no window's edges reach into another's middle; where they do (here: heads of
    8 busy intervals, too short for the collectives that run on across the cuts) it says so in
    _w_union_overlap_us, and the busy time is off. With 64 intervals the same trace is exact again."""
    from zoomer_ar.features import gpu

    name, trace, n = next(x for x in stepped_traces if "trace_diff/test" in x[0])
    whole = summarise_rank(trace)
    monkeypatch.setattr(gpu, "HEAD_MAX", 8)
    merged, base = windowed(trace, n)
    assert merged.features.v["_w_union_overlap_us"] > 0
    assert differences(trace, whole, merged, base), name
    monkeypatch.setattr(gpu, "HEAD_MAX", 64)
    merged, base = windowed(trace, n)
    assert merged.features.v["_w_union_overlap_us"] == 0 and not differences(trace, whole, merged, base), name
