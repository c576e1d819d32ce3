"""cpu-autocast: a CPU training step whose matmuls all run in float32."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

ACCELERATORS = ("cuda", "mps", "xpu", "xla", "hpu", "npu", "mtia", "tpu")
#: names whose presence means precision is already managed somewhere in the file
PRECISION = {"autocast", "GradScaler", "set_float32_matmul_precision", "fp32_precision", "allow_tf32",
             "bfloat16", "float16", "half", "amp"}
MODEL_WORDS = ("model", "net", "encoder", "decoder", "backbone", "module")
MATMUL_CALLS = {"torch.matmul", "torch.mm", "torch.bmm", "torch.einsum", "torch.nn.functional.linear", "torch.addmm"}


def _accelerator_evidence(ctx: Context) -> bool:
    for n in ctx.nodes(cst.SimpleString):
        s = (h.string_value(n) or "").strip().lower()
        if s.split(":")[0] in ACCELERATORS:
            return True
    for n in ctx.nodes(cst.Attribute):
        if n.attr.value in ACCELERATORS or n.attr.value in ("is_available", "device_count"):
            return True
    for c in ctx.nodes(cst.Call):
        if h.is_method_call(c, ACCELERATORS):
            return True
    return False


def _cpu_evidence(ctx: Context) -> cst.CSTNode | None:
    """A "cpu" device spelled out: torch.device("cpu"), device = "cpu", device="cpu"."""
    for n in ctx.nodes(cst.SimpleString):
        if (h.string_value(n) or "").strip().lower() != "cpu":
            continue
        p = ctx.parent(n)
        if isinstance(p, cst.Arg):
            call = ctx.parent(p)
            if p.keyword is not None and p.keyword.value == "device":
                return n
            if isinstance(call, cst.Call) and (h.dotted(call.func) or "").split(".")[-1] == "device":
                return n
        if isinstance(p, cst.Assign) and any("device" in (h.dotted(t.target) or "").lower() for t in p.targets):
            return n
    return None


def _managed(ctx: Context) -> bool:
    for n in ctx.nodes(cst.Name):
        if n.value in PRECISION:
            return True
    for n in ctx.nodes(cst.Attribute):
        if n.attr.value in PRECISION:
            return True
    return False


def _training(ctx: Context) -> bool:
    for call in ctx.nodes(cst.Call):
        if h.is_method_call(call, "backward"):
            return True
    return False


def _single_assign(stmt: cst.CSTNode) -> cst.Assign | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        return stmt.body[0]
    return None


def _targets(assign: cst.Assign) -> set[str]:
    out: set[str] = set()
    for t in assign.targets:
        out.update(h.target_names(t.target))
    return out


def _reads(node: cst.CSTNode) -> set[str]:
    """Variable names mentioned in ``node`` (attribute names and keywords excluded)."""
    skip: set[int] = set()
    out: set[str] = set()
    for n in h.walk(node, into_scopes=False):
        if isinstance(n, cst.Attribute):
            skip.add(id(n.attr))
        elif isinstance(n, cst.Arg) and n.keyword is not None:
            skip.add(id(n.keyword))
        elif isinstance(n, cst.Name) and id(n) not in skip:
            out.add(n.value)
    return out


class CpuAutocast(Fixer):
    pattern = "fp32-matmul"
    name = "cpu-autocast"
    opt_in = True
    summary = "CPU training step with float32 matmuls: run the forward pass and loss under torch.autocast('cpu', dtype=torch.bfloat16)"
    explanation = """\
## What it does
For a training script that runs on the CPU (a `"cpu"` device is spelled out: `torch.device("cpu")`,
`device = "cpu"`, `device="cpu"`; no CUDA/MPS/XPU/XLA/HPU/NPU anywhere in the file) and does not
manage precision already (no `autocast`, `GradScaler`, `bfloat16`/`float16`/`half`,
`set_float32_matmul_precision`, `fp32_precision`), finds each `loss.backward()` and the statements
that compute `loss` right before it: the run of consecutive plain assignments that ends with
`loss = ...` and feeds it, starting at the forward call (`model(x)`, `self.net(x)`, a matmul). It
wraps that run, and only that run, in `with torch.autocast("cpu", dtype=torch.bfloat16):`. The
backward pass, the optimizer step and the parameters stay float32. It needs a top-level
`import torch` (any alias); without one, or when the forward statements cannot be delimited, it
reports only.

## Why is this bad?
float32 GEMMs (`aten::addmm`/`aten::mm` with float inputs: `fp32-matmul` in the trace) use the
plain FP32 path. On CPUs with native bfloat16 (AVX512_BF16, AMX: Intel Cooper Lake, Sapphire
Rapids and newer, AMD Zen 4 and newer) bf16 GEMMs under autocast run several times faster;
autocast keeps precision-sensitive ops (losses, softmax, reductions) in float32.

## Why it is opt-in
Whether bf16 pays off on a CPU depends on the CPU, which the trace does not record: with
AVX512_BF16 or AMX the GEMMs run natively and faster; without them they are emulated, and on
this project's 2-core Xeon (AVX-512, no AVX512_BF16/AMX) the step took about twice as long
(docs/verified-fixes.md). `analyze --source` therefore leaves it out of `patch.diff` unless it
is asked for (`--fix-select cpu-autocast`) or the capture helper's `job.json` records a CPU with
native bf16 (`cpu.native_bf16`, from the `avx512_bf16`/`amx_bf16`/`bf16` CPU flags);
`zoomer-ar fix --select cpu-autocast` applies it.

## Caveats
Numerics change: bf16 keeps 8 bits of mantissa inside the autocast region (that is the fix; the
loss and the parameters stay float32). On CPUs **without** native bf16 the bf16 GEMMs are
emulated and can be slower than float32: measure before keeping the change. The TF32-style
alternative on recent PyTorch, `torch.backends.mkldnn.matmul.fp32_precision = "bf16"`, keeps
float32 tensors (the trace still shows float GEMMs) and does nothing on CPUs without bf16.
Values computed in the region (the logits) become bf16 tensors; code that later stores them
keeps bf16 copies.

## Example
```python
import torch

device = torch.device("cpu")

def train_step(model, opt, x, y):
    out = model(x)
    loss = F.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
```
Use instead:
```python
def train_step(model, opt, x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        loss = F.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
```
"""

    VALID = [
        # a CUDA script: matmul-precision's business
        'import torch\ndevice = torch.device("cuda")\n\ndef step(model, x):\n    loss = model(x).sum()\n    loss.backward()\n',
        # precision already managed
        'import torch\ndevice = torch.device("cpu")\n\ndef step(model, x):\n    with torch.autocast("cpu", dtype=torch.bfloat16):\n        loss = model(x).sum()\n    loss.backward()\n',
        'import torch\ndevice = "cpu"\nmodel = model.to(torch.bfloat16)\n\ndef step(x):\n    loss = model(x).sum()\n    loss.backward()\n',
        # not a training script
        'import torch\ndevice = torch.device("cpu")\nout = model(x)\n',
        # no device spelled out: could run anywhere
        'import torch\n\ndef step(model, x):\n    loss = model(x).sum()\n    loss.backward()\n',
        '# zoomer: ignore-file[fp32-matmul]\nimport torch\ndevice = "cpu"\n\ndef step(model, x):\n    loss = model(x).sum()\n    loss.backward()\n',
    ]
    INVALID = [
        Example(
            'import torch\nimport torch.nn.functional as F\n\n\ndef train_step(model, opt, x, y):\n'
            '    # forward\n    out = model(x)\n    loss = F.cross_entropy(out, y)  # mean\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n'
            '\n\ndevice = torch.device("cpu")\n',
            'import torch\nimport torch.nn.functional as F\n\n\ndef train_step(model, opt, x, y):\n'
            '    # forward\n    with torch.autocast("cpu", dtype=torch.bfloat16):\n        out = model(x)\n        loss = F.cross_entropy(out, y)  # mean\n'
            '    opt.zero_grad()\n    loss.backward()\n    opt.step()\n'
            '\n\ndevice = torch.device("cpu")\n',
            message_contains="autocast",
        ),
        Example(
            'import torch as th\n\nfor x, y in data:\n    x = x.to(device="cpu")\n    h = net(x)\n    loss = (h - y).pow(2).mean()\n    loss.backward()\n',
            'import torch as th\n\nfor x, y in data:\n    x = x.to(device="cpu")\n    with th.autocast("cpu", dtype=th.bfloat16):\n        h = net(x)\n        loss = (h - y).pow(2).mean()\n    loss.backward()\n',
            message_contains="bfloat16",
        ),
        # the loss is not computed next to its backward: report only
        Example(
            'import torch\ndevice = torch.device("cpu")\n\ndef step(loss):\n    loss.backward()\n',
            None,
            message_contains="float32",
        ),
        Example(
            'from torch import nn\ndevice = "cpu"\n\ndef step(model, x):\n    loss = model(x).sum()\n    loss.backward()\n',
            None,
            message_contains="import torch",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        if not _training(ctx) or _managed(ctx) or _accelerator_evidence(ctx) or _cpu_evidence(ctx) is None:
            return
        alias = ctx.torch_alias()
        base = "float32 matmuls in a CPU training step: run the forward pass and the loss under torch.autocast(\"cpu\", dtype=torch.bfloat16)"
        done: set[int] = set()
        for call in ctx.nodes(cst.Call):
            if not h.is_method_call(call, "backward"):
                continue
            receiver = h.method(call)[0]  # type: ignore[index]
            run = self._forward_run(ctx, call, receiver)
            if run is None:
                yield self.report(call, base + " (the statements computing the loss are not right before its backward; wrap the forward pass by hand)")
                continue
            if id(run[0]) in done:
                continue
            done.add(id(run[0]))
            if alias is None:
                yield self.report(run[0], base + " (needs `import torch`)")
                continue
            with_stmt = cst.With(
                items=[cst.WithItem(item=cst.parse_expression(f'{alias}.autocast("cpu", dtype={alias}.bfloat16)'))],
                body=cst.IndentedBlock(body=[run[0].with_changes(leading_lines=[]), *run[1:]]),
                leading_lines=run[0].leading_lines,
            )
            changes: dict = {run[0]: with_stmt}
            for stmt in run[1:]:
                changes[stmt] = cst.RemovalSentinel.REMOVE
            yield self.replace(run[0], base + "; parameters, gradients and the optimizer stay float32", changes)

    @staticmethod
    def _forward_run(ctx: Context, backward: cst.Call, receiver: cst.CSTNode) -> list[cst.SimpleStatementLine] | None:
        if not isinstance(receiver, cst.Name):
            return None
        expr = ctx.parent(backward)
        line = ctx.parent(expr) if isinstance(expr, cst.Expr) else None
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return None
        where = ctx.block_of(line)
        if where is None:
            return None
        block, k = where
        body = list(block.body)  # type: ignore[attr-defined]
        loss_at = None
        for i in range(k - 1, -1, -1):
            stmt = body[i]
            assign = _single_assign(stmt)
            if assign is not None and receiver.value in _targets(assign):
                loss_at = i
                break
            if receiver.value in _reads(stmt) or not isinstance(stmt, cst.SimpleStatementLine):
                return None
        if loss_at is None:
            return None
        run = [body[loss_at]]
        needed = _reads(body[loss_at])
        i = loss_at - 1
        while i >= 0:
            assign = _single_assign(body[i])
            if assign is None or not (_targets(assign) & needed):
                break
            run.insert(0, body[i])
            needed |= _reads(assign.value)
            i -= 1
        # start at the first statement that runs the forward pass
        while run and not CpuAutocast._forward(ctx, run[0]):
            run.pop(0)
        if not run:
            return None
        return run

    @staticmethod
    def _forward(ctx: Context, stmt: cst.CSTNode) -> bool:
        for n in h.walk(stmt, into_scopes=False):
            if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.MatrixMultiply):
                return True
            if isinstance(n, cst.Call):
                d = h.dotted(n.func) or ""
                last = d.split(".")[-1].lower()
                if any(w in last for w in MODEL_WORDS) or (d.startswith("self.") and d.count(".") == 1):
                    return True
                if ctx.matches(n, MATMUL_CALLS, MATMUL_CALLS | {"F.linear"}):
                    return True
        return False
