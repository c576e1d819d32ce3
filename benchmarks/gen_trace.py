"""Generate a large Kineto trace for load benchmarks, by tiling a real trace in time.

    python benchmarks/gen_trace.py --size-gb 1.0                       # /tmp/zoomer-bench/tiled_1gb.json
    python benchmarks/gen_trace.py --size-gb 0.05 --out /tmp/small.json
    python benchmarks/gen_trace.py --size-gb 0.2 --source path/to/trace.json.gz
    python benchmarks/gen_trace.py --size-gb 0.2 --synthetic           # no source trace needed

How a tiled trace is built (default): the source trace's events are repeated back to back until
the output reaches the requested size (uncompressed JSON bytes). Copy k of the events is shifted
in time by k x (the source's span + 1 ms), so the result reads as one long profiling session on
the same threads and streams:

- `ts` is shifted; `dur` and everything else is kept, so per-step statistics stay realistic;
- identifiers that link events are offset per copy so links stay unique and consistent:
  flow `id` (ac2g / fwdbwd), `args.correlation`, `args.External id`, `args.external id`,
  `args.Python id`, `args.Python parent id`, `args.Ev Idx`;
- `ProfilerStep#N` is renumbered to continue the step count (CPU and GPU-side annotations);
- metadata events (`"ph": "M"`: process/thread names) and the top-level keys
  (`deviceProperties`, `distributedInfo`, `schemaVersion`, ...) are written once.

The default source is the corpus trace hta/ns_resolution_trace (PyTorch 2.x, H100-era Kineto:
cpu_op, cuda_runtime, kernel, gpu_memcpy/memset, ac2g and fwdbwd flows, ProfilerStep and
gpu_user_annotation), found in ../shared/traces or $ZOOMER_SHARED_TRACES.

`--synthetic` builds the events from scratch instead (one training-like step repeated: a
ProfilerStep annotation, DataLoader __next__, nested cpu_ops, cudaLaunchKernel /
cudaMemcpyAsync calls with ac2g flows to kernels and memcpys on two streams, an optimizer step
and a sync), for machines without the corpus.

The output goes to /tmp by default and must never be committed. A sidecar `<out>.meta`
records how the file was made; a later run with the same parameters reuses the file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
DEFAULT_SOURCE = "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
DEFAULT_DIR = Path(os.environ.get("ZOOMER_BENCH_DIR", "/tmp/zoomer-bench"))
ID_ARGS = ("correlation", "External id", "external id", "Python id", "Python parent id", "Ev Idx")
GAP_US = 1000.0  # between copies
GENERATOR_VERSION = 1


def _read_json(path: Path) -> dict:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = msgspec.json.decode(data)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    return doc


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Tiler:
    """Yields copies of a source trace's events, each shifted in time with fresh identifiers."""

    def __init__(self, doc: dict) -> None:
        events = doc["traceEvents"]
        self.header = {k: v for k, v in doc.items() if k != "traceEvents"}
        self.meta = [e for e in events if e.get("ph") == "M"]
        self.events = [e for e in events if e.get("ph") != "M"]
        if not self.events:
            raise SystemExit("source trace has no events to tile")
        starts = [t for e in self.events if (t := _num(e.get("ts"))) is not None]
        ends = [t + (_num(e.get("dur")) or 0.0) for e in self.events if (t := _num(e.get("ts"))) is not None]
        self.shift = (max(ends) - min(starts)) + GAP_US
        # identifier ranges: copy k adds k * span to every id so copies never collide
        max_id = 0
        for e in self.events:
            if isinstance(e.get("id"), int):
                max_id = max(max_id, abs(e["id"]))
            args = e.get("args")
            if isinstance(args, dict):
                for k in ID_ARGS:
                    if isinstance(args.get(k), int):
                        max_id = max(max_id, abs(args[k]))
        self.id_span = max_id + 1
        self.step_numbers = sorted(
            {int(n.split("#", 1)[1]) for e in self.events if (n := str(e.get("name", ""))).startswith("ProfilerStep#")
             and n.split("#", 1)[1].isdigit()}
        )
        self.step_span = (self.step_numbers[-1] - self.step_numbers[0] + 1) if self.step_numbers else 0

    def copy(self, k: int) -> list[dict]:
        if k == 0:
            return self.events
        dt, did, dstep = k * self.shift, k * self.id_span, k * self.step_span
        out = []
        append = out.append
        for e in self.events:
            c = dict(e)
            ts = c.get("ts")
            if isinstance(ts, (int, float)):
                c["ts"] = ts + dt
            if isinstance(c.get("id"), int):
                c["id"] += did
            args = c.get("args")
            if args:
                new = None
                for key in ID_ARGS:
                    v = args.get(key)
                    if isinstance(v, int) and v >= 0:
                        if new is None:
                            new = dict(args)
                        new[key] = v + did
                if new is not None:
                    c["args"] = new
            if dstep:
                name = c.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    num = name[13:]
                    if num.isdigit():
                        c["name"] = f"ProfilerStep#{int(num) + dstep}"
            append(c)
        return out


def synthetic_doc(steps: int = 50) -> dict:
    """A small, realistic-looking single-rank training trace built from scratch."""
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    t, gpu_t, corr, ext, flow = 1_700_000_000_000_000.0, 0.0, 1, 1, 1
    gpu_t = t

    def op(name, ts, dur, cat="cpu_op", **args):
        nonlocal ext
        ext += 1
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": round(ts, 3),
                       "dur": round(dur, 3), "args": {"External id": ext, **args}})

    def launch(ts, kernel, kdur, api="cudaLaunchKernel", cat="kernel", stream=7, extra=None):
        nonlocal corr, flow, gpu_t
        corr += 1
        flow += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": 1, "ts": round(ts, 3),
                       "dur": 4.2, "args": {"correlation": corr, "External id": ext, "cbid": 211}})
        events.append({"ph": "s", "id": flow, "pid": 1, "tid": 1, "ts": round(ts, 3), "cat": "ac2g", "name": "ac2g"})
        start = max(gpu_t, ts + 6.0)
        gpu_t = start + kdur
        args = {"queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": corr,
                "registers per thread": 64, "shared memory": 0, "grid": [256, 1, 1], "block": [128, 1, 1],
                "est. achieved occupancy %": 50, **(extra or {})}
        events.append({"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": stream, "ts": round(start, 3),
                       "dur": round(kdur, 3), "args": args})
        events.append({"ph": "f", "id": flow, "pid": 0, "tid": stream, "ts": round(start, 3), "cat": "ac2g",
                       "name": "ac2g", "bp": "e"})

    for s in range(steps):
        step_start = t
        t += 5.0
        op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 900.0, cat="user_annotation")
        t += 905.0
        op("aten::to", t, 40.0, **{"Input Dims": [[64, 3, 224, 224], [], [], [], []], "Input type": ["float", "", "", "", ""]})
        launch(t + 5, "Memcpy HtoD (Pageable -> Device)", 180.0, api="cudaMemcpyAsync", cat="gpu_memcpy",
               extra={"bytes": 38535168, "memory bandwidth (GB/s)": 11.2})
        t += 45.0
        for layer in range(40):
            op("aten::linear", t, 30.0, **{"Input Dims": [[64, 1024], [1024, 1024], [1024]], "Input type": ["float", "float", "float"]})
            op("aten::addmm", t + 2, 25.0)
            launch(t + 8, "ampere_sgemm_128x64_tn", 55.0)
            t += 32.0
            op("aten::relu", t, 12.0)
            launch(t + 3, "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar>", 6.0)
            t += 14.0
        op("Optimizer.step#Adam.step", t, 600.0, cat="user_annotation")
        for p in range(20):
            op("aten::_foreach_add_", t + 5 + p * 28, 25.0)
            launch(t + 10 + p * 28, "void at::native::(anonymous namespace)::multi_tensor_apply_kernel", 9.0)
        t += 605.0
        op("aten::item", t, 30.0)
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1,
                       "ts": round(t + 2, 3), "dur": round(max(gpu_t - t, 5.0), 3), "args": {"correlation": corr + 1}})
        corr += 1
        t = max(t, gpu_t) + 20.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                       "ts": round(step_start, 3), "dur": round(t - step_start, 3), "args": {"External id": 0}})
        t += 10.0
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045870592,
                              "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "traceEvents": events,
        "traceName": "synthetic",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1700000000000000000,
    }


def generate(out: Path, size_gb: float, *, source: Path | None = None, synthetic: bool = False,
             quiet: bool = False) -> dict:
    """Write a tiled trace of about `size_gb` GB (1e9 bytes) to `out`; returns its description."""
    target = int(size_gb * 1e9)
    meta_path = out.with_name(out.name + ".meta")  # not *.json: a folder of traces must not pick it up
    want = {"generator": GENERATOR_VERSION, "size_gb": size_gb,
            "source": "synthetic" if synthetic else str(source)}
    if out.is_file() and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError:
            meta = {}
        if {k: meta.get(k) for k in want} == want and meta.get("bytes") == out.stat().st_size:
            if not quiet:
                print(f"reusing {out} ({meta['bytes'] / 1e9:.2f} GB, {meta['events']:,} events)", file=sys.stderr)
            return meta
    t0 = time.perf_counter()
    doc = synthetic_doc() if synthetic else _read_json(source)
    tiler = Tiler(doc)
    enc = msgspec.json.Encoder()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    written, n_events, copies = 0, 0, 0
    with tmp.open("wb") as fh:
        head = enc.encode(tiler.header)
        # {"schemaVersion":..., ..., "traceEvents":[ ... ]}
        prefix = head[:-1] + (b',' if len(tiler.header) else b'') + b'"traceEvents":['
        fh.write(prefix)
        written += len(prefix)
        first = True
        if tiler.meta:
            body = enc.encode(tiler.meta)[1:-1]
            fh.write(body)
            written += len(body)
            n_events += len(tiler.meta)
            first = False
        while written < target - 2:
            events = tiler.copy(copies)
            body = enc.encode(events)[1:-1]
            last = written + len(body) + 3 > target
            if last:
                # the last copy only in part, cut at an event boundary
                keep = max(1, int(len(events) * (target - written) / max(len(body), 1)))
                events = events[:keep]
                body = enc.encode(events)[1:-1]
            if not first:
                fh.write(b",")
                written += 1
            fh.write(body)
            written += len(body)
            n_events += len(events)
            copies += 1
            first = False
            if last:
                break
        fh.write(b"]}")
        written += 2
    os.replace(tmp, out)
    meta = {**want, "bytes": out.stat().st_size, "events": n_events, "copies": copies,
            "source_events": len(tiler.events), "seconds": round(time.perf_counter() - t0, 2)}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    if not quiet:
        print(f"wrote {out}: {meta['bytes'] / 1e9:.3f} GB, {n_events:,} events, {copies} copies of "
              f"{meta['source']} in {meta['seconds']:.1f} s", file=sys.stderr)
    return meta


def default_out(size_gb: float, synthetic: bool) -> Path:
    size = f"{size_gb:g}".replace(".", "p")
    return DEFAULT_DIR / f"{'synthetic' if synthetic else 'tiled'}_{size}gb.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0, help="target size of the JSON in GB (1e9 bytes); default 1.0")
    ap.add_argument("--out", type=Path, help=f"output file (default {DEFAULT_DIR}/tiled_<size>gb.json, e.g. tiled_0p05gb.json)")
    ap.add_argument("--source", type=Path, help=f"trace to tile (default: the corpus's {DEFAULT_SOURCE})")
    ap.add_argument("--synthetic", action="store_true", help="synthesise events instead of tiling a real trace")
    args = ap.parse_args(argv)
    synthetic = args.synthetic
    source = args.source
    if not synthetic and source is None:
        source = SHARED_TRACES / DEFAULT_SOURCE
        if not source.is_file():
            print(f"{source} not found: using --synthetic", file=sys.stderr)
            synthetic = True
    out = args.out or default_out(args.size_gb, synthetic)
    if REPO in out.resolve().parents:
        print(f"refusing to write inside the repository ({out}); use /tmp", file=sys.stderr)
        return 2
    generate(out, args.size_gb, source=source, synthetic=synthetic)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
