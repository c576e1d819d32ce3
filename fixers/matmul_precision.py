"""matmul-precision: a CUDA training script that keeps float32 matmuls in full FP32."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

SETTERS = {"torch.set_float32_matmul_precision"}


def _cuda_evidence(ctx: Context) -> cst.CSTNode | None:
    for n in ctx.nodes(cst.Call, cst.SimpleString):
        if isinstance(n, cst.Call):
            if h.is_method_call(n, "cuda"):
                return n
        else:
            s = h.string_value(n)
            if s is not None and (s == "cuda" or s.startswith("cuda:")):
                return n
    return None


def _training(ctx: Context) -> cst.Call | None:
    """The first `.backward()` call or `torch.optim` construction, else None."""
    for call in ctx.nodes(cst.Call):
        if h.is_method_call(call, "backward"):
            return call
        if any(q.startswith("torch.optim.") for q in ctx.qualnames(call)):
            return call
    return None


#: names whose mention means the script manages float32 precision itself: the legacy setter and
#: the newer per-backend API (torch >= 2.9: ``torch.backends.fp32_precision``,
#: ``torch.backends.cuda.matmul.fp32_precision``, ``torch.backends.cudnn[.conv|.rnn].fp32_precision``,
#: ``torch.backends.mkldnn...fp32_precision``, ``flags(fp32_precision=...)``), which must not be
#: mixed with the legacy one (later reads of ``allow_tf32`` raise RuntimeError)
PRECISION_NAMES = {"set_float32_matmul_precision", "fp32_precision"}


def _configured(ctx: Context) -> bool:
    for attr in ctx.nodes(cst.Attribute):
        if attr.attr.value == "allow_tf32" and isinstance(attr.value, cst.Attribute) and attr.value.attr.value == "matmul":
            return True
    # attribute names, keywords and plain names alike
    for name in ctx.nodes(cst.Name):
        if name.value in PRECISION_NAMES:
            return True
    for string in ctx.nodes(cst.SimpleString):  # setattr(torch.backends.cuda.matmul, "fp32_precision", ...)
        if h.string_value(string) in PRECISION_NAMES:
            return True
    return False


#: environment variables that pin numerics: cuBLAS determinism, or TF32 switched off process-wide
PINNING_ENV = {"CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE"}


def _assigned_value(ctx: Context, attr: cst.Attribute) -> cst.BaseExpression | None:
    """The value of ``<attr> = value`` (also ``a = <attr> = value``), else None."""
    target = ctx.parent(attr)
    assign = ctx.parent(target) if isinstance(target, cst.AssignTarget) and target.target is attr else None
    if isinstance(assign, cst.Assign):
        return assign.value
    if isinstance(target, cst.AnnAssign) and target.target is attr:
        return target.value
    return None


def _explicit_choice(ctx: Context) -> cst.CSTNode | None:
    """Where the file chooses full-FP32 or deterministic numerics, or sets TF32 flags in one of
    its functions (which a top-level setting would fight with), else None:

    * ``torch.backends.cudnn.allow_tf32 = False`` (any ``X.allow_tf32`` not set to a literal
      ``True``, ``setattr(X, "allow_tf32", ...)``, ``cudnn.flags(allow_tf32=False)``), and any
      ``allow_tf32`` setting inside a def;
    * ``torch.use_deterministic_algorithms(True)`` (anything but a literal ``False``),
      ``torch.backends.cudnn.deterministic = True``, ``cudnn.flags(deterministic=True)``;
    * the ``CUBLAS_WORKSPACE_CONFIG`` / ``NVIDIA_TF32_OVERRIDE`` environment variables.
    """
    found: list[cst.CSTNode] = []
    for attr in ctx.nodes(cst.Attribute):
        name = attr.attr.value
        if name == "allow_tf32":
            value = _assigned_value(ctx, attr)
            in_def = any(isinstance(a, cst.FunctionDef) for a in ctx.ancestors(attr))
            if in_def or value is None or not h.is_literal(value, True):
                found.append(attr)
        elif name == "deterministic" and h.last_name(attr.value) == "cudnn":
            value = _assigned_value(ctx, attr)
            if value is not None and not h.is_literal(value, False):
                found.append(attr)
    for call in ctx.nodes(cst.Call):
        if h.last_name(call.func) == "use_deterministic_algorithms":
            first = call.args[0].value if call.args else None
            if not h.is_literal(first, False):
                found.append(call)
        elif h.dotted(call.func) == "setattr" and len(call.args) >= 2 and h.string_value(call.args[1].value) == "allow_tf32":
            found.append(call)
        elif h.last_name(call.func) == "flags":  # with torch.backends.cudnn.flags(allow_tf32=False, deterministic=True)
            for key, pinned in (("allow_tf32", False), ("deterministic", True)):
                arg = h.kwarg(call, key)
                if arg is not None and not h.is_literal(arg.value, not pinned):
                    found.append(call)
    for string in ctx.nodes(cst.SimpleString):
        if h.string_value(string) in PINNING_ENV:
            found.append(string)
    return min(found, key=ctx.order) if found else None


def _import_block_end(module: cst.Module) -> cst.SimpleStatementLine | None:
    """The last statement of the leading run of import statements (after a docstring)."""
    last = None
    for i, stmt in enumerate(module.body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            break
        if all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            last = stmt
            continue
        if i == 0 and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            continue  # module docstring
        break
    return last


class MatmulPrecision(Fixer):
    pattern = "fp32-matmul"
    name = "matmul-precision"
    summary = "CUDA training script without a float32 matmul precision setting: enable TF32 with set_float32_matmul_precision('high')"
    explanation = """\
## What it does
For a training script (it calls `.backward()` or uses `torch.optim`) that uses CUDA (`.cuda()`,
`"cuda"`, `torch.device("cuda")`) and never sets `torch.backends.cuda.matmul.allow_tf32`, calls
`torch.set_float32_matmul_precision(...)` or uses the newer `fp32_precision` API
(`torch.backends.cuda.matmul.fp32_precision = "ieee"`, `torch.backends.fp32_precision`,
`torch.backends.cudnn.conv.fp32_precision`, ...), inserts
`torch.set_float32_matmul_precision("high")` once, after the leading imports. It needs a
top-level `import torch` (any alias) before that point; otherwise it reports only.

The setting is process-wide, so it goes only into a program's entry point: a file with an
`if __name__ == "__main__":` block, a notebook, or a script whose CUDA or training code runs at
its top level (`.cuda()`, `.to("cuda")`, `device="cuda"`, `.backward()`, an optimizer) or that
calls one of its own functions there that does CUDA or training work (`main()`, `train(args)`;
not a helper building a constant). A library module (its CUDA and
training code all in functions and classes, no `__main__` block; a top-level device constant
such as `DEVICE = "cuda" if torch.cuda.is_available() else "cpu"` runs nothing: importing it
would switch TF32 on for every program that imports it), a test
module (`test_*.py`, `*_test.py`, `conftest.py`: for the whole test run) and a file whose name
says FP32 (`benchmark_fp32.py`) are reported only.

It also reports only, and inserts nothing, when the file makes an explicit full-FP32 or
determinism choice, which TF32 would override: `torch.backends.cudnn.allow_tf32 = False` (any
`allow_tf32` not set to a literal `True`, also through `setattr` or `cudnn.flags(allow_tf32=False)`),
`torch.use_deterministic_algorithms(True)`, `torch.backends.cudnn.deterministic = True`, or the
`CUBLAS_WORKSPACE_CONFIG` / `NVIDIA_TF32_OVERRIDE` environment variables; and when one of its
functions sets a TF32 flag (`def setup_precision(): torch.backends.cudnn.allow_tf32 = ...`):
the inserted call would run before that function and be undone by it. A file that sets the
matmul precision itself anywhere, in a function or not (`set_float32_matmul_precision`,
`torch.backends.cuda.matmul.allow_tf32`, `fp32_precision`), is left alone.

## Why is this bad?
float32 matrix multiplies and convolutions then run on the plain FP32 pipeline of Ampere and
newer GPUs, several times slower than TF32 tensor cores (`fp32-matmul` in the trace: large
`sgemm`/`cutlass_80_simt` kernels instead of `tf32`/`s1688gemm` ones). TF32 keeps float32's
range with a 10-bit mantissa, which is accurate enough for training almost every model.

## Caveats
Numerics change slightly (TF32 rounding inside matmuls). A script that mentions
`fp32_precision` anywhere is left alone: it chose a precision with the new API, and PyTorch
refuses mixing that with the legacy one (a later read of `allow_tf32` may raise RuntimeError).
For code that needs full FP32 matmuls (e.g. some scientific workloads), suppress with
`# zoomer: ignore-file[fp32-matmul]` (or set `torch.backends.cuda.matmul.fp32_precision = "ieee"`).
Mixed-precision (autocast) regions are unaffected.

## Example
```python
import torch

model = Net().cuda()
```
Use instead:
```python
import torch
torch.set_float32_matmul_precision("high")

model = Net().cuda()
```
"""

    VALID = [
        'import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\nmodel = Net().cuda()\nloss.backward()\n',
        'import torch\ntorch.set_float32_matmul_precision("medium")\nmodel = Net().cuda()\nloss.backward()\n',
        # not a training script
        'import torch\nmodel = Net().cuda()\nout = model(x)\n',
        # no CUDA
        'import torch\nmodel = Net()\nloss.backward()\n',
        '# zoomer: ignore-file[fp32-matmul]\nimport torch\nmodel = Net().cuda()\nloss.backward()\n',
        # the newer fp32_precision API (torch >= 2.9) sets the precision explicitly: adding the legacy
        # setter would override "ieee" and mix the two APIs
        'import torch\n\ntorch.backends.cuda.matmul.fp32_precision = "ieee"  # exact FP32 for this solver\n'
        'torch.backends.cudnn.conv.fp32_precision = "ieee"\nmodel = Net().cuda()\nloss = model(x).sum()\nloss.backward()\n',
        'import torch\ntorch.backends.fp32_precision = "tf32"\nmodel = Net().cuda()\nloss.backward()\n',
        'import torch\nimport torch.backends.cudnn as cudnn\ncudnn.conv.fp32_precision = "tf32"\nmodel = Net().cuda()\nloss.backward()\n',
        'import torch\nsetattr(torch.backends.cuda.matmul, "fp32_precision", "ieee")\nmodel = Net().cuda()\nloss.backward()\n',
        'import torch\nmodel = Net().cuda()\nwith torch.backends.cudnn.flags(enabled=True, fp32_precision="ieee"):\n    loss = model(x).sum()\nloss.backward()\n',
        # explicit FP32 matmuls, at the top or in a function called later: left alone
        'import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\nmodel = Net().cuda()\nloss.backward()\n',
        'import torch\n\n\ndef setup_precision():\n    torch.set_float32_matmul_precision("highest")\n\n\n'
        'setup_precision()\nmodel = Net().cuda()\nloss.backward()\n',
        'import torch\nfp32_precision = "ieee"\ntorch.backends.cuda.matmul.fp32_precision = fp32_precision\nmodel = Net().cuda()\nloss.backward()\n',
    ]
    INVALID = [
        # the entry point: a __main__ block whose code is all in functions
        Example(
            'import torch\n\n\ndef main():\n    model = Net().cuda()\n    model(x).sum().backward()\n\n\n'
            'if __name__ == "__main__":\n    main()\n',
            'import torch\ntorch.set_float32_matmul_precision("high")\n\n\ndef main():\n    model = Net().cuda()\n'
            '    model(x).sum().backward()\n\n\nif __name__ == "__main__":\n    main()\n',
            message_contains="TF32",
        ),
        # a library module (transformers' trainer.py, lightning's module.py, timm.optim...): every importer
        # would get TF32; a test module: the whole test run would
        Example(
            'import torch\n\n\nclass Trainer:\n    def train(self):\n        self.model.to("cuda")\n'
            '        self.opt = torch.optim.AdamW(self.model.parameters())\n',
            None,
            message_contains="library module",
        ),
        # a helper called at the top to build a constant runs no program (torch's _dynamo/debug_utils.py)
        Example(
            'import torch\n\n\ndef _mk_defaulter(d):\n    return lambda x: d if x is None else x\n\n\n'
            '_dtype_or_default = _mk_defaulter(torch.float32)\n\n\n'
            'def repro(model, x):\n    model.cuda()\n    model(x).sum().backward()\n',
            None,
            message_contains="library module",
        ),
        # a device constant at the top of a library module (torch.testing's common_fsdp.py) runs nothing
        Example(
            'import torch\n\nDEVICE = "cuda" if torch.cuda.is_available() else "cpu"\n\n\n'
            'class Trainer:\n    def step(self, model, x):\n        model(x.to(DEVICE)).sum().backward()\n',
            None,
            message_contains="library module",
        ),
        # a script that calls its own training function at its top level
        Example(
            'import torch\n\ndevice = "cuda"\n\n\ndef train(model, x):\n    model(x.to(device)).sum().backward()\n\n\n'
            'train(Net().to(device), x)\n',
            'import torch\ntorch.set_float32_matmul_precision("high")\n\ndevice = "cuda"\n\n\n'
            'def train(model, x):\n    model(x.to(device)).sum().backward()\n\n\ntrain(Net().to(device), x)\n',
            message_contains="TF32",
        ),
        Example(
            'import torch\nmodel = Net().cuda()\nloss.backward()\n',
            None,
            message_contains="a test module",
            path="tests/test_layers.py",
        ),
        Example(
            'import torch\nmodel = Net().cuda()\nloss.backward()\n',
            None,
            message_contains="says it measures or needs full FP32",
            path="examples/benchmark_fp32.py",
        ),
        Example(
            '"""Train."""\nimport torch\nimport torch.nn as nn  # layers\n\nmodel = Net().to("cuda")\nloss.backward()\n',
            '"""Train."""\nimport torch\nimport torch.nn as nn  # layers\ntorch.set_float32_matmul_precision("high")\n\nmodel = Net().to("cuda")\nloss.backward()\n',
            message_contains="TF32",
        ),
        Example(
            'import torch as th\nopt = th.optim.SGD(model.parameters())\nx = x.cuda()\n',
            'import torch as th\nth.set_float32_matmul_precision("high")\nopt = th.optim.SGD(model.parameters())\nx = x.cuda()\n',
            message_contains="float32",
        ),
        Example(
            'from torch import nn\nmodel = nn.Linear(2, 2).cuda()\nloss.backward()\n',
            None,
            message_contains="import torch",
        ),
        # explicit full-FP32 / deterministic numerics: TF32 would override the choice
        Example(
            'import torch\ntorch.backends.cudnn.allow_tf32 = False\nmodel = Net().cuda()\nloss.backward()\n',
            None,
            message_contains="explicit FP32/determinism choice",
        ),
        Example(
            'import torch\ntorch.use_deterministic_algorithms(True)\nmodel = Net().cuda()\nloss.backward()\n',
            None,
            message_contains="use_deterministic_algorithms",
        ),
        Example(
            'import torch\nfrom torch.backends.cuda import matmul\nmatmul.allow_tf32 = False\nmodel = Net().cuda()\nloss.backward()\n',
            None,
            message_contains="explicit FP32/determinism choice",
        ),
        Example(
            'import os\nimport torch\nos.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"\nmodel = Net().cuda()\nloss.backward()\n',
            None,
            message_contains="CUBLAS_WORKSPACE_CONFIG",
        ),
        # a function of the file sets TF32 flags after the point of insertion: it would undo the call
        Example(
            'import torch\n\n\ndef setup_precision(args):\n    torch.backends.cudnn.allow_tf32 = args.tf32\n\n\n'
            'setup_precision(args)\nmodel = Net().cuda()\nloss.backward()\n',
            None,
            message_contains="sets TF32 flags",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        evidence = _cuda_evidence(ctx)
        training = _training(ctx) if evidence is not None else None
        if evidence is None or training is None or _configured(ctx):
            return
        line = ctx.pos(evidence).start.line
        message = f"CUDA training script (CUDA at line {line}) never enables TF32: float32 matmuls run on the slow full-FP32 path"
        anchor = _import_block_end(ctx.module)
        alias = ctx.torch_alias()
        where = _not_the_program(ctx, training)
        if where is not None:
            yield self.report(anchor or evidence, message + f"; not changed: {where}")
            return
        choice = _explicit_choice(ctx)
        if choice is not None:
            # flagged where the call would go (as the other findings), the choice named in the message
            text = ctx.code(choice)
            text = text if len(text) <= 50 else text[:47] + "..."
            yield self.report(
                anchor or evidence,
                message + f"; not changed: the file makes an explicit FP32/determinism choice or sets TF32 flags itself"
                f" (`{text}` at line {ctx.pos(choice).start.line}), which enabling TF32 would override",
            )
            return
        if anchor is None or alias is None or not _imports_torch_before(ctx, anchor, alias):
            yield self.report(anchor or evidence, message + _where_to_call(ctx))
            return
        new = h.simple_stmt(f'{alias}.set_float32_matmul_precision("high")\n')
        yield self.replace(anchor, message + f'; call {alias}.set_float32_matmul_precision("high")', h.insert_after(anchor, [new]))


def _not_the_program(ctx: Context, training: cst.CSTNode) -> str | None:
    """Why the setting does not belong in this file, else None. It is process-wide: a test module
    would switch it on for the whole test run, a library module (no `__main__` block, its CUDA and
    training code all in functions and classes, at most a device constant and no call of its own
    functions at its top level) for every program that imports it, and a file whose
    name says FP32 (`benchmark_fp32.py`) measures or needs full FP32."""
    name = ctx.path.replace("\\", "/").rsplit("/", 1)[-1].lower()
    if ctx.test_module():
        return "a test module (the setting would hold for every test run in the same process)"
    if "fp32" in name or "float32" in name:
        return f"the file's name ({name}) says it measures or needs full FP32"
    if not (ctx.script_like(training) or _runs_on_cuda_at_top(ctx) or _calls_own_function_at_top(ctx)):
        return ("the file reads like a library module (no `if __name__ == \"__main__\":` block; its CUDA and training "
                "code all in functions): importing it would switch TF32 on for every program that does; "
                "set it in the program's entry point")
    return None


def _top_level(ctx: Context, node: cst.CSTNode) -> bool:
    return not any(isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) for a in ctx.ancestors(node))


def _runs_on_cuda_at_top(ctx: Context) -> bool:
    """A notebook, a ``__main__`` block, or CUDA work outside every function and class: a
    ``.cuda()`` call, ``.to("cuda")`` or ``device="cuda"``. A ``"cuda"`` string that only names a
    device (``DEVICE = "cuda" if ... else "cpu"``, a list of device types, ``torch.device("cuda")``,
    test metadata such as ``DecorateInfo(..., device_type="cuda")``) runs nothing: library modules
    define such constants."""
    if ctx.script_like():
        return True
    for n in ctx.nodes(cst.Call, cst.SimpleString):
        if isinstance(n, cst.Call):
            if h.is_method_call(n, "cuda") and _top_level(ctx, n):
                return True
            continue
        s = h.string_value(n)
        if s is None or not (s == "cuda" or s.startswith("cuda:")) or not _top_level(ctx, n):
            continue
        arg = ctx.parent(n)
        call = ctx.parent(arg) if isinstance(arg, cst.Arg) else None
        if not isinstance(call, cst.Call) or not isinstance(arg, cst.Arg):
            continue
        if (arg.keyword is not None and arg.keyword.value == "device") or (arg.keyword is None and h.is_method_call(call, "to")):
            return True
    return False


def _calls_own_function_at_top(ctx: Context) -> bool:
    """A statement outside every function and class that calls a function of this file which
    does CUDA or training work, itself or through the file's other functions (``main()``,
    ``train(args)``, ``losses = train()``): the file runs its program as it runs. A helper that
    builds a constant (``_dtype_or_default = _mk_defaulter(torch.float32)`` in torch's
    debug_utils.py) runs no program."""
    defined = {s.name.value: s for s in ctx.module.body if isinstance(s, cst.FunctionDef)}
    for stmt in ctx.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            value = small.value if isinstance(small, (cst.Expr, cst.Assign, cst.AnnAssign)) else None
            if (isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in defined
                    and _does_work(ctx, defined, defined[value.func.value], set())):
                return True
    return False


def _does_work(ctx: Context, defined: dict[str, cst.FunctionDef], fn: cst.FunctionDef, seen: set[str]) -> bool:
    """``fn`` runs CUDA or training code (``.cuda()``, a ``"cuda"`` string, ``.backward()``, a
    ``torch.optim`` optimizer), itself or through the file's functions it calls by name."""
    if fn.name.value in seen:
        return False
    seen.add(fn.name.value)
    for n in h.walk(fn):
        if isinstance(n, cst.SimpleString):
            s = h.string_value(n)
            if s is not None and (s == "cuda" or s.startswith("cuda:")):
                return True
        elif isinstance(n, cst.Call):
            if h.is_method_call(n, ("cuda", "backward")) or any(q.startswith("torch.optim.") for q in ctx.qualnames(n)):
                return True
            if isinstance(n.func, cst.Name) and n.func.value in defined and _does_work(ctx, defined, defined[n.func.value], seen):
                return True
    return False


def _torch_import(ctx: Context) -> tuple[cst.Import, str] | None:
    """The file's first ``import torch`` (or ``import torch as th``), wherever it is, and the name it
    binds."""
    found = []
    for imp in ctx.nodes(cst.Import):
        for a in imp.names:
            if ctx.code(a.name) != "torch":
                continue
            if a.asname is None:
                found.append((imp, "torch"))
            elif isinstance(a.asname.name, cst.Name):
                found.append((imp, a.asname.name.value))
    return min(found, key=lambda f: ctx.order(f[0])) if found else None


def _where_to_call(ctx: Context) -> str:
    """What the user should do where the call cannot go after the file's leading imports: add
    ``import torch`` when the file has none; else put the call right after the import it has, which
    comes after other code (the insertion point is the end of the leading imports) or inside a
    function or block."""
    found = _torch_import(ctx)
    if found is None:
        return '; add `import torch` and `torch.set_float32_matmul_precision("high")` after the imports'
    imp, name = found
    line = ctx.pos(imp).start.line
    call = f'`{name}.set_float32_matmul_precision("high")`'
    function = next((a for a in ctx.ancestors(imp) if isinstance(a, cst.FunctionDef)), None)
    if function is not None:
        where = f"inside `{function.name.value}()`"
    elif any(isinstance(a, cst.BaseCompoundStatement) for a in ctx.ancestors(imp)):
        where = "inside a block, not at the file's top level"
    else:
        where = "after other code (the call is inserted only after the imports the file begins with)"
    return f"; not changed: torch is imported at line {line}, {where}: add {call} right after that import"


def _imports_torch_before(ctx: Context, anchor: cst.SimpleStatementLine, alias: str) -> bool:
    for stmt in ctx.module.body:
        for small in getattr(stmt, "body", ()):
            if isinstance(small, cst.Import):
                for a in small.names:
                    bound = a.asname.name.value if a.asname is not None and isinstance(a.asname.name, cst.Name) else None
                    if ctx.code(a.name) == "torch" and (bound or "torch") == alias:
                        return True
        if stmt is anchor:
            return False
    return False
