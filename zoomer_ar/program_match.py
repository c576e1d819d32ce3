"""Whether two traces look like runs of one program: `compare` warns when they do not (a before and an
after of two unrelated jobs give a speedup that means nothing).

What the traces carry that a change to a program keeps and another program does not share, in the
order it is trusted:

1. the ``nn.Module`` classes (``with_modules`` frames ``nn.Module: Linear_0`` -> ``Linear``; the
   wrappers a change adds, :data:`WRAPPER_MODULES`, left out): at least
   3 on each side; another program when under :data:`MIN_MODULE_SHARE` of them are shared (a change
   to a program keeps its classes or adds a wrapper; every model has Linear, ReLU, Sequential...,
   so an MLP and a CNN share 3 of 7);
2. else the GPU kernels' families (the name up to its template arguments, without the architecture
   prefix: ``sm80_``, ``ampere_``, ``volta_``...; every vendor-library matmul kernel - cuBLAS, CUTLASS,
   nvjet, rocBLAS - one family, every library convolution another: the library picks them for the
   GPU, dtype and shape): at least 8 on each side; another program under :data:`MIN_KERNEL_SHARE`;
3. else the CPU operators' names (``aten::mm``...): at least 8 on each side; another program under
   :data:`MIN_OP_SHARE` (every PyTorch program runs many of the same aten operators, so only a
   large difference counts).

A side that runs compiled code (torch.compile's ``CompiledFunction``/``Torch-Compiled Region``,
triton kernels, a CUDA graph's replay) when the other does not is not called another program on its
kernels or operators: the change may be the compilation, which renames most of them; nor on its
module classes when they are some of the other side's (a compiled region records none).

Measured 2026-12-02 on ../shared/traces and the bundled scenario traces (examples/traces,
examples/gpu), every pair of traces from different folders: no warning on the 44 pairs of one
program (hta/trace_diff's control and test, on an A100 and a V100, one partly compiled: kernel
families 95% shared; kineto's resnet50 with 0 and 4 loader workers: 100%; each scenario program and
its clean twin, on the CPU and on a GPU, and each scenario's CPU and GPU recordings: modules 100%,
and the GPU fp32_matmul pair, whose twin runs other GEMM kernels, 89% of its kernel families);
1,499 of the 2,146 pairs of unrelated traces large enough to judge are called two programs (most
of the rest are small programs much alike, such as param/linear_kineto and the scenario MLPs, or a
compiled side), and 346 of the 946 pairs of different scenario programs (a CNN and an MLP: the
scenarios that train the same MLP with another loop are not told apart). Traces too small to judge (a handful of operators) say nothing. A trace read in a streaming pass keeps a
subset of its rows, but the pass records the names of every row it reads (stream/compact.py: the same
names as the in-memory loader's, tested on the corpus), windows included. A findings.json keeps these
names (its `program`, schema 1.1), so a saved analysis is judged as its trace would be; one written
before 1.1 keeps none and says nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .features import names as N
from .load.columns import RankTrace
from .models import ProgramSignature

__all__ = ["ProgramNames", "from_signature", "mismatch_note", "program_names", "signature"]

MIN_MODULE_SHARE = 0.5
MIN_KERNEL_SHARE = 0.4
MIN_OP_SHARE = 0.3
MIN_MODULES = 3
MIN_NAMES = 8

_MODULE_FRAME = re.compile(r"^nn\.Module: (.+?)(?:_\d+)?$")
#: classes a change wraps a model in (torch.compile, DDP/FSDP, activation checkpointing): not the model's own
WRAPPER_MODULES = frozenset({"OptimizedModule", "GraphModule", "DistributedDataParallel", "DataParallel",
                             "FullyShardedDataParallel", "CheckpointWrapper", "OffloadWrapper"})
_ARCH_PREFIX = re.compile(r"\b(?:sm\d+|ampere|volta|turing|hopper|ada|blackwell)_")
_COMPILED = re.compile(r"^triton_|CompiledFunction|Torch-Compiled Region|cudaGraphLaunch|hipGraphLaunch")


@dataclass(frozen=True)
class ProgramNames:
    """The names that identify a program in its trace (all ranks together)."""

    modules: frozenset[str]
    kernels: frozenset[str]
    ops: frozenset[str]
    compiled: bool


#: vendor-library kernels (cuBLAS/cuBLASLt, CUTLASS, nvjet, rocBLAS/hipBLASLt, cuDNN/MIOpen): which one a matmul or
#: convolution runs is the library's choice for the GPU, dtype and shape (tile sizes, split-K), not the program's
_LIBRARY_GEMM = re.compile(r"gemm|nvjet|cutlass|cublas|xmma|splitK|^scal_kernel|Cijk_|rocblas|hipblaslt", re.I)
_LIBRARY_CONV = re.compile(r"cudnn|miopen|implicit_convolve|winograd|conv2d_grouped|fft2d|MIOpen", re.I)


def kernel_family(name: str) -> str:
    """``void at::native::vectorized_elementwise_kernel<4, ...>(...)`` -> ``at::native::vectorized_elementwise_kernel``;
    ``sm80_xmma_gemm_f32f32_...`` -> ``xmma_gemm_f32f32_...``: the same kernel on another GPU or dtype."""
    if _LIBRARY_GEMM.search(name):
        return "<library matmul>"
    if _LIBRARY_CONV.search(name):
        return "<library convolution>"
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    return _ARCH_PREFIX.sub("", re.split(r"[<(]", name, maxsplit=1)[0]).strip()


#: the kinds of row whose names identify a program, by category (bits: a streaming pass records them per name)
OP, KERNEL, PYTHON = 1, 2, 4
RAW_KINDS = {"op": OP, "kernel": KERNEL, "python": PYTHON}


def category_kind(cat: str) -> int:
    """The kind (OP, KERNEL, PYTHON, or 0) of the rows of category `cat`."""
    return OP if cat in N.CPU_OP_CATS else KERNEL if cat in N.KERNEL_CATS else PYTHON if cat == "python_function" else 0


def is_module_frame(name: str) -> bool:
    """A with_modules frame (``nn.Module: Linear_0``): the only python_function names kept."""
    return _MODULE_FRAME.match(name) is not None


def _names_of(trace: RankTrace, cats: tuple[str, ...]) -> set[str]:
    codes = trace.cat_code(*cats)
    if not codes or not len(trace):
        return set()
    present = np.unique(trace.name[np.isin(trace.cat, codes)])
    return {trace.names[int(c)] for c in present if 0 <= int(c) < len(trace.names)}


def raw_names(trace: RankTrace) -> dict[str, frozenset[str]] | None:
    """A rank's names by kind ("op", "kernel", "python": module frames only), as read: from the streaming pass
    that kept a subset of the rows (`trace.seen_names`, stream/compact.py), else from the rows themselves; None
    for a streamed trace that did not record them."""
    if trace.seen_names is not None:
        return trace.seen_names
    if (trace.metadata or {}).get("streamed"):
        return None
    return {"op": frozenset(_names_of(trace, N.CPU_OP_CATS)), "kernel": frozenset(_names_of(trace, N.KERNEL_CATS)),
            "python": frozenset(f for f in _names_of(trace, ("python_function",)) if is_module_frame(f))}


def union_names(parts: list[dict[str, frozenset[str]] | None]) -> dict[str, frozenset[str]] | None:
    """The names of a rank read in parts (the windows of stream/windowed.py); None where a part's are unknown."""
    if not parts or any(p is None for p in parts):
        return None
    return {k: frozenset().union(*(p.get(k, frozenset()) for p in parts)) for k in RAW_KINDS}


def program_names(ranks: list) -> ProgramNames | None:
    """The program's names from a job's ranks (loaded traces, or the RankStubs of a streaming pass with the
    names it recorded); None where a rank's are unknown."""
    raws = [raw_names(r) if isinstance(r, RankTrace) else getattr(r, "seen_names", None) for r in ranks]
    if not raws or any(r is None for r in raws):
        return None
    modules: set[str] = set()
    raw_kernels: set[str] = set()
    ops: set[str] = set()
    for raw in raws:
        for frame in raw.get("python", ()):
            m = _MODULE_FRAME.match(frame)
            if m and m.group(1) not in WRAPPER_MODULES:
                modules.add(m.group(1))
        raw_kernels |= raw.get("kernel", frozenset())
        ops |= raw.get("op", frozenset())
    kernels = {kernel_family(k) for k in raw_kernels}
    compiled = any(_COMPILED.search(n) for n in ops | raw_kernels)
    return ProgramNames(frozenset(modules), frozenset(kernels), frozenset(ops), compiled)


def signature(names: ProgramNames | None) -> ProgramSignature | None:
    """The names as findings.json keeps them (`program`: sorted lists), so that a saved analysis can be judged
    as its trace would be."""
    if names is None:
        return None
    return ProgramSignature(modules=sorted(names.modules), kernel_families=sorted(names.kernels),
                            operators=sorted(names.ops), compiled=names.compiled)


def from_signature(sig: ProgramSignature | None) -> ProgramNames | None:
    """signature's inverse: a findings.json's `program` as the names mismatch_note compares (None: not kept)."""
    if sig is None:
        return None
    return ProgramNames(frozenset(sig.modules), frozenset(sig.kernel_families), frozenset(sig.operators), sig.compiled)


def _share(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b)


def _compiled_subset(before: ProgramNames, after: ProgramNames, basis: str) -> bool:
    """With one side compiled: whether its module classes can still tell another program. A compiled
    region records no module frames, so the compiled side's classes (without the wrappers) being a part
    of the other's is what a compiled run of the same model looks like; kernels and operators are
    renamed by the compilation and tell nothing."""
    if basis != "nn.Module classes":
        return False
    compiled, eager = (before, after) if before.compiled else (after, before)
    return not compiled.modules <= eager.modules


def mismatch_note(before: ProgramNames | None, after: ProgramNames | None) -> str | None:
    """One line when the two traces do not look like runs of one program, else None (also when they
    are too small to tell, or a side's names are unknown)."""
    if before is None or after is None:
        return None
    if len(before.modules) >= MIN_MODULES and len(after.modules) >= MIN_MODULES:
        basis, a, b, least = "nn.Module classes", before.modules, after.modules, MIN_MODULE_SHARE
    elif len(before.kernels) >= MIN_NAMES and len(after.kernels) >= MIN_NAMES:
        basis, a, b, least = "GPU kernel families", before.kernels, after.kernels, MIN_KERNEL_SHARE
    elif len(before.ops) >= MIN_NAMES and len(after.ops) >= MIN_NAMES:
        basis, a, b, least = "CPU operators", before.ops, after.ops, MIN_OP_SHARE
    else:
        return None
    share = _share(a, b)
    if share >= least or (before.compiled != after.compiled and not _compiled_subset(before, after, basis)):
        return None
    return (f"the two sides do not look like runs of the same program: they share {len(a & b)} of their "
            f"{len(a | b)} {basis} ({share:.0%}); the speedup and the findings compare two programs, "
            "not a before and an after")
