"""Discrete-event simulation of one training/inference job: host threads, CUDA streams, collectives.

A rank's *program* is a list of host-side operations in program order (tuples, see `OPS`). The
scheduler plays every rank's program against a model of the device: kernels start when their
launch has reached the GPU and their stream is free; a host synchronisation waits for the stream
to drain; `cudaFree` waits for the device; pageable copies block the host; a collective starts on
each rank when that rank's inputs are ready and ends when the last rank has arrived plus the
transfer time; the launch queue holds at most QUEUE_DEPTH kernels. With `emit=True` it also
writes the Kineto events (the same categories, names and args as the PyTorch profiler), so the
documents go through the real loader and feature extractor.

Ground truth it returns per rank (used for labels, never as features): the GPU busy intervals,
the idle gaps caused by the host launch path, host stall intervals, exposed collective transfer.

Program operations (tuples; first item is the code):
  ("B", name, cat, args)        begin a nested range (user_annotation, cpu_op, python_function)
  ("E",)                        end the innermost range
  ("H", us, stall[, tag])       host time with no event; stall=True marks it as a host stall;
                                tag "straggler": only on the straggler rank
  ("K", op, kernels, pre_us, args, children)
                                a cpu_op (with nested child op names) launching kernels
                                [(name, dur_us, stream)] on the compute stream
  ("C", kind, nbytes, dur_us, pageable, op)   a memcpy (htod/dtoh/dtod) launched by a copy op
  ("DL", us, workers)           DataLoader __next__ (host busy; a stall)
  ("SYNC", api)                 cudaStreamSynchronize / cudaDeviceSynchronize
  ("ITEM",)                     aten::item -> _local_scalar_dense -> DtoH copy + stream sync
  ("ALLOC", api, us)            cudaMalloc / cudaFree (cudaFree waits for the device)
  ("COLL", ctype, transfer_us, nbytes, kname)  a collective kernel on the comm stream
  ("WAITCOMM",)                 the compute stream waits for the comm stream
  ("MEM", delta_bytes)          a [memory] instant event (profile_memory)
  ("MARK",)                     end of an iteration (ground truth only)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..features import intervals as iv

COMPUTE_STREAM = 7
COMM_STREAM = 13
QUEUE_DEPTH = 1024
HOST_PID = 4242
MAIN_TID = 4242
SYNC_TOL_US = 50.0


@dataclass
class RankRun:
    """One rank's simulated timeline: events (when emitted) and ground truth."""

    rank: int
    events: list[dict[str, Any]] = field(default_factory=list)
    t_first: float = float("inf")
    t_last: float = 0.0
    gpu: list[tuple[float, float, float, int]] = field(default_factory=list)  # start, end, launch_end, kind
    stalls: list[tuple[float, float]] = field(default_factory=list)
    sync_returns: list[float] = field(default_factory=list)
    transfers: list[tuple[float, float]] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    marks: list[float] = field(default_factory=list)  # end of each iteration (host or queued GPU work)
    kernel_durs: list[float] = field(default_factory=list)
    launch_durs: list[float] = field(default_factory=list)


KIND_COMPUTE, KIND_COMM, KIND_COPY = 0, 1, 2


class _Rank:
    def __init__(self, rank: int, program: list[tuple], lat: np.ndarray, t0: float, emit: bool, device: int,
                 kmul: float = 1.0, hjit: list[float] | None = None, straggler: bool = False):
        self.r = RankRun(rank=rank)
        self.prog = program
        self.lat = lat  # launch latencies (cycled)
        self.li = 0
        self.h = t0
        self.streams = {COMPUTE_STREAM: t0, COMM_STREAM: t0}
        self.stack: list[tuple[str, str, float, dict]] = []
        self.emit = emit
        self.ext = 1
        self.corr = 1
        self.device = device
        self.queue: list[float] = []
        self.mem_total = 0.0
        self.kmul = kmul  # this rank's compute speed (sharding imbalance, per-rank jitter)
        self.hjit = hjit or [1.0]  # per-op host-time jitter, cycled
        self.hj = 0
        self.straggler = straggler

    # --- helpers ---------------------------------------------------------------------------------
    def _latency(self) -> float:
        v = float(self.lat[self.li % self.lat.size])
        self.li += 1
        return v

    def _x(self, name: str, cat: str, ts: float, dur: float, args: dict | None = None, pid=HOST_PID, tid=MAIN_TID):
        if self.emit:
            ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur if dur > 0.0 else 0.0}
            if args:
                ev["args"] = args
            self.r.events.append(ev)

    def _queue_wait(self) -> None:
        q = self.queue
        while q and q[0] <= self.h:
            heapq.heappop(q)
        if len(q) >= QUEUE_DEPTH:
            self.h = heapq.heappop(q)

    def _gpu(self, name: str, cat: str, dur: float, stream: int, launch_ts: float, launch_end: float, corr: int,
             ext: int, kind: int, extra: dict | None = None) -> tuple[float, float]:
        start = max(launch_ts + self._latency(), self.streams[stream])
        end = start + dur
        self.streams[stream] = end
        heapq.heappush(self.queue, end)
        self.r.gpu.append((start, end, launch_end, kind))
        if kind == KIND_COMPUTE:
            self.r.kernel_durs.append(dur)
        if self.emit:
            args = {"External id": ext, "device": self.device, "stream": stream, "correlation": corr}
            if extra:
                args.update(extra)
            self._x(name, cat, start, dur, args, pid=self.device, tid=stream)
        return start, end

    def _launch(self, api: str, dur: float, ext: int) -> tuple[float, float, int]:
        self._queue_wait()
        corr = self.corr
        self.corr += 1
        ts = self.h
        self.h += dur
        if api.endswith("LaunchKernel"):
            self.r.launch_durs.append(dur)
        self._x(api, "cuda_runtime", ts, dur, {"External id": ext, "correlation": corr})
        return ts, self.h, corr

    # --- the interpreter: a generator that yields at each collective --------------------------------
    def run(self):
        lat_launch = 4.0
        for op in self.prog:
            code = op[0]
            if code == "K":
                _, name, kernels, pre, args, children = op
                t_op = self.h
                ext = self.ext
                self.ext += 1 + len(children)
                self.h += pre * self.hjit[self.hj % len(self.hjit)]
                self.hj += 1
                inner_ext = ext + len(children)
                child_start = self.h
                for kname, kdur, klaunch in kernels:
                    lts, lend, corr = self._launch("cudaLaunchKernel", klaunch, inner_ext)
                    self._gpu(kname, "kernel", kdur * self.kmul, COMPUTE_STREAM, lts, lend, corr, inner_ext, KIND_COMPUTE)
                self.h += 1.0
                if self.emit:
                    # nested child ops share the launch window (innermost last)
                    for j, child in enumerate(children):
                        cargs = args if j == len(children) - 1 else None
                        self._x(child, "cpu_op", child_start - 0.5 * (len(children) - j), self.h - child_start + 0.5 * (len(children) - j),
                                {"External id": ext + 1 + j, **(cargs or {})})
                    self._x(name, "cpu_op", t_op, self.h - t_op + 0.5, {"External id": ext, **(args if not children else {})})
                self.h += 0.5
            elif code == "B":
                _, name, cat, args = op
                self.stack.append((name, cat, self.h, args))
                self.h += 0.5
            elif code == "E":
                name, cat, ts, args = self.stack.pop()
                self.h += 0.5
                if self.emit:
                    a = {"External id": self.ext, **(args or {})}
                    self.ext += 1
                    self._x(name, cat, ts, self.h - ts, a)
            elif code == "H":
                _, us, stall, *tag = op
                if tag and tag[0] == "straggler" and not self.straggler:
                    continue
                if stall:
                    self.r.stalls.append((self.h, self.h + us))
                self.h += us
            elif code == "DL":
                _, us, workers = op
                it = "_MultiProcessingDataLoaderIter" if workers else "_SingleProcessDataLoaderIter"
                self.r.stalls.append((self.h, self.h + us))
                self._x(f"enumerate(DataLoader)#{it}.__next__", "user_annotation", self.h, us, {"External id": self.ext})
                self.ext += 1
                self.h += us
            elif code == "C":
                _, kind, nbytes, dur, pageable, opname = op
                t_op = self.h
                ext = self.ext
                self.ext += 3
                self.h += 3.0
                lts, lend, corr = self._launch("cudaMemcpyAsync", 4.0, ext + 2)
                if kind == "dtod":
                    mname = "Memcpy DtoD (Device -> Device)"
                elif kind == "htod":
                    mname = "Memcpy HtoD (Pageable -> Device)" if pageable else "Memcpy HtoD (Pinned -> Device)"
                else:
                    mname = "Memcpy DtoH (Device -> Pageable)" if pageable else "Memcpy DtoH (Device -> Pinned)"
                start, end = self._gpu(mname, "gpu_memcpy", dur, COMPUTE_STREAM, lts, lend, corr, ext + 2, KIND_COPY,
                                       {"bytes": int(nbytes)})
                if pageable:  # staged through a bounce buffer: the host waits for the copy
                    self.r.stalls.append((lend, end))
                    if self.emit:
                        self.r.events[-2]["dur"] = round(end - lts, 3)  # the cudaMemcpyAsync call blocks
                    self.h = max(self.h, end)
                self.h += 2.0
                if self.emit:
                    self._x(opname, "cpu_op", t_op, self.h - t_op, {"External id": ext})
                    self._x("aten::copy_", "cpu_op", t_op + 1.0, self.h - t_op - 1.5, {"External id": ext + 1})
            elif code == "SYNC":
                _, api = op
                ts = self.h
                done = max(self.streams.values()) if api == "cudaDeviceSynchronize" else self.streams[COMPUTE_STREAM]
                self.h = max(self.h + 2.0, done + 1.0)
                self.r.stalls.append((ts, self.h))
                self.r.sync_returns.append(self.h)
                self._x(api, "cuda_runtime", ts, self.h - ts, {"External id": self.ext, "correlation": self.corr})
                self.ext += 1
                self.corr += 1
            elif code == "ITEM":
                ts = self.h
                ext = self.ext
                self.ext += 2
                self.h += 3.0
                lts, lend, corr = self._launch("cudaMemcpyAsync", 4.0, ext + 1)
                _, cend = self._gpu("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 1.5, COMPUTE_STREAM, lts, lend, corr,
                                    ext + 1, KIND_COPY, {"bytes": 4})
                s0 = self.h
                self.h = max(self.h + 2.0, cend + 1.0)
                self.r.stalls.append((ts, self.h))
                self.r.sync_returns.append(self.h)
                self._x("cudaStreamSynchronize", "cuda_runtime", s0, self.h - s0, {"External id": ext + 1, "correlation": self.corr})
                self.corr += 1
                self.h += 1.0
                self._x("aten::_local_scalar_dense", "cpu_op", ts + 1.0, self.h - ts - 1.5, {"External id": ext + 1})
                self._x("aten::item", "cpu_op", ts, self.h - ts, {"External id": ext})
                self.h += 0.5
            elif code == "ALLOC":
                _, api, us = op
                ts = self.h
                if api in ("cudaFree", "cudaFreeHost"):
                    self.h = max(self.h, max(self.streams.values()))
                self.h += us
                self.r.stalls.append((ts, self.h))
                self._x(api, "cuda_runtime", ts, self.h - ts, {"External id": self.ext, "correlation": self.corr})
                self.ext += 1
                self.corr += 1
            elif code == "COLL":
                _, ctype, transfer, nbytes, kname = op
                ts = self.h
                ext = self.ext
                self.ext += 2
                self.h += 6.0
                lts, lend, corr = self._launch("cudaLaunchKernel", lat_launch, ext + 1)
                ready = max(lts + self._latency(), self.streams[COMM_STREAM], self.streams[COMPUTE_STREAM])
                end = yield (ready, transfer)  # the job scheduler answers with the collective's end
                self.streams[COMM_STREAM] = end
                heapq.heappush(self.queue, end)
                self.r.gpu.append((ready, end, lend, KIND_COMM))
                self.r.transfers.append((max(ready, end - transfer), end))
                self.r.waits.append(max(0.0, end - transfer - ready))
                self.h += 2.0
                if self.emit:
                    self._x(kname, "kernel", ready, end - ready,
                            {"External id": ext + 1, "device": self.device, "stream": COMM_STREAM, "correlation": corr},
                            pid=self.device, tid=COMM_STREAM)
                    self._x("record_param_comms", "cpu_op", ts + 1.0, self.h - ts - 1.5,
                            {"External id": ext + 1, "Collective name": ctype, "In msg nelems": int(nbytes // 4)})
                    self._x(f"nccl:{ctype}", "user_annotation", ts, self.h - ts, {"External id": ext})
            elif code == "WAITCOMM":
                self.streams[COMPUTE_STREAM] = max(self.streams[COMPUTE_STREAM], self.streams[COMM_STREAM])
                self._x("cudaStreamWaitEvent", "cuda_runtime", self.h, 2.0, {"External id": self.ext, "correlation": self.corr})
                self.corr += 1
                self.h += 2.5
            elif code == "MARK":
                self.r.marks.append(max(self.h, max(self.streams.values())))
            elif code == "MEM":
                _, delta = op
                self.mem_total += delta
                if self.emit:
                    self.r.events.append({
                        "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": HOST_PID,
                        "tid": MAIN_TID, "ts": round(self.h, 3),
                        "args": {"Total Allocated": int(self.mem_total), "Bytes": int(delta), "Device Id": self.device,
                                 "Device Type": 1},
                    })
                self.h += 0.2
            else:  # pragma: no cover - programming error
                raise ValueError(f"unknown op {code}")
        while self.stack:  # close unbalanced ranges
            name, cat, ts, args = self.stack.pop()
            self._x(name, cat, ts, self.h - ts, args)


def simulate(programs: list[list[tuple]], latencies: list[np.ndarray], t0s: list[float],
             emit: bool = False, devices: list[int] | None = None, rank_params: list[dict] | None = None) -> list[RankRun]:
    """Run all ranks together; collectives synchronise them (k-th COLL of every rank is one collective).

    `rank_params[r]`: kmul (compute-kernel duration multiplier), hjit (host-time jitter factors),
    straggler (True: this rank runs the ("H", us, stall, "straggler") delays)."""
    rp = rank_params or [{} for _ in programs]
    ranks = [_Rank(r, p, latencies[r], t0s[r], emit, (devices or [0] * len(programs))[r], **rp[r])
             for r, p in enumerate(programs)]
    gens = [rk.run() for rk in ranks]
    pending: list[tuple[float, float] | None] = []
    for g in gens:
        try:
            pending.append(next(g))
        except StopIteration:
            pending.append(None)
    while any(p is not None for p in pending):
        if any(p is None for p in pending):
            raise ValueError("ranks disagree on the number of collectives")
        arrival = max(p[0] for p in pending)  # type: ignore[index]
        # the k-th collective: every rank's COLL op carries the same transfer time
        end = arrival + pending[0][1]  # type: ignore[index]
        nxt: list[tuple[float, float] | None] = []
        for g in gens:
            try:
                nxt.append(g.send(end))
            except StopIteration:
                nxt.append(None)
        pending = nxt
    for rk in ranks:
        run = rk.r
        starts = [g[0] for g in run.gpu]
        run.t_first = min([t0s[rk.r.rank]] + starts)
        run.t_last = max([rk.h] + [g[1] for g in run.gpu])
    return [rk.r for rk in ranks]


# --- ground truth from a run -------------------------------------------------------------------------

def busy_pct(run: RankRun) -> float | None:
    if not run.gpu:
        return None
    a = np.array(run.gpu)
    us, ue = iv.union(a[:, 0], a[:, 1])
    span = float(ue.max() - us.min())
    return 100.0 * float((ue - us).sum()) / span if span > 0 else 100.0


def launch_idle_us(run: RankRun) -> tuple[float, float]:
    """(GPU idle waiting for the host launch path, total GPU idle), in microseconds.

    A gap is host-bound when the next GPU op's launch call ended after the gap began; from it we
    subtract host stalls (DataLoader, syncs and what follows them, allocator calls, pageable
    copies, straggler delays): what remains is the launch/dispatch path itself."""
    if not run.gpu:
        return 0.0, 0.0
    a = np.array(run.gpu)
    order = np.argsort(a[:, 0], kind="stable")
    a = a[order]
    us, ue = iv.union(a[:, 0], a[:, 1])
    g0, g1 = iv.gaps(us, ue)
    if g0.size == 0:
        return 0.0, 0.0
    total = float((g1 - g0).sum())
    nxt = np.clip(np.searchsorted(a[:, 0], g1 - 1e-6), 0, a.shape[0] - 1)
    host_bound = a[nxt, 2] > g0 + 1.0
    glen = g1 - g0
    if run.stalls:
        st = np.array(run.stalls)
        cover = iv.union(st[:, 0], st[:, 1])
        stalled = np.minimum(iv.overlap_with(g0, g1, cover), glen)
    else:
        stalled = np.zeros(glen.size)
    if run.sync_returns:
        sr = np.sort(np.array(run.sync_returns))
        k = np.searchsorted(sr, g0 - SYNC_TOL_US)
        k = np.clip(k, 0, sr.size - 1)
        after_sync = (sr[k] >= g0 - SYNC_TOL_US) & (sr[k] <= g1)
        stalled = np.where(after_sync, glen, stalled)
    launch = np.where(host_bound, glen - stalled, 0.0)
    return float(np.clip(launch, 0, None).sum()), total


def exposed_transfer_us(run: RankRun) -> float:
    """Collective transfer time (not the wait for late ranks) not overlapped by compute kernels."""
    if not run.transfers:
        return 0.0
    comp = [(s, e) for s, e, _, k in run.gpu if k != KIND_COMM]
    tr = np.array(run.transfers)
    t_u = iv.union(tr[:, 0], tr[:, 1])
    total = float((t_u[1] - t_u[0]).sum())
    if not comp:
        return total
    c = np.array(comp)
    c_u = iv.union(c[:, 0], c[:, 1])
    return total - iv.intersection_total(t_u, c_u)
