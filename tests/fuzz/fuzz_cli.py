"""Mutation fuzz of the commands that read user input: `analyze` (in memory and streamed, with
--annotate), `compare` and the `trace` commands, on corpus traces with damaged events (wrong types,
missing fields, odd phases, metadata without names, truncation, byte flips, a bad rank in a folder),
and `fix --diff` on damaged Python sources (the fixers' examples and the scenario programs).

Every run must end with exit 0 or 2, no traceback, a refusal in one line; every trace a `trace`
command writes must pass `trace check`; an annotated trace of an input that passes `check` must
pass it too; a `fix` patch must apply with `git apply`, parse, and leave nothing for a second run.
Failing cases are kept (input, command) under --keep.

    python tests/fuzz/fuzz_cli.py --seed 1 -n 200           # about 4 minutes on 2 cores
    python tests/fuzz/fuzz_cli.py --seed 7 -n 50 --only trace

Run by hand (it found the nameless metadata events that slice/split/filter/compress used to copy
into outputs `trace check` refused); tests/fuzz/test_fuzz_smoke.py runs a few cases of each kind.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
SOURCES = ["kineto/resnet50_num_workers_0", "hta/amd_trace", "param/linear_kineto.json.gz",
           "hta/mtia_trace_single_rank", "kineto/old_schema"]
JOBS = ["param/dlrm_8ranks", "kineto/resnet50_num_workers_0"]
VALUES = [None, "abc", -1, 0, 1e308, -1e308, 2**63, [], {}, True, "", "0x10", 1.5, "nan"]
KEYS = ["ts", "dur", "pid", "tid", "name", "cat", "ph", "args", "id", "s", "bp"]
ARG_KEYS = ["correlation", "stream", "device", "External id", "Input Dims", "Input type", "bytes", "Total Allocated",
            "Python id", "Python parent id", "Sequence number", "Fwd thread id", "Call stack", "Ev Idx", "Addr"]
NAMES = ["ProfilerStep#x", "ProfilerStep#1", "cudaDeviceSynchronize", "aten::item", "Optimizer.step#SGD.step",
         "ncclKernel_AllReduce", "[memory]", "", "\u00e9\u0000", "Optimizer.zero_grad#SGD.zero_grad"]


def zoomer() -> str:
    exe = Path(sys.executable).with_name("zoomer-ar")
    return str(exe) if exe.exists() else "zoomer-ar"


def trace_files(p: Path) -> list[Path]:
    return [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file() and ".json" in x.name)


def inflate(p: Path) -> bytes:
    b = p.read_bytes()
    return gzip.decompress(b) if p.name.endswith(".gz") else b


def damage_events(rng: random.Random, doc: dict) -> dict:
    ev = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not ev:
        return doc
    kind = rng.randrange(8)
    for i in rng.sample(range(len(ev)), min(len(ev), rng.choice([1, 3, 50]))):
        e = ev[i]
        if not isinstance(e, dict):
            continue
        if kind == 0:
            e[rng.choice(KEYS)] = rng.choice(VALUES)
        elif kind == 1:
            e.pop(rng.choice(KEYS), None)
        elif kind == 2 and isinstance(e.setdefault("args", {}), dict):
            e["args"][rng.choice(ARG_KEYS)] = rng.choice(VALUES + [[1, 2], [[1, 2]], ["float"]])
        elif kind == 3:
            e["ph"] = rng.choice(["X", "i", "B", "E", "M", "s", "f", "C", "b", "e", "n", "Z", "I", "R"])
        elif kind == 4:
            ev[i] = rng.choice([1, "x", None, [], {"ph": "X"}])
        elif kind == 5:
            e["ts"] = 0 if rng.random() < .5 else -abs(e["ts"]) if isinstance(e.get("ts"), (int, float)) else -1
        elif kind == 6:
            e["dur"] = rng.choice([0, -5, 1e12, 1e-9])
        else:
            e["name"] = rng.choice(NAMES)
    if rng.random() < 0.1:
        doc[rng.choice(["distributedInfo", "deviceProperties", "baseTimeNanoseconds", "traceName"])] = rng.choice(
            VALUES + [{"rank": "x"}, [{"name": 5}], {"rank": 1e30, "world_size": -3}])
    return doc


def damage_bytes(rng: random.Random, b: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return b[: rng.randrange(len(b))]
    if kind == 1:
        a = bytearray(b)
        for _ in range(rng.choice([1, 5, 50])):
            a[rng.randrange(len(a))] = rng.randrange(256)
        return bytes(a)
    if kind == 2:
        i = rng.randrange(len(b))
        return b[:i] + rng.choice([b"{", b"}", b"]", b'"', b",", b"\\", b"\x00", b"NaN"]) + b[i:]
    i, j = sorted(rng.sample(range(len(b)), 2))
    return b[:i] + b[j:]


def damaged(rng: random.Random, raw: bytes) -> bytes:
    if rng.random() < 0.65:
        try:
            return json.dumps(damage_events(rng, json.loads(raw))).encode()
        except ValueError:
            pass
    return damage_bytes(rng, raw)


def write(rng: random.Random, folder: Path, data: bytes, name: str | None = None) -> Path:
    name = name or ("t.json.gz" if rng.random() < 0.5 else "t.json")
    p = folder / name
    p.write_bytes(gzip.compress(data, 1) if name.endswith(".gz") else data)
    return p


def run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([zoomer(), *args], capture_output=True, text=True, timeout=600)


def verdict(r: subprocess.CompletedProcess) -> str | None:
    """What is wrong with how a command ended (None: nothing)."""
    if r.returncode not in (0, 2) or "Traceback" in r.stderr:
        return f"exit {r.returncode}"
    errors = [x for x in r.stderr.strip().splitlines() if not x.startswith(("note:", "warning:", "zoomer-ar: wrote"))]
    if r.returncode == 2 and len(errors) != 1:
        return f"a refusal in {len(errors)} lines"
    return None


def unchecked_outputs(folder: Path) -> str | None:
    for p in sorted(folder.rglob("*.json*")):
        c = run(["trace", "check", str(p)])
        if c.returncode != 0:
            return f"output {p.name} fails trace check: {c.stderr.strip()[-200:]}"
    return None


def case(rng: random.Random, kind: str, td: Path) -> tuple[list[str], str | None]:
    out = td / "out"
    out.mkdir()
    if kind == "fix":
        return fix_case(rng, td)
    if kind == "jobs":
        job = SHARED / rng.choice(JOBS)
        d = td / "job"
        d.mkdir()
        files = trace_files(job)[:4]
        for f in files:
            shutil.copy(f, d / f.name)
        victim = rng.choice(files)
        write(rng, d, damaged(rng, inflate(victim)), victim.name)
        args = rng.choice([
            ["trace", "filter", str(d), str(out / "f"), "--ranks", "0,1", "--exclude-cat", "python_function"],
            ["trace", "sample", str(d), str(out / "s"), "-k", "2"],
            ["trace", "merge", str(d), str(out / "m.json.gz")],
            ["analyze", str(d), "--no-files", rng.choice(["--stream", "--no-stream"])],
        ])
        r = run(args)
        return args, verdict(r) or (unchecked_outputs(out) if r.returncode == 0 and args[0] == "trace" else None)
    src = rng.choice(trace_files(SHARED / rng.choice(SOURCES)))
    p = write(rng, td, damaged(rng, inflate(src)))
    if kind == "analyze":
        args = ["analyze", str(p), "--no-files", "--format", "json", rng.choice(["--stream", "--no-stream"])]
        return args, verdict(run(args))
    if kind == "annotate":
        ann = out / "annotated.json.gz"
        args = ["analyze", str(p), "--no-files", "--annotate", str(ann), rng.choice(["--stream", "--no-stream"])]
        r = run(args)
        if verdict(r) or r.returncode != 0 or run(["trace", "check", str(p)]).returncode != 0:
            return args, verdict(r)
        return args, unchecked_outputs(out)
    if kind == "compare":
        args = ["compare", str(src), str(p)]
        return args, verdict(run(args))
    args = rng.choice([
        ["trace", "slice", str(p), str(out / "s.json.gz"), "--steps", rng.choice(["1..3", "0..1000", "101..102", "5..5"])],
        ["trace", "slice", str(p), str(out / "w.json"), "--window", rng.choice(["0..5", "1..1000000", "3..4"])],
        ["trace", "filter", str(p), str(out / "f.json.gz"), "--exclude-cat", "python_function"],
        ["trace", "split", str(p), str(out / "split")],
        ["trace", "compress", str(p), str(out / "c.json.gz")],
        ["trace", "repair", str(p), str(out / "r.json.gz")],
        ["trace", "check", str(p)],
    ])
    r = run(args)
    return args, verdict(r) or (unchecked_outputs(out) if r.returncode == 0 else None)


def damaged_source(rng: random.Random, s: str) -> bytes:
    """A Python source with one damage: a line deleted or doubled, a stray token, CRLF endings, a BOM,
    a latin-1 coding cookie, no final newline, everything indented into a class, lines repeated."""
    lines = s.splitlines(keepends=True)
    kind = rng.randrange(9)
    if kind == 0 and lines:
        del lines[rng.randrange(len(lines))]
    elif kind == 1 and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif kind == 2:
        i = rng.randrange(len(s) + 1)
        return (s[:i] + rng.choice(["(", ":", "\t", '"""', "#", "\\\n", "\x0c", " if x:", "lambda: "]) + s[i:]).encode()
    elif kind == 3:
        return s.replace("\n", "\r\n").encode()
    elif kind == 4:
        return b"\xef\xbb\xbf" + s.encode()
    elif kind == 5:
        return ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + s).encode("latin-1", "replace")
    elif kind == 6:
        return s.rstrip("\n").encode()
    elif kind == 7:
        return ("class Wrap:\n    def run(self):\n" + "".join("        " + x if x.strip() else x for x in lines)).encode()
    else:
        lines += ["\n"] + rng.sample(lines, min(3, len(lines)))
    return "".join(lines).encode()


def fix_case(rng: random.Random, td: Path) -> tuple[list[str], str | None]:
    """`fix --diff` on a damaged fixer example or scenario program in a git work tree: exit 0, the
    patch applies with `git apply`, the result parses, a second run finds nothing to change."""
    from zoomer_ar.fix.registry import load_registry

    sources = [e.before for c in load_registry().fixers for e in c.INVALID]
    sources += [p.read_text() for p in sorted((REPO / "training_data" / "scenarios").glob("*.py"))]
    subprocess.run(["git", "init", "-q", str(td)], check=True)
    f = td / "train.py"
    f.write_bytes(damaged_source(rng, rng.choice(sources)))
    args = ["fix", str(td), "--diff"]
    r = subprocess.run([zoomer(), *args], capture_output=True, timeout=600)  # bytes: a patch is in its file's encoding
    if r.returncode != 0 or b"Traceback" in r.stderr:
        return args, f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[-300:]}"
    if not r.stdout.strip():
        return args, None
    (td / "patch.diff").write_bytes(r.stdout)
    applied = subprocess.run(["git", "apply", "patch.diff"], cwd=td, capture_output=True, text=True)
    if applied.returncode != 0:
        return args, f"git apply: {applied.stderr.strip()[-300:]}"
    try:
        compile(f.read_bytes(), "train.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return args, f"the patched file does not parse: {exc}"
    again = subprocess.run([zoomer(), *args], capture_output=True, timeout=600)
    return args, ("a second run changes it again" if again.stdout.strip() else None)


KINDS = ["analyze", "annotate", "compare", "trace", "jobs", "fix"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", type=int, default=50, help="cases")
    ap.add_argument("--only", choices=KINDS, action="append", help="only these kinds of case (repeatable)")
    ap.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "zoomer-fuzz",
                    help="where failing cases are kept")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    kinds = a.only or KINDS
    failed = 0
    for n in range(a.n):
        kind = kinds[n % len(kinds)]
        with tempfile.TemporaryDirectory() as tmp:
            td = Path(tmp)
            args, problem = case(rng, kind, td)
            if problem:
                failed += 1
                keep = a.keep / f"seed{a.seed}-case{n}"
                shutil.copytree(td, keep, dirs_exist_ok=True)
                (keep / "command").write_text(" ".join(args) + "\n")
                print(f"case {n} ({kind}): {problem}\n  zoomer-ar {' '.join(args)}\n  kept in {keep}", flush=True)
    print(f"{failed} of {a.n} cases failed (seed {a.seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
