"""The straggler features match the k-th collective of each type across ranks (features.extract._cross_rank).
A rank's collectives are kept as arrays per type (features.gpu), so a summary of a rank with 10^5
collectives stays small, and the matching runs on whole columns of collectives at a time. This checks it
against the plain per-collective loop it replaced (written out below), across chunk boundaries, on ranks
with missing types and unequal counts, and on the real dlrm_8ranks job."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from conftest import SHARED_TRACES
from zoomer_ar.detect.rules import get_rule
from zoomer_ar.features import FeatureVector
from zoomer_ar.features.context import RankFeatures
from zoomer_ar.features.extract import extract, summarise_rank
from zoomer_ar.load import load_job

X = importlib.import_module("zoomer_ar.features.extract")  # the module (the package exports the function)


def _reference(rfs: list[RankFeatures]) -> tuple[list[float], list[float], list[float], int, list[tuple]]:
    """The loop over (type, k) the matching replaced: (caused per rank, its exposed part, last count per rank,
    matched, worst 5)."""
    by_type: dict[str, list[list[tuple[float, float, float]]]] = {}
    for r, rf in enumerate(rfs):
        for ctype in rf.collectives:
            by_type.setdefault(ctype, [[] for _ in rfs])
            free = rf.collectives_exposed.get(ctype, rf.collectives[ctype][1])
            by_type[ctype][r] = list(zip(rf.collectives[ctype][0].tolist(), rf.collectives[ctype][1].tolist(), free.tolist()))
    caused, exposed, last_count, matched, worst = [0.0] * len(rfs), [0.0] * len(rfs), [0.0] * len(rfs), 0, []
    for ctype, lists in by_type.items():
        for k in range(min(len(x) for x in lists)):
            durs = [lists[r][k][1] for r in range(len(rfs))]
            last = durs.index(min(durs))
            wait = [d - durs[last] for d in durs]
            caused[last] += sum(wait) / max(len(rfs) - 1, 1)
            exposed[last] += sum(max(0.0, min(w, lists[r][k][2])) for r, w in enumerate(wait)) / max(len(rfs) - 1, 1)
            last_count[last] += 1
            matched += 1
            worst.append((max(wait), ctype, k, last, lists[last][k][0]))
    worst.sort(key=lambda x: x[:4], reverse=True)
    return caused, exposed, last_count, matched, worst[:5]


def _ranks(rng: np.random.Generator, n_ranks: int, counts: dict[str, list[int]]) -> list[RankFeatures]:
    rfs = []
    for r in range(n_ranks):
        rf = RankFeatures(rank=r, v={"step_ms": 10.0, "n_steps": 4, "compute_ms_total": 30.0 + r}, t0=1000.0)
        for ctype, per_rank in counts.items():
            n = per_rank[r]
            if n < 0:
                continue  # this rank has no collective of this type
            ts = np.sort(rng.uniform(1000.0, 1e6, n))
            dur = np.round(rng.uniform(5.0, 500.0, n), 1)  # ties happen: argmin takes the first rank, as before
            rf.collectives[ctype] = (ts, dur)
            rf.collectives_exposed[ctype] = dur * rng.uniform(0.0, 1.0, n)  # the rest overlapped by compute
        rfs.append(rf)
    return rfs


@pytest.mark.parametrize("chunk", [3, 64, 65536])
def test_matching_equals_the_per_collective_loop(monkeypatch, chunk):
    monkeypatch.setattr(X, "_MATCH_CHUNK", chunk)
    rng = np.random.default_rng(7)
    rfs = _ranks(rng, 4, {"AllReduce": [200, 200, 190, 200], "AllGather": [50, 50, 50, 50],
                          "Broadcast": [5, -1, 5, 5], "ReduceScatter": [0, 0, 0, 0]})
    caused, exposed, last_count, matched, worst = _reference(rfs)
    assert matched == 240  # 190 AllReduce + 50 AllGather; Broadcast is missing on rank 1
    out: dict = {}
    evidence = X._cross_rank(rfs, out)
    s = int(np.argmax(caused))
    assert out["slowest_rank"] == s
    assert out["straggler_wait_ms_per_step"] == pytest.approx(caused[s] / 1000.0 / 4, rel=1e-12)
    assert out["straggler_exposed_wait_ms_per_step"] == pytest.approx(exposed[s] / 1000.0 / 4, rel=1e-12)
    assert 0 < out["straggler_exposed_wait_ms_per_step"] < out["straggler_wait_ms_per_step"]
    assert out["straggler_last_share"] == pytest.approx(last_count[s] / matched, rel=1e-12)
    got = [(e.rank, e.dur_ms, e.ts_ms, e.name.split(":")[0]) for e in evidence["straggler"]]
    want = [(last, round(w / 1000.0, 4), round((ts - 1000.0) / 1000.0, 4), f"{ctype} #{k}")
            for w, ctype, k, last, ts in worst]
    assert got == want


def test_no_match_without_a_type_on_every_rank():
    rfs = _ranks(np.random.default_rng(1), 3, {"AllReduce": [10, -1, 10]})
    out: dict = {}
    assert "straggler" not in X._cross_rank(rfs, out)
    assert "straggler_wait_ms_per_step" not in out


def test_a_summary_holds_its_collectives_as_arrays():
    """Each NCCL kernel of the rank, by type, in order of start, as float64 arrays (8 B + 8 B a collective
    in a pickled summary, where a tuple of a str and two floats cost ~100 B)."""
    job = load_job(SHARED_TRACES / "param/dlrm_8ranks")
    t = job.ranks[0]
    nccl = [i for i in range(len(t)) if t.cat_of(i) == "kernel" and t.name_of(i).startswith("ncclKernel")]
    coll = summarise_rank(t).features.collectives
    assert sorted(coll) == ["all_reduce", "send_recv"]  # all_to_all runs as NCCL send/recv kernels
    assert sum(ts.size for ts, _ in coll.values()) == len(nccl) > 0
    assert sorted(float(x) for ts, _ in coll.values() for x in ts) == sorted(float(t.ts[i]) for i in nccl)
    assert all(ts.dtype == np.float64 and dur.dtype == np.float64 and np.all(np.diff(ts) >= 0)
               for ts, dur in coll.values())
    # and the job's straggler figures still come from them: rank 7 arrives last (LABELS.yaml)
    assert extract(job).vector.slowest_rank == 7


def _lagging_job(free_until_last: float) -> list[RankFeatures]:
    """4 ranks, one step, 4 all-reduces (DDP buckets): rank 3 is 1 ms late once, before the first bucket, so it
    arrives 1 ms after the others at each (its kernels take 0.1 ms, theirs 1.1 ms). Of each waiting rank's
    all-reduce, `free_until_last` us has no compute beside it, except the last bucket's: nothing (backward is done)."""
    rfs = []
    for r in range(4):
        rf = RankFeatures(rank=r, v={"step_ms": 20.0, "n_steps": 1, "compute_ms_total": 15.0}, t0=0.0)
        dur = np.full(4, 100.0 if r == 3 else 1100.0)
        rf.collectives["AllReduce"] = (np.array([3000.0, 6000.0, 9000.0, 12000.0]), dur)
        rf.collectives_exposed["AllReduce"] = np.array([free_until_last] * 3 + [dur[-1]])
        rfs.append(rf)
    return rfs


def test_a_lag_waited_for_at_every_bucket_costs_its_exposed_part():
    """The 1 ms lag is waited for 4 times (4 ms of waiting per step), but the others compute through the first
    three waits: only the last bucket's 1 ms holds them up, and the rule costs that, not 4 ms (20% of the step)."""
    out: dict = {}
    X._cross_rank(_lagging_job(0.0), out)
    assert out["slowest_rank"] == 3 and out["straggler_last_share"] == 1.0
    assert out["straggler_wait_ms_per_step"] == pytest.approx(4.0)
    assert out["straggler_exposed_wait_ms_per_step"] == pytest.approx(1.0)
    rule = get_rule("straggler")
    features = FeatureVector(n_ranks=4, step_ms=20.0, **out).model_dump()
    assert rule.evaluate(features)["impact_pct"] == pytest.approx(5.0)  # 1 ms of 20, not 20%
    # the same waits with nothing else on the others' GPUs are all exposed
    out = {}
    X._cross_rank(_lagging_job(1100.0), out)
    assert out["straggler_exposed_wait_ms_per_step"] == pytest.approx(4.0)
    # compute beside the kernel fills its transfer (0.1 ms) first: 0.5 ms free leaves 0.5 ms of each wait exposed
    out = {}
    X._cross_rank(_lagging_job(500.0), out)
    assert out["straggler_exposed_wait_ms_per_step"] == pytest.approx(3 * 0.5 + 1.0)


def test_the_dlrm_stragglers_wait_is_exposed():
    """param/dlrm_8ranks (LABELS.yaml: straggler positive): its all_to_all waits block the ranks, nothing runs
    beside them, so almost all of the waiting for rank 7 is exposed."""
    f = extract(load_job(SHARED_TRACES / "param/dlrm_8ranks")).vector
    assert f.slowest_rank == 7
    assert f.straggler_exposed_wait_ms_per_step == pytest.approx(f.straggler_wait_ms_per_step, rel=0.02)
    assert f.straggler_exposed_wait_ms_per_step > 0.25 * f.step_ms
