"""Load + featurise benchmark: Zoomer AR vs HTA on real traces, and vs raw msgspec on a ~1 GB trace.

    python benchmarks/bench_load.py                      # default run (~3-5 min on 2 cores)
    python benchmarks/bench_load.py --size-gb 2 --repeat 5 --repeat-large 2
    python benchmarks/bench_load.py --size-gb 0.02 --no-hta --repeat 1 --traces kineto/resnet50_num_workers_0

Part A (real traces): for each trace, in separate fresh subprocesses,
  zoomer  = `zoomer_ar.load.load_job(path)` + `zoomer_ar.features.extract(job)`
  hta     = `hta.trace_analysis.TraceAnalysis(trace_dir=...)` + `get_temporal_breakdown(visualize=False)`
            (HTA wants a folder: single files are symlinked into a temporary folder of their own)
Part B (large trace): `gen_trace.py` tiles a real trace to --size-gb GB of JSON, then
  zoomer  as above, on the uncompressed file
  msgspec = `msgspec.json.decode(Path(path).read_bytes())` (untyped, Python objects), once with
            the garbage collector as Python leaves it ("gc on") and once with gc disabled

Measured in each child: wall time of the work only (imports excluded and reported apart), the
process's peak RSS (VmHWM from /proc/self/status), the peak RSS of any process it forked
(getrusage(RUSAGE_CHILDREN).ru_maxrss: HTA parses in a multiprocessing pool), and the RSS after
imports. "peak" is the larger of the process's and its children's peaks (a lower bound of a
process tree's total, which favours HTA); "work mem" is peak minus the RSS after imports. Each
measurement is repeated --repeat times (fresh process each time) and the best time and the
lowest peak are kept. Ratios: HTA time / Zoomer time, Zoomer peak / HTA peak, Zoomer time /
msgspec time. Nothing is asserted; the script prints a table and, with --json, writes the figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED_TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
DEFAULT_TRACES = [
    "kineto/resnet50_num_workers_0",
    "hta/trace_diff/test",
    "hta/ns_resolution_trace",
    "hta/df_index_resolver",
    "param/dlrm_8ranks",
]
TARGET_HTA_SPEEDUP = 20.0
TARGET_HTA_MEMORY = 1 / 3
TARGET_MSGSPEC_RATIO = 1.5
TREE_SAMPLE_S = 0.002  # process-tree memory sampling interval


# ------------------------------------------------------------------------------------------------
# child side: one measurement per process
# ------------------------------------------------------------------------------------------------


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _cpu(resource) -> float:
    """CPU seconds of this process (all threads) and of its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _child(kind: str, path: str, out: str) -> None:
    import resource

    t0 = time.perf_counter()
    result: dict = {"kind": kind, "path": path}
    if kind == "zoomer":
        from zoomer_ar.features import extract
        from zoomer_ar.load import load_job

        import_s = time.perf_counter() - t0
        rss_base = _status_kb("VmRSS")
        c1 = _cpu(resource)
        t1 = time.perf_counter()
        job = load_job(path)
        t2 = time.perf_counter()
        features = extract(job)
        t3 = time.perf_counter()
        result.update(events=sum(len(r) for r in job.ranks), ranks=len(job.ranks), load_s=t2 - t1,
                      features_s=t3 - t2, gpu_busy_pct=features.vector.gpu_busy_pct)
    elif kind == "hta":
        import logging

        logging.disable(logging.WARNING)
        from hta.trace_analysis import TraceAnalysis

        import_s = time.perf_counter() - t0
        rss_base = _status_kb("VmRSS")
        c1 = _cpu(resource)
        t1 = time.perf_counter()
        analysis = TraceAnalysis(trace_dir=path)
        t2 = time.perf_counter()
        breakdown = analysis.get_temporal_breakdown(visualize=False)
        t3 = time.perf_counter()
        result.update(events=int(sum(len(df) for df in analysis.t.traces.values())), ranks=len(analysis.t.traces),
                      load_s=t2 - t1, features_s=t3 - t2, breakdown_rows=int(len(breakdown)))
    elif kind in ("msgspec", "msgspec-nogc"):
        import gc

        import msgspec

        import_s = time.perf_counter() - t0
        rss_base = _status_kb("VmRSS")
        if kind == "msgspec-nogc":
            gc.disable()
        c1 = _cpu(resource)
        t1 = time.perf_counter()
        doc = msgspec.json.decode(Path(path).read_bytes())
        t3 = time.perf_counter()
        result.update(events=len(doc["traceEvents"]) if isinstance(doc, dict) else len(doc), load_s=t3 - t1, features_s=0.0)
    else:
        raise SystemExit(f"unknown kind {kind}")
    cpu_s = _cpu(resource) - c1
    children_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result.update(
        import_s=import_s,
        work_s=t3 - t1,
        cpu_s=cpu_s,
        rss_base_mb=rss_base / 1024,
        peak_self_mb=_status_kb("VmHWM") / 1024,
        peak_children_mb=children_kb / 1024,
    )
    result["peak_mb"] = max(result["peak_self_mb"], result["peak_children_mb"])
    result["work_mem_mb"] = result["peak_mb"] - result["rss_base_mb"]
    Path(out).write_text(json.dumps(result))
    os._exit(0)  # skip tearing down millions of objects: not part of what is measured


# ------------------------------------------------------------------------------------------------
# parent side
# ------------------------------------------------------------------------------------------------


def measure(kind: str, path: Path, repeat: int, timeout: float) -> dict | None:
    """Best of `repeat` fresh processes: min time, min peak; None (with a reason) on failure."""
    runs = []
    for _ in range(repeat):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            out = tmp.name
        try:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(path), out],
                capture_output=True, text=True, timeout=timeout,
            )
            wall = time.perf_counter() - t0
            if proc.returncode != 0 or not Path(out).stat().st_size:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                return {"error": f"exit {proc.returncode}: {tail[0][:200]}"}
            r = json.loads(Path(out).read_text())
            r["process_s"] = wall
            runs.append(r)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        finally:
            Path(out).unlink(missing_ok=True)
    best = min(runs, key=lambda r: r["work_s"])
    best = dict(best)
    best["peak_mb"] = min(r["peak_mb"] for r in runs)
    best["work_mem_mb"] = min(r["work_mem_mb"] for r in runs)
    best["cpu_s"] = min(r["cpu_s"] for r in runs)
    best["runs_s"] = [round(r["work_s"], 4) for r in runs]
    return best


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
        except OSError:
            continue
    return out


def _tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += _children(p)
    return seen


def _pss_rss_kb(pid: int) -> tuple[int, int]:
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1])
    except OSError:
        pass
    return pss, rss


def measure_tree(kind: str, path: Path, timeout: float, every_s: float = TREE_SAMPLE_S) -> dict | None:
    """One more fresh process, watched from here: every `every_s` the PSS (proportional set size:
    a page shared by k processes counts 1/k in each) and RSS of the process and all its
    descendants are summed; the largest sums are kept. This is the memory the machine needs to
    run the tool: HTA parses rank folders in a multiprocessing pool whose workers are alive at
    the same time, which a single process's peak (VmHWM, ru_maxrss) does not add up. Sampling
    runs in this process, outside the measured one (whose time is taken from the other runs)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    try:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", kind, str(path), out],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak_pss = peak_rss = procs = samples = 0
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return {"error": f"timed out after {timeout:.0f} s"}
            pids = _tree(proc.pid)
            vals = [_pss_rss_kb(p) for p in pids]
            pss, rss = sum(v[0] for v in vals), sum(v[1] for v in vals)
            samples += 1
            if pss > peak_pss:
                peak_pss, procs = pss, len(pids)
            peak_rss = max(peak_rss, rss)
            time.sleep(every_s)
        if proc.returncode != 0:
            return {"error": f"exit {proc.returncode}"}
        if peak_pss <= 0:  # no sample landed, or /proc/<pid>/smaps_rollup is not readable here
            return {"error": f"no PSS sample in {samples} tries (/proc/<pid>/smaps_rollup unreadable?)"}
        return {"tree_pss_mb": peak_pss / 1024, "tree_rss_mb": peak_rss / 1024, "processes": procs, "samples": samples}
    finally:
        Path(out).unlink(missing_ok=True)


def _trace_input(rel: str, tmp: Path) -> tuple[Path, Path]:
    """(path for zoomer, folder for HTA)."""
    src = SHARED_TRACES / rel
    if src.is_dir():
        return src, src
    folder = tmp / rel.replace("/", "__")
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / src.name
    if not link.exists():
        link.symlink_to(src)
    return src, folder


def _size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def reader_info() -> str:
    """Which event reader and gzip library the loader uses in this installation (and environment)."""
    try:
        from zoomer_ar.load.fastcols import describe
    except ImportError:
        return "unknown (zoomer_ar not importable)"
    return describe()


def machine() -> dict:
    cpu = cpu_model()
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {}
    for mod in ("msgspec", "numpy", "pandas", "hta"):
        try:
            from importlib.metadata import version

            versions[mod] = version("traceinsight" if mod == "hta" else mod)
        except Exception:  # noqa: BLE001 - informational only
            versions[mod] = "absent"
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem_gb, 1), "python": platform.python_version(),
            "os": platform.platform(), "reader": reader_info(), **versions}


def part_a(traces: list[str], repeat: int, hta: bool, timeout: float, tree: bool = True) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="zoomer-bench-hta-") as tmpdir:
        for rel in traces:
            src = SHARED_TRACES / rel
            if not src.exists():
                print(f"  skip {rel}: not found under {SHARED_TRACES}", flush=True)
                continue
            zpath, hdir = _trace_input(rel, Path(tmpdir))
            z = measure("zoomer", zpath, repeat, timeout)
            h = measure("hta", hdir, repeat, timeout) if hta else None
            row = {"trace": rel, "mb": _size_mb(src), "zoomer": z, "hta": h}
            if tree and z and "error" not in z:
                row["zoomer_tree"] = measure_tree("zoomer", zpath, timeout)
            if tree and h and "error" not in h:
                row["hta_tree"] = measure_tree("hta", hdir, timeout)
            if z and "error" not in z and h and "error" not in h:
                row["speedup"] = h["work_s"] / z["work_s"]
                row["cpu_ratio"] = h["cpu_s"] / z["cpu_s"]
                row["mem_ratio"] = z["peak_mb"] / h["peak_mb"]
                row["work_mem_ratio"] = z["work_mem_mb"] / max(h["work_mem_mb"], 1e-9)
                zt, ht = row.get("zoomer_tree") or {}, row.get("hta_tree") or {}
                if "tree_pss_mb" in zt and "tree_pss_mb" in ht:
                    row["tree_mem_ratio"] = zt["tree_pss_mb"] / ht["tree_pss_mb"]
            rows.append(row)
            _print_a_row(row)
    return rows


def _print_a_header() -> None:
    print(f"  {'trace':<38} {'MB gz':>5} {'events':>7} | {'zoomer s':>8} {'cpu s':>6} {'peak MB':>7} {'tree MB':>7} | "
          f"{'HTA s':>6} {'cpu s':>6} {'peak MB':>7} {'tree MB':>7} {'np':>2} | {'time':>6} {'cpu':>6} {'mem':>5} "
          f"{'tree':>5}", flush=True)
    print("  (peak MB: the larger of the process's and any one child's peak RSS; tree MB: the peak of the summed PSS "
          f"of the process and all its children, sampled every {TREE_SAMPLE_S * 1000:.0f} ms in a separate run; np: "
          "processes alive at that peak; mem / tree: Zoomer's figure / HTA's)", flush=True)


def _print_a_row(row: dict) -> None:
    z, h = row["zoomer"] or {}, row["hta"] or {}
    name = row["trace"] if len(row["trace"]) <= 38 else "..." + row["trace"][-35:]
    if "error" in z:
        zs = f"{'error':>23}"
    else:
        zs = f"{z['work_s']:8.3f} {z['cpu_s']:6.3f} {z['peak_mb']:7.0f}"
    if not h:
        hs = f"{'-':>6} {'-':>6} {'-':>7}"
    elif "error" in h:
        hs = f"{'HTA failed':>21}"
    else:
        hs = f"{h['work_s']:6.2f} {h['cpu_s']:6.2f} {h['peak_mb']:7.0f}"
    zt, ht = row.get("zoomer_tree") or {}, row.get("hta_tree") or {}
    print(f"  {name:<38} {row['mb']:5.1f} {z.get('events', 0):7d} | {zs} {_fmt(zt.get('tree_pss_mb'), '7.0f')} | "
          f"{hs} {_fmt(ht.get('tree_pss_mb'), '7.0f')} {ht.get('processes', '-'):>2} | "
          f"{_fmt(row.get('speedup'), '5.1f')}x {_fmt(row.get('cpu_ratio'), '5.1f')}x {_fmt(row.get('mem_ratio'), '5.2f')} "
          f"{_fmt(row.get('tree_mem_ratio'), '5.2f')}",
          flush=True)
    for who, r in (("zoomer", z), ("HTA", h)):
        if r and "error" in r:
            print(f"    {who} could not load it: {r['error']}", flush=True)


def part_b(size_gb: float, repeat: int, timeout: float, out: Path | None, keep: bool) -> dict:
    sys.path.insert(0, str(HERE))
    import gen_trace

    synthetic = not (SHARED_TRACES / gen_trace.DEFAULT_SOURCE).is_file()
    path = out or gen_trace.default_out(size_gb, synthetic)
    t0 = time.perf_counter()
    meta = gen_trace.generate(path, size_gb, source=None if synthetic else SHARED_TRACES / gen_trace.DEFAULT_SOURCE,
                              synthetic=synthetic)
    gen_s = time.perf_counter() - t0
    # warm the page cache the same way for everyone
    with path.open("rb") as fh:
        while fh.read(64 << 20):
            pass
    res = {"file": str(path), "bytes": meta["bytes"], "events": meta["events"], "source": meta["source"],
           "generate_s": gen_s}
    for kind in ("zoomer", "msgspec", "msgspec-nogc"):
        res[kind] = measure(kind, path, repeat, timeout)
    z, m, mn = res["zoomer"], res["msgspec"], res["msgspec-nogc"]
    if all(r and "error" not in r for r in (z, m, mn)):
        res["ratio_vs_msgspec"] = z["work_s"] / m["work_s"]
        res["ratio_vs_msgspec_nogc"] = z["work_s"] / mn["work_s"]
        res["cpu_ratio_vs_msgspec"] = z["cpu_s"] / m["cpu_s"]
        res["cpu_ratio_vs_msgspec_nogc"] = z["cpu_s"] / mn["cpu_s"]
        res["mem_vs_msgspec"] = z["peak_mb"] / m["peak_mb"]
    if not keep and out is None:
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".meta").unlink(missing_ok=True)
    return res


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--traces", nargs="+", default=DEFAULT_TRACES, metavar="REL",
                    help="corpus traces (files or rank folders) relative to the shared trace folder")
    ap.add_argument("--size-gb", type=float, default=1.0, help="size of the generated trace for part B (0 skips it)")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per measurement; best kept (default 3)")
    ap.add_argument("--repeat-large", type=int, default=1, help="repeats for the large trace (default 1)")
    ap.add_argument("--no-hta", action="store_true", help="skip HTA (part A then times Zoomer AR alone)")
    ap.add_argument("--no-real", action="store_true", help="skip part A")
    ap.add_argument("--no-tree-mem", action="store_true",
                    help="skip the extra run per tool and trace that samples the process tree's memory")
    ap.add_argument("--large-out", type=Path, help="where to write the generated trace (default /tmp/zoomer-bench/)")
    ap.add_argument("--keep", action="store_true", help="keep the generated trace for the next run")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    ap.add_argument("--json", type=Path, help="also write all figures to this JSON file")
    args = ap.parse_args(argv)

    started = time.perf_counter()
    info = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python benchmarks/bench_load.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": machine()}
    mach = info["machine"]
    print(f"Zoomer AR load benchmark - {info['date']}")
    print(f"machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gb']} GB RAM; Python {mach['python']}, "
          f"msgspec {mach['msgspec']}, numpy {mach['numpy']}, pandas {mach['pandas']}, traceinsight (HTA) {mach['hta']}")
    print(f"reader: {mach['reader']}")
    print(f"command: {info['command']}")
    load1 = os.getloadavg()[0]
    print(f"load average at start: {load1:.2f} (other processes on the machine slow both tools alike; ratios are "
          "steadier than times)")
    info["loadavg_start"] = load1
    hta = not args.no_hta
    if hta:
        try:
            import hta as _hta  # noqa: F401
        except ImportError:
            print("HTA (traceinsight) not installed: part A times Zoomer AR alone")
            hta = False

    rows: list[dict] = []
    if not args.no_real:
        print(f"\nA. Real traces: load + featurise, best of {args.repeat} (time: work only, imports excluded)")
        _print_a_header()
        rows = part_a(args.traces, args.repeat, hta, args.timeout, tree=not args.no_tree_mem)
    large = None
    if args.size_gb > 0:
        print(f"\nB. Generated trace of {args.size_gb:g} GB: Zoomer AR load + featurise vs msgspec.json.decode "
              f"(untyped), best of {args.repeat_large}")
        large = part_b(args.size_gb, args.repeat_large, args.timeout, args.large_out, args.keep)
        print(f"  {large['file']}: {large['bytes'] / 1e9:.3f} GB, {large['events']:,} events "
              f"(tiled from {Path(large['source']).name}; generated in {large['generate_s']:.1f} s)")
        for kind, label in (("zoomer", "zoomer load+featurise"), ("msgspec", "msgspec decode (gc on)"),
                            ("msgspec-nogc", "msgspec decode (gc off)")):
            r = large[kind]
            if r and "error" not in r:
                extra = f"  (load {r['load_s']:.2f} s + features {r['features_s']:.2f} s)" if kind == "zoomer" else ""
                print(f"  {label:<26} {r['work_s']:8.2f} s  cpu {r['cpu_s']:7.2f} s  peak {r['peak_mb']:6.0f} MB{extra}")
            else:
                print(f"  {label:<26} failed: {(r or {}).get('error')}")

    print("\nSummary")
    with_hta = [r for r in rows if "speedup" in r]
    if with_hta:
        sp = [r["speedup"] for r in with_hta]
        cp = [r["cpu_ratio"] for r in with_hta]
        mem = [r["mem_ratio"] for r in with_hta]
        wm = [r["work_mem_ratio"] for r in with_hta]
        print(f"  vs HTA over {len(with_hta)} traces: time {_geomean(sp):.1f}x faster (geomean; min {min(sp):.1f}x), "
              f"CPU time {_geomean(cp):.1f}x less (geomean; min {min(cp):.1f}x), "
              f"peak memory {_geomean(mem):.2f} of HTA's (geomean; max {max(mem):.2f}); "
              f"memory above imports {_geomean(wm):.2f} of HTA's (max {max(wm):.2f})")
        tm = [r["tree_mem_ratio"] for r in with_hta if "tree_mem_ratio" in r]
        if tm:
            print(f"  process-tree memory (summed PSS, all processes of each tool): {_geomean(tm):.2f} of HTA's "
                  f"(geomean; max {max(tm):.2f})")
        hit_t, hit_m = min(sp) >= TARGET_HTA_SPEEDUP, max(mem) <= TARGET_HTA_MEMORY
        print(f"    target >= {TARGET_HTA_SPEEDUP:.0f}x faster on every trace: {'met' if hit_t else 'MISSED'}; "
              f"peak <= 1/3 of HTA's on every trace: {'met' if hit_m else 'MISSED'} (single-process peak)"
              + (f", {'met' if len(tm) == len(with_hta) and max(tm) <= TARGET_HTA_MEMORY else 'MISSED'} "
                 "(process-tree PSS)" if tm else ""))
        failed = [r["trace"] for r in rows if r["hta"] and "error" in r["hta"]]
        if failed:
            print(f"    HTA could not load: {', '.join(failed)} (skipped)")
    if large and "ratio_vs_msgspec" in large:
        hit = large["ratio_vs_msgspec"] <= TARGET_MSGSPEC_RATIO
        print(f"  vs raw msgspec on {large['bytes'] / 1e9:.2f} GB: {large['ratio_vs_msgspec']:.2f}x its time with gc on, "
              f"{large['ratio_vs_msgspec_nogc']:.2f}x with gc off (CPU time: {large['cpu_ratio_vs_msgspec']:.2f}x, "
              f"{large['cpu_ratio_vs_msgspec_nogc']:.2f}x); peak memory {large['mem_vs_msgspec']:.2f} of its peak")
        print(f"    target within {TARGET_MSGSPEC_RATIO}x of msgspec (gc on): {'met' if hit else 'MISSED'}; "
              f"(gc off): {'met' if large['ratio_vs_msgspec_nogc'] <= TARGET_MSGSPEC_RATIO else 'MISSED'}")
    total = time.perf_counter() - started
    info["loadavg_end"] = os.getloadavg()[0]
    print(f"  benchmark ran {total:.0f} s; load average at the end {info['loadavg_end']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({**info, "real": rows, "large": large, "seconds": total}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
