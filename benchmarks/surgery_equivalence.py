"""Compare `zoomer-ar trace ...` of this checkout with a reference checkout, output for output.

    git worktree add /tmp/surgery-ref HEAD            # before changing the surgery code
    cp zoomer_ar/load/_fastjson*.so /tmp/surgery-ref/zoomer_ar/load/
    python benchmarks/surgery_equivalence.py --ref /tmp/surgery-ref [--big /tmp/t100.json ...] [--quick]

Every case (a command line) runs once with each implementation, in the same scratch folder (so
that paths in messages are the same), and compares: the exit code, stdout, stderr, and every file
left in the scratch folder (names, and bytes: a gzip file by its decompressed bytes and the name
in its header, a zstd file by its decompressed bytes). The commands run in one long-lived worker
process per implementation (`zoomer_ar.cli.main(argv)`, stdout and stderr captured), which makes
hundreds of cases cheap; `--subprocess` runs each case as its own `python -m zoomer_ar.cli`
process instead (slower; for the big traces).

Cases: every command (check, compress, filter, slice, split, sample, merge) with several option
sets on every file of the shared corpus (../shared/traces, read-only), on the traces given with
--big, on job folders of the corpus, and on a few hundred damaged traces built from a small
generated one (fields of wrong types, explicit nulls, missing fields, huge numbers, NaN, cut-off
arrays, deep nesting, invalid UTF-8, ...), spread over several slices. Exit code 0 when every
case matches; the differences are printed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
sys.path.insert(0, str(REPO / "benchmarks"))

_WORKER = r"""
import contextlib, io, json, os, sys
from zoomer_ar.cli import main
out = sys.stdout
for line in sys.stdin:
    argv = json.loads(line)
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
        except BaseException as exc:
            rc = "raised " + type(exc).__name__ + ": " + str(exc)
    out.write(json.dumps({"rc": rc, "out": o.getvalue(), "err": e.getvalue()}) + "\n")
    out.flush()
"""


class Impl:
    """One implementation: a checkout whose `zoomer_ar` runs the commands."""

    def __init__(self, root: Path, subprocess_mode: bool) -> None:
        self.root = root
        self.sub = subprocess_mode
        self.env = dict(os.environ, PYTHONPATH=str(root), ZOOMER_DEBUG="")
        self.env.pop("ZOOMER_DEBUG")
        self.proc = None
        if not subprocess_mode:
            self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], cwd=root, env=self.env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, argv: list[str]) -> dict:
        if self.sub:
            p = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", *argv], cwd=self.root, env=self.env,
                               capture_output=True, text=True)
            return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()


def _content(path: Path) -> tuple:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        flags = data[3]
        name = b""
        if flags & 0x08:  # FNAME after the 10-byte header (and FEXTRA)
            pos = 10
            if flags & 0x04:
                pos += 2 + int.from_bytes(data[10:12], "little")
            name = data[pos : data.index(b"\0", pos)]
        try:
            return ("gzip", name, gzip.decompress(data))
        except Exception as exc:  # noqa: BLE001 - a broken gzip file is compared by its bytes
            return ("gzip-broken", repr(exc), data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        return ("zstd", zstandard.ZstdDecompressor().stream_reader(data).read())
    return ("raw", data)


def snapshot(folder: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = ("dir",) if p.is_dir() else _content(p)
    return out


def _clear(folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


# ---- the cases ----------------------------------------------------------------------------------


def _json_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


_STEP = re.compile(rb'"ProfilerStep#(\d+)"')
_TS = re.compile(rb'"ts"\s*:\s*(-?\d+(?:\.\d+)?)')


def _facts(path: Path) -> tuple[list[int], float | None, float | None]:
    """Steps named in the file, and the range of its `ts` values (by pattern: files may be bad)."""
    try:
        data = _json_bytes(path)
    except Exception:  # noqa: BLE001
        return [], None, None
    steps = sorted({int(m) for m in _STEP.findall(data)})
    ts = [float(m) for m in _TS.findall(data[: 50 << 20])]
    return steps, (min(ts) if ts else None), (max(ts) if ts else None)


def file_cases(path: Path, *, heavy: bool = True) -> list[list[str]]:
    """Command lines for one trace file; OUT stands for the scratch folder."""
    steps, lo, hi = _facts(path)
    p = str(path)
    cases = [
        ["check", p],
        ["compress", p, "OUT/c.json.gz"],
        ["compress", p, "OUT/c.json", "--none"],
        ["filter", p, "OUT/f.json", "--exclude-cat", "python_function"],
        ["filter", p, "OUT/f.json.gz", "--cat", "kernel", "--cat", "cuda_runtime", "--name", "gemm|nccl|Memcpy|sgemm"],
        ["filter", p, "OUT/f.json", "--ph", "X", "--exclude-name", "aten::", "--pid", "0", "--pid", "1"],
        ["filter", p, "OUT/f.json", "--cat", "Kernel", "--tid", "7", "--tid", "stream 7"],
        ["slice", p, "OUT/s.json", "--window", "0..5"],
        ["slice", p, "OUT/s.json.gz", "--window", "2..40"],
        ["split", p, "OUT/split"],
    ]
    if heavy:
        cases += [
            ["compress", p, "OUT/c.gz", "--level", "1"],
            ["filter", p, "OUT/f.json", "--cat", "nothing_has_this"],
            ["slice", p, "OUT/s.json", "--window", "0..100000"],
            ["split", p, "OUT/split", "--steps-per-file", "2", "--compression", "none"],
            ["split", p, "OUT/split", "--max-files", "1"],
        ]
    if steps:
        a, b = steps[0], steps[-1]
        mid = steps[len(steps) // 2]
        cases += [["slice", p, "OUT/s.json", "--steps", f"{mid}..{mid + 1}"],
                  ["slice", p, "OUT/s.json.gz", "--steps", f"{a}..{a}"]]
        if heavy:
            cases += [["slice", p, "OUT/s.json", "--steps", f"{b}..{b + 50}"],
                      ["slice", p, "OUT/s.json", "--steps", f"{a - 5}..{b + 5}"],
                      ["slice", p, "OUT/s.json", "--steps", f"{b + 10}..{b + 20}"]]
    if lo is not None and hi is not None and hi > lo:
        w0, w1 = lo + (hi - lo) * 0.3, lo + (hi - lo) * 0.45
        cases.append(["slice", p, "OUT/s.json", "--window", f"{w0:.0f}..{w1:.0f}", "--absolute"])
    return cases


def job_cases(folder: Path) -> list[list[str]]:
    d = str(folder)
    files = sorted(str(f) for f in folder.iterdir() if f.is_file())
    cases = [
        ["merge", d, "OUT/m.json.gz"],
        ["merge", d, "OUT/m.json"],
        ["filter", d, "OUT/fj", "--exclude-cat", "python_function"],
        ["filter", d, "OUT/fj", "--ranks", "0..3", "--cat", "kernel", "--compression", "gzip"],
        ["sample", d, "OUT/sj", "-k", "3"],
        ["sample", d, "OUT/sj", "--ranks", "0", "--compression", "gzip"],
        ["sample", d, "OUT/sj", "-k", "2", "--seed", "1", "--compression", "none"],
        ["sample", d, "OUT/sj", "-k", "99"],
    ]
    if len(files) >= 2:
        cases.append(["merge", files[0], files[-1], "OUT/m2.json"])
        cases.append(["merge", d, files[0], "OUT/m3.json.gz"])
    return cases


_BAD_VALUES = [None, "abc", "", 1.5, True, [1, 2], {}, {"a": 1}, 10 ** 30, -1, 0, "M", "X", "s", 10 ** 400, "DEL"]
_FIELDS = ["ph", "name", "cat", "ts", "dur", "pid", "tid", "id", "args", "args.correlation", "args.name",
           "args.External id", "args.stream", "args.Input Dims"]


def damaged(base: dict, rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    """(name, JSON bytes) of traces made from `base` with one or a few fields damaged."""
    out: list[tuple[str, bytes]] = []
    events = base["traceEvents"]
    for k in range(n):
        doc = json.loads(json.dumps(base))
        evs = doc["traceEvents"]
        desc = []
        for _ in range(rng.choice([1, 1, 1, 2, 5])):
            i = rng.randrange(len(evs))
            if rng.random() < 0.2:  # metadata and flows have their own rules
                kinds = [j for j, e in enumerate(events) if e.get("ph") in ("M", "s", "f", "i")]
                if kinds:
                    i = rng.choice(kinds)
            field = rng.choice(_FIELDS)
            value = rng.choice(_BAD_VALUES)
            e = evs[i]
            if field.startswith("args."):
                key = field[5:]
                if not isinstance(e.get("args"), dict):
                    e["args"] = {}
                target, key = e["args"], key
            else:
                target, key = e, field
            if value == "DEL":
                target.pop(key, None)
            else:
                target[key] = value
            desc.append(f"{i}.{field}={'DEL' if value == 'DEL' else json.dumps(value)[:12]}")
        out.append((f"dmg{k:03d}_" + re.sub(r"[^A-Za-z0-9_.=-]", "_", ",".join(desc))[:80] + ".json",
                    json.dumps(doc).encode()))
    good = json.dumps(base).encode()
    extra = {
        "nan_literal.json": good.replace(b'"dur": ', b'"dur": NaN, "x": ', 1),
        "cut_off.json": good[: len(good) * 2 // 3],
        "cut_off_late.json": good[:-40],
        "deep.json": good.replace(b'"ph": "X"', b'"ph": "X", "deep": ' + b"[" * 5000 + b"]" * 5000, 1),
        "deep_id.json": good.replace(b'"ph": "X"', b'"ph": "X", "id": ' + b"[" * 5000 + b"]" * 5000, 1),
        "bad_utf8.json": good.replace(b'"name": "', b'"name": "\xff\xfe', 1),
        "empty_events.json": b'{"traceEvents": []}',
        "bare_array.json": json.dumps(events).encode(),
        "not_objects.json": b'{"traceEvents": [1, 2, 3]}',
        "keys_after.json": good[:-1] + b', "after": {"k": [1, 2]}}',
        "huge_int_ts_meta.json": good.replace(b'"ph": "M"', b'"ph": "M", "ts": ' + b"9" * 400, 1),
        "huge_int_ts_x.json": good.replace(b'"ph": "X"', b'"ph": "X", "ts": 1' + b"0" * 400 + b', "t0"', 1),
        "huge_int_dur.json": good.replace(b'"ph": "X"', b'"ph": "X", "dur": 1' + b"0" * 400 + b', "d0"', 1),
        "dup_keys.json": good.replace(b'"ph": "X"', b'"ph": "X", "ts": "abc"', 1),
        "dup_keys_null.json": good.replace(b'"ph": "X"', b'"ph": "X", "pid": null', 1),
        "spaces.json": good.replace(b"}, {", b"}  ,\n {"),
        "brace_in_string.json": good.replace(b'"name": "', b'"name": "}, {\\"ph\\": 1}, {', 3),
    }
    return out + sorted(extra.items())


def damaged_cases(folder: Path, files: list[Path]) -> list[list[str]]:
    cases = []
    for f in files:
        p = str(f)
        cases += [["check", p], ["compress", p, "OUT/c.json.gz"], ["filter", p, "OUT/f.json", "--exclude-cat", "x"],
                  ["slice", p, "OUT/s.json", "--window", "0..100000"], ["split", p, "OUT/split"]]
        steps, _, _ = _facts(f)
        if steps:
            first = steps[1] if len(steps) > 1 else steps[0]
            cases.append(["slice", p, "OUT/s.json", "--steps", f"{first}..{steps[-1]}"])
    # jobs: each damaged file with two good ranks
    jobs = folder / "jobs"
    for j, f in enumerate(files[:: max(1, len(files) // 25)]):
        d = jobs / f"job{j:02d}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(files[-1].parent / "good0.json", d / "rank0.json")
        shutil.copy(f, d / "rank1.json")
        shutil.copy(files[-1].parent / "good0.json", d / "rank2.json")
        cases += [["merge", str(d), "OUT/m.json"], ["sample", str(d), "OUT/sj", "-k", "3"],
                  ["filter", str(d), "OUT/fj", "--exclude-cat", "x"], ["merge", str(d / "rank1.json"), "OUT/m1.json"]]
    return cases


def corpus_files() -> list[Path]:
    return sorted(p for p in SHARED.rglob("*") if p.is_file() and not p.name.endswith((".md", ".yaml")))


def corpus_jobs() -> list[Path]:
    dirs = {p.parent for p in corpus_files()}
    return sorted(d for d in dirs if sum(1 for f in d.iterdir() if f.is_file()) >= 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", type=Path, required=True, help="reference checkout (a git worktree of the old code)")
    ap.add_argument("--new", type=Path, default=REPO, help="checkout under test (default: this one)")
    ap.add_argument("--big", type=Path, nargs="*", default=[], help="more traces (e.g. a 100 MB generated one)")
    ap.add_argument("--subprocess", action="store_true", help="one process per command (slower, closest to a user)")
    ap.add_argument("--quick", action="store_true", help="fewer option sets per file")
    ap.add_argument("--damaged", type=int, default=160, help="damaged traces to build (default 160)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", default=None, help="run only the cases whose command line contains this text")
    ap.add_argument("--scratch", type=Path, default=None)
    args = ap.parse_args(argv)

    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="surgery-eq-"))
    inputs = scratch / "inputs"
    work = scratch / "work"
    inputs.mkdir(parents=True, exist_ok=True)

    # damaged traces: a 3 MB generated trace (three 1 MB slices) and its damaged copies
    import gen_trace

    base_path = inputs / "good0.json"
    tiled = inputs / "tiled.json.src"
    if not tiled.exists():
        gen_trace.generate(tiled, 0.003, source=gen_trace.SHARED_TRACES / gen_trace.DEFAULT_SOURCE, quiet=True)
    base = json.loads(tiled.read_bytes())
    base_path.write_bytes(json.dumps(base).encode())  # with blanks after `,` and `:`
    (inputs / "good_compact.json").write_bytes(tiled.read_bytes())
    rng = random.Random(args.seed)
    dmg_files = []
    for name, data in damaged(base, rng, args.damaged):
        f = inputs / name
        f.write_bytes(data)
        dmg_files.append(f)
    dmg_files += [inputs / "good_compact.json", base_path]

    cases: list[list[str]] = []
    for f in corpus_files():
        cases += file_cases(f, heavy=not args.quick)
    for d in corpus_jobs():
        cases += job_cases(d)
    for f in args.big:
        cases += file_cases(f, heavy=True)
    cases += damaged_cases(inputs, dmg_files)
    if args.only:
        cases = [c for c in cases if any(args.only in a for a in c)]

    ref, new = Impl(args.ref, args.subprocess), Impl(args.new, args.subprocess)
    diffs = 0
    compared = 0
    outcomes: dict[str, int] = {}
    t_ref = t_new = 0.0
    try:
        for k, case in enumerate(cases):
            argv = ["trace"] + [a.replace("OUT/", str(work) + "/") for a in case]
            results = []
            for impl in (ref, new):
                _clear(work)
                t = time.perf_counter()
                r = impl.run(argv)
                dt = time.perf_counter() - t
                if impl is ref:
                    t_ref += dt
                else:
                    t_new += dt
                results.append((r, snapshot(work)))
            (r1, s1), (r2, s2) = results
            compared += 1
            kind = f"{case[0]} exit {r1['rc']}"
            if r1["rc"] == 2:  # the kind of refusal, in a few words
                msg = r1["err"].strip().splitlines()[-1] if r1["err"].strip() else ""
                msg = re.sub(r"^zoomer-ar: error: (\S+: )?", "", msg)
                kind += ": " + re.sub(r"[0-9]+", "N", " ".join(msg.split()[:5]))[:60]
            outcomes[kind] = outcomes.get(kind, 0) + 1
            problems = []
            for key in ("rc", "out", "err"):
                if r1[key] != r2[key]:
                    problems.append(f"{key}: ref {r1[key]!r:.300} new {r2[key]!r:.300}")
            if s1.keys() != s2.keys():
                problems.append(f"files: ref {sorted(s1)} new {sorted(s2)}")
            else:
                problems += [f"file {name} differs" for name in s1 if s1[name] != s2[name]]
            if problems:
                diffs += 1
                print(f"DIFF {' '.join(case)}")
                for pr in problems:
                    print("   ", pr)
            if (k + 1) % 100 == 0:
                print(f"... {k + 1}/{len(cases)} cases, {diffs} differ (ref {t_ref:.0f} s, new {t_new:.0f} s)",
                      flush=True)
    finally:
        ref.close()
        new.close()
        _clear(work)
    print("outcomes (reference):")
    for kind, n in sorted(outcomes.items()):
        print(f"  {n:5d}  {kind}")
    print(f"{compared} cases compared (exit code, stdout, stderr, every output file), {diffs} differ; "
          f"time in the commands: ref {t_ref:.1f} s, new {t_new:.1f} s")
    if not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
