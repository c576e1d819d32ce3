"""Huge-trace benchmark: the streaming path on 2 GB and 5 GB traces, vs raw msgspec and HTA.

    python benchmarks/bench_huge.py                        # 2 GB and 5 GB (about 15 min on 2 cores)
    python benchmarks/bench_huge.py --sizes 0.2 --no-hta   # quick look
    python benchmarks/bench_huge.py --source path/to/trace.json.gz   # tile another trace

For each size, benchmarks/gen_trace.py tiles a real trace (default: the corpus's
hta/ns_resolution_trace, a GPU-dense DDP training trace) into an uncompressed JSON file of that
size under --dir (default /tmp/zoomer-huge), which is deleted afterwards (--keep keeps it). Then,
each in a fresh process:

  zoomer          `zoomer_ar.analyze.analyze_path(path, stream=True)`: the streaming load (chunked
                  scan, typed decoding of slices, compact columns), features, rules and model: the
                  whole `zoomer-ar analyze` minus writing reports
  msgspec-slices  the same chunked scan, each slice decoded with the typed msgspec schema and
                  dropped: the decoding floor of any streaming reader built on msgspec
  msgspec         `msgspec.json.decode(Path(path).read_bytes())` with the garbage collector off: the
                  whole document as Python objects (bench_load.py's reference), only where the
                  projected memory fits (see below)
  hta             `TraceAnalysis(trace_dir=...)` + `get_temporal_breakdown()`, only where it fits

Measured in each child: wall time of the work (imports excluded), CPU time (user + system, all
threads, plus the children HTA forks), peak RSS (VmHWM, and the largest child's for HTA).
"Per core" throughput is JSON bytes over CPU seconds (MB = 1e6 bytes), which is what one core
sustains whatever else runs on the machine; wall-clock throughput is printed too.

Whole-document tools need memory in proportion to the trace: msgspec and HTA are first run on a
calibration trace (--calibrate-gb, default 0.2 GB), their peak per byte is extrapolated, and they
are skipped at sizes whose projected peak exceeds --max-gb (default 20) or 80% of the memory
available now; the skip and the projection are printed. The targets checked at the end: peak RSS
under 1 GB and at least 100 MB/s per core for the streaming path, at every size.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from bench_load import _status_kb, cpu_model, reader_info  # noqa: E402  (the same /proc readers)

TARGET_RSS_MB = 1000.0  # "under 1 GB resident" (1 GB = 1000 MB here; 1 GiB would be 1024)
TARGET_MB_PER_CORE_S = 100.0


# ------------------------------------------------------------------------------------------------
# child: one measurement per process
# ------------------------------------------------------------------------------------------------


def _reset_peak() -> bool:
    """Reset this process's VmHWM (Linux: /proc/self/clear_refs); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _cpu(resource, children: bool = False) -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    t = ru.ru_utime + ru.ru_stime
    if children:
        rc = resource.getrusage(resource.RUSAGE_CHILDREN)
        t += rc.ru_utime + rc.ru_stime
    return t


def _features_sha(analysis) -> str:
    """A digest of an analysis' features (to compare two ways of reading the same job)."""
    import hashlib

    return hashlib.sha256(json.dumps(analysis.features, sort_keys=True, default=str).encode()).hexdigest()


def _child(kind: str, path: str, out: str) -> None:
    import gc
    import resource

    result: dict = {"kind": kind}
    t0 = time.perf_counter()
    if kind in ("zoomer", "zoomer-rows", "zoomer-windowed"):
        from zoomer_ar.analyze import analyze_job
        from zoomer_ar.stream import load_job_streaming

        rss0 = _status_kb("VmRSS")
        c1, t1 = _cpu(resource), time.perf_counter()
        # "zoomer": as analyze_path reads a streamed job (each rank's features computed where it was read);
        # "zoomer-rows": every rank's compact rows sent to this process and the features computed here
        job = load_job_streaming(path, summarise=kind != "zoomer-rows")
        t2 = time.perf_counter()
        load_peak_kb = _status_kb("VmHWM")
        split = _reset_peak()  # so that the features' own peak can be read too
        analysis = analyze_job(job)
        t3 = time.perf_counter()
        meta = job.ranks[0].metadata.get("streamed", {})
        result.update(load_peak_mb=load_peak_kb / 1024,
                      features_peak_mb=_status_kb("VmHWM") / 1024 if split else None)
        result.update(load_s=t2 - t1, features_s=t3 - t2, findings=[f.pattern for f in analysis.findings],
                      events=meta.get("events"), kept=meta.get("kept"), rows=len(job.ranks[0]),
                      passes=meta.get("passes"), pruned=meta.get("pruned", 0), ranks=len(job.ranks),
                      features_sha=_features_sha(analysis), windows=meta.get("windows"),
                      features={k: v for k, v in analysis.features.items() if k != "per_rank"})
    elif kind == "zoomer-memory":  # the in-memory path (bench_merged.py's reference)
        from zoomer_ar.analyze import analyze_path

        rss0 = _status_kb("VmRSS")
        c1, t1 = _cpu(resource), time.perf_counter()
        analysis = analyze_path(path, stream=False)
        t3 = time.perf_counter()
        result.update(findings=[f.pattern for f in analysis.findings], ranks=len(analysis.job.ranks),
                      features_sha=_features_sha(analysis))
    elif kind == "zoomer-steps":  # analyze --steps: a window of steps cut out (trace slice), then analysed
        import tempfile as tf

        from zoomer_ar.analyze import analyze_path
        from zoomer_ar.step_window import cut_steps

        lo, hi = (int(x) for x in os.environ["ZOOMER_BENCH_STEPS"].split(".."))
        rss0 = _status_kb("VmRSS")
        c1, t1 = _cpu(resource), time.perf_counter()
        with tf.TemporaryDirectory(prefix="zoomer-steps-") as tmp:
            cut, _, _, _ = cut_steps(Path(path), (lo, hi), Path(tmp))
            t2 = time.perf_counter()
            analysis = analyze_path(cut)
        t3 = time.perf_counter()
        result.update(cut_s=t2 - t1, features_s=t3 - t2, steps=f"{lo}..{hi}",
                      profiler_steps=analysis.features.get("profiler_steps"),
                      findings=[f.pattern for f in analysis.findings])
    elif kind == "msgspec-slices":
        from zoomer_ar.load.schema import EVENTS_DECODER
        from zoomer_ar.stream.scan import scan

        rss0 = _status_kb("VmRSS")
        n = [0]

        def consume(view) -> None:
            n[0] += len(EVENTS_DECODER.decode(view))

        gc.disable()
        c1, t1 = _cpu(resource), time.perf_counter()
        scan(Path(path), consume, hash=False)
        t3 = time.perf_counter()
        result.update(events=n[0])
    elif kind == "msgspec":
        import msgspec

        rss0 = _status_kb("VmRSS")
        gc.disable()
        c1, t1 = _cpu(resource), time.perf_counter()
        doc = msgspec.json.decode(Path(path).read_bytes())
        t3 = time.perf_counter()
        result.update(events=len(doc["traceEvents"]))
    elif kind == "hta":
        import logging

        logging.disable(logging.WARNING)
        import warnings

        warnings.simplefilter("ignore")
        from hta.trace_analysis import TraceAnalysis

        rss0 = _status_kb("VmRSS")
        c1, t1 = _cpu(resource, True), time.perf_counter()
        analysis = TraceAnalysis(trace_dir=path)
        analysis.get_temporal_breakdown(visualize=False)
        t3 = time.perf_counter()
        result.update(events=int(sum(len(df) for df in analysis.t.traces.values())))
    else:
        raise SystemExit(f"unknown kind {kind}")
    cpu = _cpu(resource, kind in ("hta", "zoomer", "zoomer-rows", "zoomer-windowed")) - c1  # with the processes they waited for (HTA's pool, a rank folder's workers)
    children_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result.update(import_s=t1 - t0, work_s=t3 - t1, cpu_s=cpu, rss_base_mb=rss0 / 1024,
                  peak_self_mb=_status_kb("VmHWM") / 1024, peak_children_mb=children_kb / 1024)
    result["peak_mb"] = max(result["peak_self_mb"], result["peak_children_mb"], result.get("load_peak_mb") or 0)
    Path(out).write_text(json.dumps(result))
    os._exit(0)  # not part of what is measured: tearing down millions of objects


# ------------------------------------------------------------------------------------------------
# parent
# ------------------------------------------------------------------------------------------------


def measure(kind: str, path: Path, timeout: float, tree: bool = False) -> dict:
    """One child measurement. With `tree`, the child's process tree (it and the worker processes it
    starts) is sampled from here every 5 ms: the largest sum of their PSS (a page shared by k processes
    counts 1/k in each) and of their RSS, and the largest number of processes alive at once."""
    from bench_load import _pss_rss_kb, _tree

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    with tempfile.TemporaryFile() as err:
        try:
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", kind, str(path), out],
                                    stdout=err, stderr=err)
            peak_pss = peak_rss = procs = 0
            deadline = t0 + timeout
            while proc.poll() is None:
                if time.perf_counter() > deadline:
                    proc.kill()
                    proc.wait()
                    return {"error": f"timed out after {timeout:.0f} s"}
                if tree:
                    pids = _tree(proc.pid)
                    vals = [_pss_rss_kb(q) for q in pids]
                    peak_pss = max(peak_pss, sum(v[0] for v in vals))
                    peak_rss = max(peak_rss, sum(v[1] for v in vals))
                    procs = max(procs, len(pids))
                time.sleep(0.005 if tree else 0.02)
            wall = time.perf_counter() - t0
            if proc.returncode != 0 or not Path(out).stat().st_size:
                err.seek(0)
                tail = err.read().decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
                return {"error": f"exit {proc.returncode}: {tail[0][:200]}"}
            r = json.loads(Path(out).read_text())
            r["process_s"] = wall
            if tree:
                r.update(tree_pss_mb=peak_pss / 1024, tree_rss_mb=peak_rss / 1024, tree_processes=procs)
            return r
        finally:
            Path(out).unlink(missing_ok=True)


def mem_available_mb() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def machine() -> dict:
    cpu = cpu_model()
    versions = {}
    from importlib.metadata import PackageNotFoundError, version

    for mod in ("msgspec", "numpy", "traceinsight"):
        try:
            versions[mod] = version(mod)
        except PackageNotFoundError:
            versions[mod] = "absent"
    return {"cpu": cpu, "cores": os.cpu_count(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(), **versions}


def _row(label: str, r: dict | None, nbytes: int) -> str:
    if r is None:
        return f"  {label:<15} skipped"
    if "error" in r:
        return f"  {label:<15} failed: {r['error']}"
    mb = nbytes / 1e6
    per_core = mb / r["cpu_s"] if r["cpu_s"] > 0 else float("nan")
    wall = mb / r["work_s"] if r["work_s"] > 0 else float("nan")
    extra = ""
    if r["kind"] == "zoomer":
        peaks = (f"; peak RSS load {r['load_peak_mb']:.0f} MB, features {r['features_peak_mb']:.0f} MB"
                 if r.get("features_peak_mb") is not None else "")
        extra = (f"  [load {r['load_s']:.1f} s + features/findings {r['features_s']:.1f} s; {r['rows']:,} rows kept "
                 f"of {r['events']:,} events, {r['passes']} pass(es){peaks}]")
    if r["kind"] == "zoomer-steps":
        extra = (f"  [steps {r['steps']} ({r['profiler_steps']} analysed): cut {r['cut_s']:.1f} s + analysis "
                 f"{r['features_s']:.1f} s]")
    return (f"  {label:<15} {r['work_s']:8.1f} s  cpu {r['cpu_s']:8.1f} s  {per_core:6.0f} MB/s per core  "
            f"{wall:6.0f} MB/s wall  peak RSS {r['peak_mb']:7.0f} MB{extra}")


def _middle_steps(path: Path, k: int) -> str | None:
    """`N..M`: k profiler steps in the middle of the trace (a survey pass, not timed)."""
    from zoomer_ar.surgery.cut import survey

    steps = sorted(survey(path).steps)
    if not steps:
        return None
    mid = steps[len(steps) // 2 - min(k, len(steps)) // 2:][:k]
    return f"{mid[0]}..{mid[-1]}"


def warm_page_cache(path: Path) -> None:
    """Read a trace file (or a folder's .json files) once, so that every tool measured after finds it
    in the page cache alike."""
    for p in [path] if path.is_file() else sorted(path.glob("*.json")):
        with p.open("rb") as fh:
            while fh.read(64 << 20):
                pass


def finish(root: Path, keep: bool, ok: bool) -> int:
    """The end of a generated-trace benchmark: the load average, the generated traces removed unless
    kept, the exit status (1 when the ways measured disagreed)."""
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


def run_timed(main) -> None:
    t0 = time.perf_counter()
    rc = main()
    print(f"benchmark ran {time.perf_counter() - t0:.0f} s")
    raise SystemExit(rc)


def _gen(path: Path, size_gb: float, source: Path | None, synthetic: bool) -> dict:
    import gen_trace

    if source is None and not synthetic:
        source = gen_trace.SHARED_TRACES / gen_trace.DEFAULT_SOURCE
        if not source.is_file():
            synthetic = True
    return gen_trace.generate(path, size_gb, source=source, synthetic=synthetic, quiet=True)


def _hta_dir(path: Path, root: Path) -> Path:
    d = root / f"hta-{path.stem}"
    d.mkdir(parents=True, exist_ok=True)
    link = d / path.name
    if not link.exists():
        link.symlink_to(path)
    return d


def _max_rel_diff(a: dict, b: dict) -> float:
    """The largest relative difference between two analyses' feature values (1.0 for a value that is not a
    number and differs)."""
    worst = 0.0
    for k, x in a.items():
        y = b.get(k)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-12))
        elif x != y:
            worst = 1.0
    return worst


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--sizes", default="2,5", help="trace sizes in GB (1e9 bytes of JSON), comma separated")
    ap.add_argument("--source", type=Path, help="trace to tile (default: gen_trace.py's default source)")
    ap.add_argument("--synthetic", action="store_true", help="gen_trace.py --synthetic instead of tiling")
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("ZOOMER_HUGE_DIR", "/tmp/zoomer-huge")))
    ap.add_argument("--keep", action="store_true", help="keep the generated traces")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--no-msgspec", action="store_true", help="skip the whole-document msgspec decode")
    ap.add_argument("--calibrate-gb", type=float, default=0.2, help="trace size for the memory projections")
    ap.add_argument("--max-gb", type=float, default=20.0, help="skip whole-document tools projected above this")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    ap.add_argument("--hta-timeout", type=float, default=1200,
                    help="seconds for HTA at the benchmark sizes (its add_iteration is O(events x steps))")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    ap.add_argument("--window-gb", type=float, default=1.0,
                    help="also analyse each trace in windows (ZOOMER_WINDOW_BYTES = this many GB: windows of about "
                         "half of it) and compare with the one-pass figures (0: not)")
    ap.add_argument("--window-steps", type=int, default=5,
                    help="also time `analyze --steps` on this many steps mid-trace (0: not)")
    args = ap.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    hta = not args.no_hta
    if hta:
        try:
            import hta as _hta  # noqa: F401
        except ImportError:
            print("HTA (traceinsight) not installed: skipped")
            hta = False
    args.dir.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(args.dir).free / 1e9
    need_gb = max(sizes) + args.calibrate_gb + 0.5
    if free_gb < need_gb:
        print(f"{args.dir}: {free_gb:.1f} GB free, {need_gb:.1f} GB needed")
        return 2
    info = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python benchmarks/bench_huge.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": machine(), "loadavg_start": os.getloadavg()[0], "sizes": {}}
    m = info["machine"]
    print(f"Zoomer AR huge-trace benchmark - {info['date']}")
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB RAM; Python {m['python']}, msgspec "
          f"{m['msgspec']}, numpy {m['numpy']}, traceinsight (HTA) {m['traceinsight']}")
    print(f"reader: {reader_info()}")
    print(f"command: {info['command']}")
    print(f"load average at start: {info['loadavg_start']:.2f} on {m['cores']} cores (CPU-time figures are per core "
          "and hold under load better than wall-clock ones)")

    # calibration: peak RSS per JSON byte of the whole-document tools
    per_byte: dict[str, float] = {}
    whole = ([] if args.no_msgspec else ["msgspec"]) + (["hta"] if hta else [])
    if whole and args.calibrate_gb > 0:
        cal = args.dir / f"calibrate_{args.calibrate_gb:g}gb.json"
        meta = _gen(cal, args.calibrate_gb, args.source, args.synthetic)
        print(f"\ncalibration trace {cal.name}: {meta['bytes'] / 1e9:.2f} GB")
        for kind in whole:
            target = _hta_dir(cal, args.dir) if kind == "hta" else cal
            r = measure(kind, target, args.timeout)
            if "error" in r:
                print(f"  {kind}: failed on the calibration trace: {r['error']}")
                continue
            per_byte[kind] = (r["peak_mb"] - r["rss_base_mb"]) / meta["bytes"]
            print(f"  {kind:<8} peak {r['peak_mb']:6.0f} MB -> {per_byte[kind] * 1e6:.1f} MB of memory per MB of JSON"
                  f"  ({r['work_s']:.1f} s, {meta['bytes'] / 1e6 / r['work_s']:.1f} MB/s)")
        if not args.keep:
            cal.unlink(missing_ok=True)
            cal.with_name(cal.name + ".meta").unlink(missing_ok=True)
            shutil.rmtree(args.dir / f"hta-{cal.stem}", ignore_errors=True)

    verdicts = []
    for size in sizes:
        path = args.dir / f"huge_{size:g}gb.json"
        t0 = time.perf_counter()
        meta = _gen(path, size, args.source, args.synthetic)
        nbytes = meta["bytes"]
        print(f"\n{path.name}: {nbytes / 1e9:.2f} GB, {meta['events']:,} events, tiled from "
              f"{Path(meta['source']).name} (generated in {time.perf_counter() - t0:.0f} s)")
        warm_page_cache(path)  # the same way for everyone
        res: dict = {"bytes": nbytes, "events": meta["events"], "source": meta["source"]}
        for kind in ("zoomer", "msgspec-slices"):
            res[kind] = measure(kind, path, args.timeout)
            print(_row(kind, res[kind], nbytes), flush=True)
        if args.window_gb > 0:
            os.environ["ZOOMER_WINDOW_BYTES"] = str(int(args.window_gb * 1e9))
            try:
                res["zoomer-windowed"] = r = measure("zoomer-windowed", path, args.timeout)
            finally:
                os.environ.pop("ZOOMER_WINDOW_BYTES", None)
            print(_row(f"zoomer {r.get('windows') or 1} windows", r, nbytes), flush=True)
            if "error" not in r and "error" not in res["zoomer"]:
                diff = _max_rel_diff(res["zoomer"]["features"], r["features"])
                print(f"  windows against one pass: features equal to {diff:.1e} (largest relative difference), "
                      f"findings {'the same' if r['findings'] == res['zoomer']['findings'] else 'DIFFER'}")
        if args.window_steps > 0:
            window = _middle_steps(path, args.window_steps)
            if window is not None:
                os.environ["ZOOMER_BENCH_STEPS"] = window
                res["zoomer-steps"] = measure("zoomer-steps", path, args.timeout)
                print(_row("zoomer --steps", res["zoomer-steps"], nbytes), flush=True)
        for kind in whole:
            projected_mb = per_byte.get(kind, float("nan")) * nbytes
            limit_mb = min(args.max_gb * 1000, 0.8 * mem_available_mb())
            if not projected_mb <= limit_mb:
                res[kind] = {"skipped": f"projected peak {projected_mb / 1000:.1f} GB > {limit_mb / 1000:.1f} GB"}
                print(f"  {kind:<15} skipped: projected peak {projected_mb / 1000:.1f} GB, above "
                      f"{limit_mb / 1000:.1f} GB (--max-gb {args.max_gb:g}, or 80% of the memory available now)")
                continue
            target = _hta_dir(path, args.dir) if kind == "hta" else path
            res[kind] = measure(kind, target, args.hta_timeout if kind == "hta" else args.timeout)
            print(_row(kind, res[kind], nbytes), flush=True)
        z = res["zoomer"]
        if "error" not in z:
            per_core = nbytes / 1e6 / z["cpu_s"]
            ok_mem, ok_cpu = z["peak_mb"] < TARGET_RSS_MB, per_core >= TARGET_MB_PER_CORE_S
            verdicts.append((size, z["peak_mb"], per_core, ok_mem, ok_cpu))
            dec = res["msgspec-slices"]
            if "error" not in dec:
                print(f"  streaming analysis / typed decode alone: {z['cpu_s'] / dec['cpu_s']:.2f}x the CPU time")
        info["sizes"][f"{size:g}"] = res
        if not args.keep:
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".meta").unlink(missing_ok=True)
            shutil.rmtree(args.dir / f"hta-{path.stem}", ignore_errors=True)

    print("\nTargets (streaming path): peak RSS < 1 GB, >= 100 MB/s per core")
    for size, peak, per_core, ok_mem, ok_cpu in verdicts:
        print(f"  {size:g} GB: peak RSS {peak:.0f} MB {'PASS' if ok_mem else 'FAIL'}; "
              f"{per_core:.0f} MB/s per core {'PASS' if ok_cpu else 'FAIL'}")
    wins = {k: v["zoomer-windowed"] for k, v in info["sizes"].items() if "peak_mb" in v.get("zoomer-windowed", {})}
    if wins:
        print(f"in windows (ZOOMER_WINDOW_BYTES {args.window_gb:g} GB): " + ", ".join(
            f"{k} GB: peak RSS {v['peak_mb']:.0f} MB, {float(k) * 1e3 / v['cpu_s']:.0f} MB/s per core"
            for k, v in wins.items()))
    windows = {k: v["zoomer-steps"] for k, v in info["sizes"].items() if "peak_mb" in v.get("zoomer-steps", {})}
    if windows:
        print("analyze --steps (a window of steps, any size): peak RSS " +
              ", ".join(f"{v['peak_mb']:.0f} MB at {k} GB" for k, v in windows.items()))
    info["loadavg_end"] = os.getloadavg()[0]
    print(f"load average at end: {info['loadavg_end']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(info, indent=1) + "\n")
    return 0 if all(v[3] and v[4] for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
