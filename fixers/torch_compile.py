"""torch-compile (opt-in): an eager nn.Module that could be compiled."""

from __future__ import annotations

import re
from typing import Iterable

import libcst as cst

from zoomer_ar.fix import flow
from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

MODULE_BASES = {"torch.nn.Module", "torch.nn.modules.module.Module"}
MODULE_BASES_BARE = {"nn.Module", "torch.nn.Module", "Module"}
CHAIN_METHODS = {"to", "cuda", "train", "half", "float", "bfloat16", "to_empty"}
MODEL_FACTORIES_PREFIX = ("torchvision.models.", "timm.create_model", "transformers.AutoModel")


def _module_classes(ctx: Context) -> set[str]:
    """Names of classes defined in this file that derive (transitively) from nn.Module."""
    classes = {c.name.value: c for c in ctx.nodes(cst.ClassDef)}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, cls in classes.items():
            if name in found:
                continue
            for base in cls.bases:
                if base.keyword is not None:
                    continue
                if ctx.matches(base.value, MODULE_BASES, MODULE_BASES_BARE) or h.dotted(base.value) in found:
                    found.add(name)
                    changed = True
                    break
    return found


#: torch.nn containers whose construction is a whole model (``model = nn.Sequential(...)``)
NN_CONTAINERS = {"torch.nn.Sequential", "torch.nn.modules.container.Sequential"}
NN_CONTAINERS_BARE = {"nn.Sequential", "torch.nn.Sequential"}


def _builds_module(ctx: Context, call: cst.Call, modules: set[str], factories: set[str]) -> bool:
    """``call`` constructs an nn.Module: a subclass defined in this file, an ``nn.Sequential``,
    a model factory (torchvision/timm/transformers) or a function of this file that returns one."""
    if ctx.matches(call, NN_CONTAINERS, NN_CONTAINERS_BARE):
        return True
    names = ctx.qualnames(call.func)
    return any(q in modules or q in factories or q.startswith(MODEL_FACTORIES_PREFIX) for q in names)


def _module_factories(ctx: Context, modules: set[str]) -> set[str]:
    """Names of module-level functions of this file that return an nn.Module: annotated
    ``-> nn.Module`` (or a module class of the file), or whose every ``return`` gives one
    (``return nn.Sequential(...)``, ``return Net(...)``, another such function's result)."""
    fns = [s for s in ctx.module.body if isinstance(s, cst.FunctionDef) and s.asynchronous is None]
    found: set[str] = set()
    for fn in fns:
        ann = fn.returns.annotation if fn.returns is not None else None
        if ann is not None and (ctx.matches(ann, MODULE_BASES, MODULE_BASES_BARE) or h.dotted(ann) in modules):
            found.add(fn.name.value)
    changed = True
    while changed:
        changed = False
        for fn in fns:
            if fn.name.value in found or fn.returns is not None:
                continue
            values = [n.value for n in h.walk(fn.body, into_scopes=False) if isinstance(n, cst.Return)]
            if values and all(v is not None and (c := _constructor(v)) is not None and _builds_module(ctx, c, modules, found)
                              for v in values):
                found.add(fn.name.value)
                changed = True
    return found


def _inside_builder(ctx: Context, node: cst.CSTNode, factories: set[str]) -> bool:
    """``node`` is in a class body or method, or in a function that builds and returns the model
    (compiling there too would compile the model twice)."""
    for anc in ctx.ancestors(node):
        if isinstance(anc, cst.ClassDef) or (isinstance(anc, cst.FunctionDef) and anc.name.value in factories):
            return True
    return False


#: calls that script, trace or export a module: ``torch.jit.script`` of a compiled module fails, and
#: the others would trace or export the compile wrapper instead of the model
SCRIPTING = {f"torch.jit.{n}" for n in ("script", "trace", "trace_module", "freeze", "optimize_for_inference")} | {
    "torch.export.export", "torch.onnx.export", "torch.fx.symbolic_trace", "torch.fx.Tracer.trace",
}


def _name_in(node: cst.CSTNode, name: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == name for n in h.walk(node))


def _left_to_others(ctx: Context, assign: cst.Assign, target: str, built: list[cst.Call]) -> str | None:
    """Why ``target`` (a module just built by ``assign``) is not compiled where it is built, else
    None: its scope (code after the assignment, outside nested functions) scripts, traces or
    exports it (the reason is reported: compiling first breaks that call), returns it (the function
    is the model's builder: its caller owns the model; "" is returned, nothing reported) or builds
    another model from it (``s = nn.Sequential(n, n)``: the outer model is compiled; "")."""
    scope = ctx.enclosing_scope(assign)
    after = ctx.order(assign)
    for n in h.walk(scope, into_scopes=False):
        if ctx.order(n) <= after:
            continue
        if isinstance(n, cst.Call) and any(_name_in(a.value, target) for a in n.args):
            if ctx.matches(n, SCRIPTING, SCRIPTING):
                return f"it is passed to {ctx.code(n.func)}(), which fails on (or traces) a compiled module"
            if any(c is n for c in built):
                return ""
        elif isinstance(n, cst.Return) and isinstance(scope, cst.FunctionDef) and n.value is not None:
            value = n.value
            elements = [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
            if any(isinstance(e, cst.Name) and e.value == target for e in elements):
                return ""
    return None


#: methods whose result names the module's parameters, buffers or submodules: a compiled module
#: answers with an `_orig_mod.` prefix (so checkpoints saved or loaded through it stop matching)
OBSERVING_METHODS = {"state_dict", "load_state_dict", "named_parameters", "named_buffers", "named_modules",
                     "named_children", "modules", "children", "register_module", "add_module", "get_submodule",
                     "get_parameter", "get_buffer", "__class__", "__dict__"}
#: builtins that see the wrapper itself: its type, or it stored as some object's attribute
OBSERVING_BUILTINS = {"isinstance", "type", "setattr", "vars", "id"}
#: calls that pickle the object they are given: a compiled module is saved as its wrapper
PICKLING = {"torch.save", "pickle.dump", "pickle.dumps", "dill.dump", "dill.dumps", "cloudpickle.dump",
            "cloudpickle.dumps", "joblib.dump"}
#: words of a callee's name saying it traces, captures or exports the module it is given
#: (torch.export's aot_export, dynamo's fullgraph_capture, fx.GraphModule(root, graph)...)
TRACING_WORDS = frozenset({"trace", "traced", "tracer", "capture", "export", "script", "symbolic", "graphmodule", "jit"})


def _uses(ctx: Context, assign: cst.Assign, target: str) -> list[cst.Name]:
    """The reads of ``target`` that can see the module ``assign`` built: after the assignment
    in its function (nested functions included), or, for a module-level model, anywhere in the
    file (functions defined earlier may run later)."""
    scope = ctx.enclosing_scope(assign)
    after = ctx.order(assign)
    line = ctx.statement(assign)
    out = []
    for n in ctx.nodes(cst.Name):
        if n.value != target or (line is not None and ctx.contains(line, n)) or flow.is_store(ctx, n):
            continue
        p = ctx.parent(n)
        if isinstance(p, cst.Attribute) and p.attr is n or isinstance(p, cst.Arg) and p.keyword is n:
            continue
        if scope is ctx.module or (ctx.contains(scope, n) and ctx.order(n) > after):
            out.append(n)
    return out


def _observes_wrapper(ctx: Context, use: cst.Name) -> str | None:
    """How ``use`` would tell a compiled module from the model: ``model.state_dict()`` (keys gain
    `_orig_mod.`), ``model.attr = ...`` (set on the wrapper, not the model), ``isinstance(model,
    Net)``, ``setattr(parent, "sub", model)``, or ``model`` handed to a call that traces or
    exports it (``aot_export(model, ...)``, ``fx.GraphModule(model, graph)``); None otherwise."""
    p = ctx.parent(use)
    if isinstance(p, cst.Attribute) and p.value is use:
        if p.attr.value in OBSERVING_METHODS:
            return f"`{ctx.code(p)}` sees the compile wrapper (its names gain an `_orig_mod.` prefix)"
        if isinstance(ctx.parent(p), cst.AssignTarget) or isinstance(ctx.parent(p), (cst.AugAssign, cst.Del)):
            return f"`{ctx.code(p)}` would be set on the compile wrapper, not on the model"
        return None
    holder = p
    while isinstance(holder, (cst.Element, cst.List, cst.Tuple, cst.DictElement, cst.Dict)):
        holder = ctx.parent(holder)
    call = ctx.parent(holder) if isinstance(holder, cst.Arg) else None
    if not isinstance(call, cst.Call):
        return None
    callee = h.dotted(call.func) or ""
    last = callee.rsplit(".", 1)[-1]
    if ctx.matches(call, {f"builtins.{b}" for b in OBSERVING_BUILTINS}, OBSERVING_BUILTINS):
        return f"`{last}(...)` sees the compile wrapper, not the model"
    if ctx.matches(call, PICKLING, PICKLING):
        return (f"`{callee}(...)` would pickle the compile wrapper: whoever loads the file gets an OptimizedModule "
                "(not the model's class; its names gain an `_orig_mod.` prefix)")
    words = {w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", last)} | {last.lower()}
    if words & TRACING_WORDS:
        return f"it is handed to {callee}(), which traces or exports the module it is given"
    return None


def _constructor(value: cst.BaseExpression) -> cst.Call | None:
    """``Net(...)`` in ``Net(...)``, ``Net(...).to(dev)``, ``Net().cuda().train()``."""
    while isinstance(value, cst.Call):
        m = h.method(value)
        if m is not None and m[1] in CHAIN_METHODS and isinstance(m[0], cst.Call):
            value = m[0]
            continue
        return value
    return None


class TorchCompile(Fixer):
    pattern = "launch-bound"
    name = "torch-compile"
    opt_in = True
    summary = "model built from an nn.Module and run eagerly: compile it with torch.compile"
    explanation = """\
## What it does
After `model = Net(...)` (optionally `.to(device)`/`.cuda()`), where `Net` is an `nn.Module`
subclass defined in the same file or a `torchvision.models` / `timm.create_model` factory, adds
`model = torch.compile(model)`. Files that already call `torch.compile` are left alone, and so is
a module that its function returns (the function builds the model: its caller owns it) or that
becomes part of a bigger model built after it (`nn.Sequential(block, block)`: the bigger one is
compiled). A module that is then passed to `torch.jit.script`/`trace`/`freeze`/
`optimize_for_inference`, `torch.export.export`, `torch.onnx.export` or `torch.fx.symbolic_trace`
is reported, not changed: scripting fails on a compiled module and the others would trace the
compile wrapper. So is a module that the code after it would tell from its compile wrapper: it
reads `state_dict()`/`load_state_dict()`/`named_parameters()`... (the names gain an `_orig_mod.`
prefix: a checkpoint stops loading), sets an attribute on it (set on the wrapper, not the
model), passes it to `isinstance`/`type`/`setattr`, pickles it whole (`torch.save(model, path)`,
`pickle.dump`: the file would hold the wrapper), or hands it to a call whose name says it
traces, captures or exports (`aot_export`, `fullgraph_capture`, `fx.GraphModule`). A module that
nothing in the file uses after building it (one made for other modules to import) is left
alone: it is not run here, and its importers would get the wrapper.
**Opt-in**: reported by default, rewritten only when selected explicitly
(`--select torch-compile` or `--select launch-bound`).

## Why is this bad?
In eager mode every operator is a separate kernel launch from Python. Models made of many
small operators spend more time launching than computing: the GPU waits for the CPU
(`launch-bound` in the trace: short kernels separated by gaps, the CPU thread busy in
`cudaLaunchKernel`). `torch.compile` fuses operators into fewer, larger kernels (and can use
CUDA graphs with `mode="reduce-overhead"`).

## Caveats
Compilation takes time on the first steps and on shape changes; the compiled module's
`state_dict()` keys gain an `_orig_mod.` prefix (save `model._orig_mod` or strip the prefix
when checkpointing); some code (graph breaks, dynamic control flow) compiles poorly. That is
why the fix is opt-in. With DDP, compile the DDP-wrapped model.

## Example
```python
model = Net().to(device)
```
Use instead:
```python
model = Net().to(device)
model = torch.compile(model)
```
"""

    VALID = [
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    pass\nmodel = Net()\nmodel = torch.compile(model)\n",
        "import torch\nmodel = Net()\n",  # Net is not known to be a module
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    pass\nmodel = Net()  # zoomer: ignore[launch-bound]\n",
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    pass\nnet = Net()\nopt = torch.compile(net, mode='max-autotune')\n",
        # a container built inside a module's own __init__ or inside the model's builder is left
        # to the statement that builds the model
        "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        body = nn.Sequential(nn.Linear(4, 4))\n        self.body = body\n",
        "import torch\nfrom torch import nn\n\n\ndef build() -> nn.Module:\n    net = nn.Sequential(nn.Linear(4, 4))\n"
        "    net = torch.compile(net)\n    return net\n\n\nmodel = build()\n",
        "import torch\n\n\ndef build():\n    return make_layers()\n\n\nmodel = build()\n",  # nothing says build() is a module
        # a model made for other modules to import, not run here (torch's _export/db/examples)
        "import torch\n\n\nclass AssumeConstantResult(torch.nn.Module):\n    def forward(self, x, y):\n        return x[: y.item()]\n\n\n"
        "example_args = (torch.randn(3, 2), torch.tensor(4))\nmodel = AssumeConstantResult()\n",
        # a function that builds and returns modules (in a tuple): its caller owns them
        "import torch\nfrom torch import nn\n\n\nclass Layer(nn.Module):\n    pass\n\n\n"
        "def create_nets():\n    layer = Layer()\n    head = nn.Sequential(nn.Linear(4, 2))\n    return layer, head\n",
    ]
    INVALID = [
        # code that would see the wrapper instead of the model: state_dict keys gain `_orig_mod.`
        # (a checkpoint stops loading), an attribute set on it misses the model, isinstance/setattr
        # see the wrapper, a tracer or exporter would trace it (torch's n_shadows_utils.py, _trace.py)
        Example(
            "import torch\nfrom torch import nn\n\n\ndef main(path):\n    model = nn.Sequential(nn.Linear(4, 4))\n"
            "    model.load_state_dict(torch.load(path))\n    train(model)\n",
            None,
            message_contains="_orig_mod",
        ),
        Example(
            "import torch\nfrom torch import nn\n\n\nclass Logger(nn.Module):\n    pass\n\n\n"
            "def add_logger(mt, name):\n    logger = Logger()\n    setattr(mt, name, logger)\n\n\n"
            "def export(mod, args):\n    wrapped = Logger()\n    wrapped.inner = mod\n    return aot_export(wrapped, args)\n\n\n"
            "def run(x):\n    net = Logger()\n    return fullgraph_capture(net, x)\n",
            None,
            message_contains="not changed",
        ),
        Example(
            "import torch\nimport torch.nn as nn\n\n\nclass Net(nn.Module):\n    pass\n\n\nmodel = Net().to(device)\nopt = make_opt(model)\n",
            "import torch\nimport torch.nn as nn\n\n\nclass Net(nn.Module):\n    pass\n\n\nmodel = Net().to(device)\nmodel = torch.compile(model)\nopt = make_opt(model)\n",
            message_contains="torch.compile",
        ),
        Example(
            "import torch\nimport torchvision\n\ndef main():\n    net = torchvision.models.resnet50(weights=None).cuda()  # backbone\n    train(net)\n",
            "import torch\nimport torchvision\n\ndef main():\n    net = torchvision.models.resnet50(weights=None).cuda()  # backbone\n    net = torch.compile(net)\n    train(net)\n",
            message_contains="eager",
        ),
        Example(
            "from torch import nn\nclass Net(nn.Module):\n    pass\nmodel = Net()\ntrain(model)\n",
            None,
            message_contains="import torch",
        ),
        Example(  # a builder function of the file, annotated as returning a module
            "import torch\nfrom torch import nn\n\n\ndef build_model(layers: int) -> nn.Module:\n"
            "    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(layers)])\n\n\n"
            "def main():\n    model = build_model(4).to('cuda')\n    train(model)\n",
            "import torch\nfrom torch import nn\n\n\ndef build_model(layers: int) -> nn.Module:\n"
            "    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(layers)])\n\n\n"
            "def main():\n    model = build_model(4).to('cuda')\n    model = torch.compile(model)\n    train(model)\n",
            message_contains="eager",
        ),
        Example(  # a builder without annotation that returns a container; a container built in place
            "import torch\nimport torch.nn as nn\n\n\ndef make():\n    return nn.Sequential(nn.Linear(8, 8))\n\n\n"
            "net = make()\nhead = nn.Sequential(nn.Linear(8, 2))\nfit(net, head)\n",
            "import torch\nimport torch.nn as nn\n\n\ndef make():\n    return nn.Sequential(nn.Linear(8, 8))\n\n\n"
            "net = make()\nnet = torch.compile(net)\nhead = nn.Sequential(nn.Linear(8, 2))\nhead = torch.compile(head)\nfit(net, head)\n",
        ),
        # a module passed to torch.jit.script / trace / export: compiling it first would break that call
        Example(
            "import torch\n\nconv = torch.nn.Conv2d(3, 8, 3)\nmod = torch.nn.Sequential(conv, torch.nn.BatchNorm2d(8))\n"
            "frozen = torch.jit.optimize_for_inference(torch.jit.script(mod.eval()))\n",
            None,
            message_contains="torch.jit.optimize_for_inference",
        ),
        # a module that becomes part of a bigger model: the bigger one is compiled, once
        Example(
            "import torch\nfrom torch import nn\n\n\nclass Block(nn.Module):\n    pass\n\n\n"
            "def main():\n    block = Block()\n    model = nn.Sequential(block, block)\n    train(model)\n",
            "import torch\nfrom torch import nn\n\n\nclass Block(nn.Module):\n    pass\n\n\n"
            "def main():\n    block = Block()\n    model = nn.Sequential(block, block)\n    model = torch.compile(model)\n    train(model)\n",
        ),
        # the whole module pickled: the saved file would hold the compile wrapper
        Example(
            "import torch\nimport torch.nn as nn\n\n\nclass Net(nn.Module):\n    pass\n\n\ndef main():\n"
            "    model = Net().cuda()\n    train(model)\n    torch.save({\"model\": model}, \"model.pt\")\n",
            None,
            message_contains="`torch.save(...)` would pickle the compile wrapper",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            if ctx.matches(call, {"torch.compile"}, {"torch.compile"}) or (
                isinstance(call.func, cst.Attribute) and call.func.attr.value == "compile" and h.dotted(call.func.value) in ("torch", ctx.torch_alias())
            ):
                return  # the file already compiles something: leave it to the author
        modules = _module_classes(ctx)
        factories = _module_factories(ctx, modules)
        alias = ctx.torch_alias()
        sites: list[tuple[cst.Assign, cst.Call]] = []
        for assign in ctx.nodes(cst.Assign):
            if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
                continue
            ctor = _constructor(assign.value)
            if ctor is None:
                continue
            if not _builds_module(ctx, ctor, modules, factories) or _inside_builder(ctx, assign, factories):
                continue
            sites.append((assign, ctor))
        built = [ctor for _, ctor in sites]
        for assign, _ in sites:
            target = assign.targets[0].target.value  # type: ignore[union-attr]
            message = f"{target} runs eagerly: every operator is a separate kernel launch; torch.compile({target}) fuses them"
            why = _left_to_others(ctx, assign, target, built)
            if why == "":
                continue
            if why is not None:
                yield self.report(assign.value, message + f"; not changed: {why}")
                continue
            uses = _uses(ctx, assign, target)
            if not uses:
                continue  # nothing in the file runs it: a model made for others to import (torch's export examples)
            why = next((w for w in map(lambda u: _observes_wrapper(ctx, u), uses) if w is not None), None)
            if why is not None:
                yield self.report(assign.value, message + f"; not changed: {why}")
                continue
            line = ctx.parent(assign)
            if alias is None:
                yield self.report(assign.value, message + " (add `import torch` first)")
                continue
            if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
                yield self.report(assign.value, message)
                continue
            new = h.simple_stmt(f"{target} = {alias}.compile({target})\n")
            yield self.replace(assign.value, message, h.insert_after(line, [new]))
