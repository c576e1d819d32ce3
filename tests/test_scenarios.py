"""The scenario programs (training_data/scenarios) and their recorded examples (examples/traces).

* MANIFEST.yaml is consistent and its line numbers point at the planted statements;
* every bundled example trace shows the signal its program plants, and its clean twin does not;
* one scenario records end to end through record.py.

The trace checks read the bundled traces only (fast); they need no torch, but the module is
marked `torch` and skipped without it, as the programs themselves need it.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from zoomer_ar.models import PATTERN_IDS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "training_data" / "scenarios"
EXAMPLES = REPO / "examples" / "traces"
MANIFEST = yaml.safe_load((SCENARIOS / "MANIFEST.yaml").read_text(encoding="utf-8"))
ENTRIES: dict[str, dict] = MANIFEST["scenarios"]
PLANTED = {n: e for n, e in ENTRIES.items() if e["pattern"] != "clean"}
GPU_ENTRIES: dict[str, dict] = MANIFEST["gpu_scenarios"]  # GPU-only programs (examples/gpu)
GPU_OR_MULTI_RANK = {"idle-gpu", "launch-bound", "pageable-memcpy", "allocator-churn",
                     "exposed-communication", "sharding-imbalance", "straggler"}
STEPS = MANIFEST["defaults"]["steps"]
GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


# --------------------------------------------------------------------------------------------
# trace helpers (plain JSON; the engine's loader is not needed for these facts)
# --------------------------------------------------------------------------------------------
class Trace:
    def __init__(self, path: Path):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            self.raw = json.load(fh)
        self.events = self.raw["traceEvents"]
        self.x = [e for e in self.events if e.get("ph") == "X"]
        self.steps = sorted((e for e in self.x if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        self.main_tid = self.steps[0]["tid"] if self.steps else None

    def in_step(self, step: dict, *, name: str | None = None, cat: str | None = None, pred=None) -> list[dict]:
        lo, hi = step["ts"], step["ts"] + step["dur"]
        out = []
        for e in self.x:
            if e["tid"] != step["tid"] or not (lo <= e["ts"] < hi) or e is step:
                continue
            if name is not None and e["name"] != name:
                continue
            if cat is not None and e.get("cat") != cat:
                continue
            if pred is not None and not pred(e):
                continue
            out.append(e)
        return out

    def per_step(self, **kw) -> list[list[dict]]:
        return [self.in_step(s, **kw) for s in self.steps]

    def inside(self, outer: dict, **kw) -> list[dict]:
        lo, hi = outer["ts"], outer["ts"] + outer["dur"]
        return [e for e in self.in_step(outer, **kw) if e["ts"] + e.get("dur", 0) <= hi + 1e-3 and e["ts"] >= lo]

    def python_frames(self) -> set[str]:
        return {e["name"] for e in self.x if e.get("cat") == "python_function"}

    def memory_end_of_step(self) -> list[int]:
        mem = sorted((e for e in self.events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
        out = []
        for s in self.steps:
            inside = [m for m in mem if s["ts"] <= m["ts"] <= s["ts"] + s["dur"]]
            assert inside, f"no [memory] events in {s['name']}"
            out.append(int(inside[-1]["args"]["Total Allocated"]))
        return out


@functools.lru_cache(maxsize=None)
def trace(name: str) -> Trace:
    path = EXAMPLES / name / "rank-0.pt.trace.json.gz"
    if not path.exists():
        pytest.fail(f"missing example trace {path}: run training_data/scenarios/record.py")
    return Trace(path)


def numel(dims) -> int:
    return math.prod(dims) if dims else 0


def gemm_dims(t: Trace) -> list[list[list[int]]]:
    return [e["args"]["Input Dims"] for e in t.x if e["name"] in GEMMS and e["tid"] == t.main_tid]


def gemm_types(t: Trace) -> list[list[str]]:
    return [e["args"]["Input type"] for e in t.x if e["name"] in GEMMS and e["tid"] == t.main_tid]


# --------------------------------------------------------------------------------------------
# MANIFEST
# --------------------------------------------------------------------------------------------
def test_manifest_shape():
    assert MANIFEST["schema_version"] == 1
    assert set(MANIFEST["defaults"]) >= {"steps", "skip", "warmup", "severity"}
    assert "clean" in ENTRIES and ENTRIES["clean"]["pattern"] == "clean"
    patterns = {e["pattern"] for e in PLANTED.values()}
    assert patterns == {"sync-point", "extra-copy", "single-tensor-optimizer", "zero-grad-not-none",
                        "conv-bias-before-bn", "fp32-matmul", "misaligned-gemm", "memory-growth",
                        "dataloader-bound"}
    for name, e in ENTRIES.items():
        assert (SCENARIOS / e["file"]).is_file(), name
        assert e["pattern"] == "clean" or e["pattern"] in PATTERN_IDS, name
        for key in ("must_not_show", "incidental"):
            assert set(e[key]) <= set(PATTERN_IDS), (name, key)
        assert not set(e["must_not_show"]) & set(e["incidental"]), name
        assert GPU_OR_MULTI_RANK <= set(e["must_not_show"]), name
        assert set(e["severity"]) >= {"knob", "low", "mid", "high"}, name
        assert e["pattern"] not in e["must_not_show"], name
    for name, e in PLANTED.items():
        twin = ENTRIES[e["twin"]]
        assert twin["pattern"] == "clean" and twin["twin_of"] == name
        assert e["pattern"] in e["twin_must_not_show"]
        assert twin["must_not_show"] == e["twin_must_not_show"], name
        assert e["signal"]
    twins = [n for n, e in ENTRIES.items() if e.get("twin_of")]
    assert sorted(twins) == sorted(e["twin"] for e in PLANTED.values())
    assert set(ENTRIES["clean"]["must_not_show"]) == set(PATTERN_IDS)


def _enclosing_function(tree: ast.Module, line: int) -> str | None:
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            if best is None or node.lineno > best.lineno:
                best = node
    return best.name if best else None


def _is_code_line(tree: ast.Module, line: int) -> bool:
    """True when `line` belongs to a statement that is not a bare string (docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                continue
            if node.lineno <= line <= node.end_lineno and not any(
                isinstance(c, ast.stmt) for c in ast.iter_child_nodes(node)
            ):
                return True
            if node.lineno == line:
                return True
    return False


def test_gpu_manifest_shape():
    assert not set(GPU_ENTRIES) & set(ENTRIES)
    planted = {n: e for n, e in GPU_ENTRIES.items() if e["pattern"] != "clean"}
    assert {e["pattern"] for e in planted.values()} == {"pageable-memcpy", "allocator-churn", "launch-bound"}
    for name, e in planted.items():
        twin = GPU_ENTRIES[e["twin"]]
        assert twin["twin_of"] == name and e["pattern"] in twin["must_not_show"] == e["twin_must_not_show"]
        assert e["pattern"] not in e["must_not_show"] and e["signal"]
    for name, e in GPU_ENTRIES.items():
        assert (SCENARIOS / e["file"]).is_file(), name
        assert set(e["must_not_show"]) | set(e["incidental"]) <= set(PATTERN_IDS), name
        assert not set(e["must_not_show"]) & set(e["incidental"]), name


@pytest.mark.parametrize("name", [*ENTRIES, *GPU_ENTRIES])
def test_manifest_lines_match_sources(name):
    e = {**ENTRIES, **GPU_ENTRIES}[name]
    src = (SCENARIOS / e["file"]).read_text(encoding="utf-8")
    lines = src.splitlines()
    tree = ast.parse(src)
    for spot in [{"line": e["line"], "contains": e["contains"]}, *e.get("also", [])]:
        line = spot["line"]
        assert 1 <= line <= len(lines), (name, line)
        assert spot["contains"] in lines[line - 1], f"{e['file']}:{line} does not contain {spot['contains']!r}: {lines[line - 1]!r}"
        assert _is_code_line(tree, line), f"{e['file']}:{line} is not code"
        assert _enclosing_function(tree, line) == e["function"], (name, line)


@pytest.mark.parametrize("name", list(PLANTED))
def test_twin_differs_only_where_planted(name):
    """The planted line is gone from the twin (apart from fp32_matmul, whose fix wraps it)."""
    e = PLANTED[name]
    twin = ENTRIES[e["twin"]]
    planted_src = (SCENARIOS / e["file"]).read_text().splitlines()
    twin_src = (SCENARIOS / twin["file"]).read_text().splitlines()
    planted_line = planted_src[e["line"] - 1].strip()
    if e["pattern"] != "fp32-matmul":
        assert planted_line not in [t.strip() for t in twin_src], name
    assert twin["contains"] in twin_src[twin["line"] - 1]


def _record_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("scenario_record", SCENARIOS / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_variants_change_only_device_lines(tmp_path):
    """record.py --device cuda runs each CPU program as a copy whose device lines say cuda: same
    lines (the traces' stacks map onto the committed files), nothing else changed."""
    record = _record_module()
    out = record.gpu_variants(tmp_path / "cuda")
    olds = [old for old, _ in record.GPU_SUBSTITUTIONS]
    for e in [*ENTRIES.values(), *GPU_ENTRIES.values()]:
        src = (SCENARIOS / e["file"]).read_text(encoding="utf-8").splitlines()
        var = (out / e["file"]).read_text(encoding="utf-8").splitlines()
        ast.parse("\n".join(var))
        assert len(var) == len(src), e["file"]
        changed = [(a, b) for a, b in zip(src, var) if a != b]
        if e["file"] in {g["file"] for g in GPU_ENTRIES.values()}:
            assert not changed and 'torch.device(args.device)' in "\n".join(src), e["file"]
            continue
        assert any('torch.device("cuda")' in b for _, b in changed), e["file"]
        assert all(any(old in a for old in olds) and "cpu" not in b.replace("pin_memory", "") for a, b in changed), changed
    assert (out / "_common.py").read_text() == (SCENARIOS / "_common.py").read_text()


def test_programs_are_torch_only():
    """No torchvision, no downloads: the scenario programs import torch and the stdlib only."""
    allowed = {"torch", "argparse", "sys", "pathlib", "_common", "zoomer_ar", "__future__"}
    for path in SCENARIOS.glob("*.py"):
        if path.name == "record.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                assert mod.split(".")[0] in allowed, f"{path.name} imports {mod}"


# --------------------------------------------------------------------------------------------
# bundled examples
# --------------------------------------------------------------------------------------------
def test_examples_exist_and_are_small():
    total = 0
    for name in ENTRIES:
        folder = EXAMPLES / name
        trace_path = folder / "rank-0.pt.trace.json.gz"
        assert trace_path.is_file(), f"missing {trace_path}"
        size = trace_path.stat().st_size
        assert size < 300 * 1024, f"{trace_path} is {size} bytes"
        total += size
        job = json.loads((folder / "job.json").read_text())
        assert job["metadata"]["scenario"] == name
        assert job["metadata"]["severity"] == "mid"
        assert job["complete"] is True and len(job["steps_recorded"]) == STEPS
        assert job["profiler"]["profile_memory"] is ENTRIES[name]["profile_memory"]
    assert total < 4 * 1024 * 1024


@pytest.mark.parametrize("name", list(ENTRIES))
def test_example_has_steps_and_frames(name):
    t = trace(name)
    assert len(t.steps) == STEPS
    job = json.loads((EXAMPLES / name / "job.json").read_text())
    assert [int(s["name"].split("#")[1]) for s in t.steps] == job["steps_recorded"]
    frames = t.python_frames()
    stem = ENTRIES[name]["file"]
    # every program's step function shows as a python frame `<file>(<def line>): train_step`
    src = (SCENARIOS / stem).read_text()
    def_line = next(n.lineno for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "train_step")
    assert f"{stem}({def_line}): train_step" in frames
    assert any(f.startswith("nn.Module: ") for f in frames)


def _item_counts(name):
    return [len(s) for s in trace(name).per_step(name="aten::item")]


def test_sync_point_signal():
    planted, twin = _item_counts("sync_point"), _item_counts("sync_point_clean")
    assert planted == [PLANTED["sync_point"]["severity"]["mid"]] * STEPS, planted
    assert twin == [0] * STEPS
    assert sum(_item_counts("clean")) == 0
    # the items come from the planted line's function
    t = trace("sync_point")
    assert all(len(t.per_step(name="aten::_local_scalar_dense")[i]) == planted[i] for i in range(STEPS))


# Copies that are part of another op's normal work (addmm broadcasting its bias into the output,
# autocast casting weights inside aten::linear and casting their gradients back in
# ToCopyBackward0) are not "extra" copies.
COPY_OWNERS = {"aten::addmm", "aten::linear", "aten::mm", "aten::convolution", "aten::conv2d", "ToCopyBackward0"}


def _big_copies(name, min_numel=65536):
    """Per step: aten::copy_ of >= min_numel elements not done inside a GEMM/linear/conv op."""
    t = trace(name)
    owned: set[int] = set()
    stack: list[dict] = []
    for e in sorted((e for e in t.x if e["tid"] == t.main_tid), key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if e["name"] == "aten::copy_" and any(s["name"] in COPY_OWNERS for s in stack):
            owned.add(id(e))
        stack.append(e)

    def big(e):
        dims = e["args"].get("Input Dims") or [[]]
        return id(e) not in owned and numel(dims[0]) >= min_numel

    return [len(s) for s in t.per_step(name="aten::copy_", pred=big)]


def test_extra_copy_signal():
    planted, twin = _big_copies("extra_copy"), _big_copies("extra_copy_clean")
    assert planted == [4] * STEPS, planted
    assert twin == [0] * STEPS, twin
    for name, e in ENTRIES.items():  # no other program makes large copies of its own
        if name != "extra_copy":
            assert sum(_big_copies(name)) == 0, name
    t = trace("extra_copy")
    for ops in ("aten::clone", "aten::contiguous", "aten::_to_copy"):
        assert all(t.per_step(name=ops)), ops


def test_single_tensor_optimizer_signal():
    planted, twin = trace("single_tensor_optimizer"), trace("single_tensor_optimizer_clean")

    def count(t, needle, cat=None):
        return [len(s) for s in t.per_step(pred=lambda e: needle in e["name"] and (cat is None or e.get("cat") == cat))]

    assert count(planted, "_single_tensor_adam", "python_function") == [1] * STEPS
    assert sum(count(planted, "aten::_foreach_")) == 0
    assert sum(count(twin, "_single_tensor_adam")) == 0
    assert count(twin, "_multi_tensor_adam", "python_function") == [1] * STEPS
    assert all(n >= 5 for n in count(twin, "aten::_foreach_", "cpu_op"))
    # per-parameter work: the single-tensor step dispatches many more top-level ops (on a GPU,
    # kernel launches) than the foreach one; on CPU the foreach ops loop over tensors inside
    def top_level_ops_in_optimizer(t):
        counts = []
        for s in (e for e in t.x if e["name"].startswith("Optimizer.step#Adam.step")):
            n, end = 0, -1.0
            for e in sorted(t.inside(s, cat="cpu_op"), key=lambda e: (e["ts"], -e["dur"])):
                if e["ts"] >= end:
                    n, end = n + 1, e["ts"] + e["dur"]
            counts.append(n)
        return counts
    p_ops, c_ops = top_level_ops_in_optimizer(planted), top_level_ops_in_optimizer(twin)
    assert len(p_ops) == len(c_ops) == STEPS
    assert min(p_ops) > 3 * max(c_ops), (p_ops, c_ops)


def _zero_in_zero_grad(name):
    t = trace(name)
    zg = [e for e in t.x if e["name"].startswith("Optimizer.zero_grad#")]
    assert len(zg) == STEPS
    return [len(t.inside(z, name="aten::zero_")) for z in zg]


def test_zero_grad_not_none_signal():
    params = 2 * PLANTED["zero_grad_not_none"]["severity"]["mid"]
    assert _zero_in_zero_grad("zero_grad_not_none") == [params] * STEPS
    assert _zero_in_zero_grad("zero_grad_not_none_clean") == [0] * STEPS
    assert _zero_in_zero_grad("clean") == [0] * STEPS


def _convs(name):
    t = trace(name)
    convs = [e for e in t.x if e["name"] == "aten::convolution" and e["tid"] == t.main_tid]
    with_bias = [c for c in convs if len(c["args"]["Input Dims"]) > 2 and c["args"]["Input Dims"][2]]
    return t, convs, with_bias


def test_conv_bias_before_bn_signal():
    blocks = PLANTED["conv_bias_before_bn"]["severity"]["mid"]
    t, convs, with_bias = _convs("conv_bias_before_bn")
    assert len(convs) == blocks * STEPS and len(with_bias) == len(convs)
    assert all(c["args"]["Input Dims"][2] == [32] for c in with_bias)
    # each biased conv is followed by a batch norm
    bns = sorted(e["ts"] for e in t.x if e["name"] == "aten::batch_norm")
    for c in with_bias:
        nxt = [b for b in bns if b >= c["ts"] + c["dur"]]
        assert nxt and nxt[0] - (c["ts"] + c["dur"]) < 5000  # within 5 ms
    for twin in ("conv_bias_before_bn_clean", "clean", "dataloader_bound", "dataloader_bound_clean"):
        _, convs, with_bias = _convs(twin)
        assert convs and not with_bias, twin


def test_fp32_matmul_signal():
    planted = gemm_types(trace("fp32_matmul"))
    assert planted and all("float" in ty and "c10::BFloat16" not in ty for ty in planted)
    for twin in ("fp32_matmul_clean", "clean"):
        types = gemm_types(trace(twin))
        bf16 = [ty for ty in types if "c10::BFloat16" in ty]
        assert types and len(bf16) == len(types), twin


def _misaligned(dims_list):
    bad = []
    for dims in dims_list:
        sizes = [d for shape in dims if shape for d in shape]
        if any(d % 8 for d in sizes):
            bad.append(dims)
    return bad


def test_misaligned_gemm_signal():
    planted = gemm_dims(trace("misaligned_gemm"))
    assert planted and len(_misaligned(planted)) == len(planted)
    assert any([63, 1001] in dims for dims in planted)
    for name, e in ENTRIES.items():
        if name == "misaligned_gemm":
            continue
        dims = gemm_dims(trace(name))
        assert not _misaligned(dims), (name, _misaligned(dims)[:3])


def test_memory_growth_signal():
    per_step = 64 * PLANTED["memory_growth"]["severity"]["mid"] * 4
    planted = trace("memory_growth").memory_end_of_step()
    deltas = [b - a for a, b in zip(planted, planted[1:])]
    assert all(d >= 0.9 * per_step for d in deltas), deltas
    for twin in ("memory_growth_clean", "clean"):
        mem = trace(twin).memory_end_of_step()
        assert max(mem) - min(mem) < 4096, (twin, mem)


def _dataloader_next(name):
    t = trace(name)
    nxt = [s for s in t.per_step(pred=lambda e: e["name"].startswith("enumerate(DataLoader)#"))]
    assert all(len(n) == 1 for n in nxt), name
    return [n[0] for n in nxt], [s["dur"] for s in t.steps]


def test_dataloader_bound_signal():
    p_next, p_steps = _dataloader_next("dataloader_bound")
    c_next, c_steps = _dataloader_next("dataloader_bound_clean")
    assert all("_SingleProcessDataLoaderIter.__next__" in e["name"] for e in p_next)
    assert all("_MultiProcessingDataLoaderIter.__next__" in e["name"] for e in c_next)
    p_ms = sum(e["dur"] for e in p_next) / STEPS / 1000
    c_ms = sum(e["dur"] for e in c_next) / STEPS / 1000
    p_share = sum(e["dur"] for e in p_next) / sum(p_steps)
    c_share = sum(e["dur"] for e in c_next) / sum(c_steps)
    assert p_ms > 3 * c_ms, (p_ms, c_ms)
    assert p_share > 0.25 and c_share < p_share / 3, (p_share, c_share)
    # the dataset's work runs inside the planted __next__
    t = trace("dataloader_bound")
    assert all(t.inside(e, name="aten::conv2d") for e in p_next)
    for name in ENTRIES:
        if not name.startswith("dataloader_bound"):
            assert not any(e["name"].startswith("enumerate(DataLoader)#") for e in trace(name).x), name


def test_clean_reference_shows_nothing_planted():
    t = trace("clean")
    assert sum(_item_counts("clean")) == 0
    assert sum(_big_copies("clean")) == 0
    assert not any("_single_tensor_" in e["name"] for e in t.x)
    assert any(e["name"].startswith("aten::_foreach_") for e in t.x)


# --------------------------------------------------------------------------------------------
# end to end: record one scenario through record.py
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_record_one_scenario_end_to_end(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCENARIOS / "record.py"), "--out", str(tmp_path), "--only", "sync_point",
         "--steps", "2", "--skip", "1", "--warmup", "1", "--severity", "low", "--python", sys.executable,
         "--quiet-wait", "0", "--retries", "0"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = tmp_path / "sync_point"
    t = Trace(folder / "rank-0.pt.trace.json.gz")
    assert [s["name"] for s in t.steps] == ["ProfilerStep#2", "ProfilerStep#3"]
    assert [len(s) for s in t.per_step(name="aten::item")] == [1, 1]  # severity low: 1 micro-batch
    job = json.loads((folder / "job.json").read_text())
    assert job["metadata"] == {"scenario": "sync_point", "severity": "low", "seed": 0, "threads": 1,
                               "micro_batches": 1}
    assert job["steps_recorded"] == [2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sync_point"]
