"""Small, conservative data-flow helpers for fixers (names, parameters, call sites).

Fixers that rewrite a value must know who else sees it: a list passed from ``main`` into
``train_step``, a stats dict read after the training loop, a tensor that only feeds a reduction.
These helpers answer such questions for module-level functions of one file, conservatively: any
use they cannot classify makes the caller give up (report only). Nothing here imports torch.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from . import helpers as h
from .base import Context

Scope = cst.FunctionDef | cst.Module

#: tensor methods that return a new tensor (never an alias of the receiver, never in place)
FRESH_METHODS = frozenset(
    {
        "mean", "sum", "prod", "amax", "amin", "std", "var", "norm", "softmax", "log_softmax", "exp",
        "log", "log1p", "sqrt", "rsqrt", "abs", "neg", "sigmoid", "tanh", "relu", "gelu", "matmul",
        "mm", "bmm", "add", "sub", "mul", "div", "pow", "clamp", "square", "logsumexp", "cumsum",
        "argmax", "argmin", "eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum", "outer", "dot",
    }
)
#: tensor methods that may return a view or the receiver itself (aliases)
VIEW_METHODS = frozenset(
    {
        "transpose", "permute", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten",
        "squeeze", "unsqueeze", "t", "T", "mT", "expand", "expand_as", "narrow", "select", "unfold",
        "contiguous", "detach", "float", "double", "half", "bfloat16", "to", "type", "type_as",
        "chunk", "split", "unbind", "movedim", "swapaxes", "diagonal", "as_strided", "real", "imag",
    }
)
#: metadata reads: neither alias nor mutate
META_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "names", "is_leaf"})
#: builtins that only read their argument
READERS = frozenset(f"builtins.{n}" for n in ("print", "len", "float", "int", "str", "repr", "format", "bool"))
META_METHODS = frozenset({"size", "dim", "numel", "stride", "is_contiguous", "element_size", "nelement", "storage_offset", "is_floating_point", "is_complex"})


# --------------------------------------------------------------------------------------------
# Scopes and names
# --------------------------------------------------------------------------------------------


def scope_of(ctx: Context, node: cst.CSTNode) -> cst.CSTNode:
    """The innermost FunctionDef/ClassDef/Lambda around ``node``, else the Module."""
    return ctx.enclosing_scope(node)


def body_of(scope: cst.CSTNode) -> cst.CSTNode:
    return scope.body if isinstance(scope, cst.FunctionDef) else scope


def names_in(ctx: Context, scope: cst.CSTNode, name: str) -> list[cst.Name]:
    """Every Name node spelled ``name`` that belongs to ``scope`` (not to nested defs, classes or
    lambdas), in document order. Attribute names (``x.name``) and keywords are not Names here."""
    out: list[cst.Name] = []
    for n in h.walk(body_of(scope), into_scopes=False):
        if isinstance(n, cst.Name) and n.value == name and not _is_label(ctx, n):
            out.append(n)
    out.sort(key=ctx.order)
    return out


def used_in_nested_scopes(ctx: Context, scope: cst.CSTNode, name: str) -> bool:
    """Whether a def/class/lambda nested in ``scope`` mentions ``name`` (a closure, a global...)."""
    for n in h.walk(body_of(scope)):
        if isinstance(n, cst.Name) and n.value == name and not _is_label(ctx, n) and ctx.enclosing_scope(n) is not scope:
            return True
    return False


def declared_nonlocal(scope: cst.CSTNode, name: str) -> bool:
    for n in h.walk(body_of(scope), into_scopes=False):
        if isinstance(n, (cst.Global, cst.Nonlocal)) and any(i.name.value == name for i in n.names):
            return True
    return False


def _is_label(ctx: Context, n: cst.Name) -> bool:
    """Names that are not variable references: attribute names, keywords, def/class names,
    import aliases' dotted parts."""
    p = ctx.parent(n)
    if isinstance(p, cst.Attribute) and p.attr is n:
        return True
    if isinstance(p, cst.Arg) and p.keyword is n:
        return True
    if isinstance(p, (cst.FunctionDef, cst.ClassDef)) and p.name is n:
        return True
    if isinstance(p, (cst.ImportAlias, cst.ImportFrom, cst.Import, cst.AsName)):
        return True
    return False


def is_store(ctx: Context, n: cst.Name) -> bool:
    """``n`` is (part of) an assignment/for/with/del target or a parameter."""
    child: cst.CSTNode = n
    for anc in ctx.ancestors(n):
        if isinstance(anc, cst.AssignTarget) and anc.target is child:
            return True
        if isinstance(anc, (cst.AugAssign, cst.AnnAssign)) and anc.target is child:
            return True
        if isinstance(anc, (cst.For, cst.CompFor)) and anc.target is child:
            return True
        if isinstance(anc, cst.AsName) and anc.name is child:
            return True
        if isinstance(anc, cst.Del):
            return True
        if isinstance(anc, cst.Param) and anc.name is child:
            return True
        if isinstance(anc, cst.NamedExpr) and anc.target is child:
            return True
        if isinstance(anc, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            child = anc
            continue
        return False
    return False


def is_param(fn: cst.FunctionDef, name: str) -> bool:
    return any(p.name.value == name for p in _all_params(fn))


def _all_params(fn: cst.FunctionDef) -> list[cst.Param]:
    ps = fn.params
    out = [*ps.posonly_params, *ps.params, *ps.kwonly_params]
    if isinstance(ps.star_arg, cst.Param):
        out.append(ps.star_arg)
    if ps.star_kwarg is not None:
        out.append(ps.star_kwarg)
    return out


# --------------------------------------------------------------------------------------------
# Module-level functions, their call sites and argument binding
# --------------------------------------------------------------------------------------------


def module_function(ctx: Context, fn: cst.CSTNode) -> bool:
    """A plain (undecorated, not async) function defined directly in the module body, whose
    name is bound nowhere else in the file."""
    if not isinstance(fn, cst.FunctionDef) or ctx.parent(fn) is not ctx.module:
        return False
    if fn.decorators or fn.asynchronous is not None:
        return False
    same = [
        d for d in ctx.nodes(cst.FunctionDef, cst.ClassDef) if d.name.value == fn.name.value
    ]
    if len(same) != 1:
        return False
    for n in ctx.nodes(cst.Name):
        if n.value == fn.name.value and is_store(ctx, n):
            return False
    return True


def call_sites(ctx: Context, fn: cst.FunctionDef) -> list[cst.Call] | None:
    """Every call ``fn(...)`` in the file; None when the function's name is used in any other
    way (passed around, stored, imported elsewhere in the file) or when it is not a plain
    module-level function."""
    if not module_function(ctx, fn):
        return None
    calls: list[cst.Call] = []
    for n in ctx.nodes(cst.Name):
        if n.value != fn.name.value or n is fn.name or _is_label(ctx, n):
            continue
        p = ctx.parent(n)
        if isinstance(p, cst.Call) and p.func is n:
            calls.append(p)
            continue
        return None
    return calls


def bound_argument(call: cst.Call, fn: cst.FunctionDef, param: str) -> cst.BaseExpression | None:
    """The argument expression ``call`` binds to ``param`` of ``fn`` (None: not passed, or the
    binding is not statically clear: ``*args``/``**kwargs`` at the call or in the signature)."""
    if any(a.star for a in call.args):
        return None
    ps = fn.params
    positional = [*ps.posonly_params, *ps.params]
    pos_args = [a for a in call.args if a.keyword is None]
    for i, p in enumerate(positional):
        if p.name.value == param:
            if i < len(pos_args):
                return pos_args[i].value
            break
    if any(p.name.value == param for p in ps.posonly_params):
        return None
    for a in call.args:
        if a.keyword is not None and a.keyword.value == param:
            return a.value
    return None


def function_of(ctx: Context, node: cst.CSTNode) -> cst.FunctionDef | None:
    scope = ctx.enclosing_scope(node)
    return scope if isinstance(scope, cst.FunctionDef) else None


def called_function(ctx: Context, call: cst.Call) -> cst.FunctionDef | None:
    """The module-level function ``call`` calls by its plain name, if it is one of this file's."""
    if not isinstance(call.func, cst.Name):
        return None
    for fn in ctx.module.body:
        if isinstance(fn, cst.FunctionDef) and fn.name.value == call.func.value:
            return fn if module_function(ctx, fn) else None
    return None


def arg_param(ctx: Context, call: cst.Call, fn: cst.FunctionDef, expr: cst.CSTNode) -> str | None:
    """The parameter of ``fn`` that the argument ``expr`` of ``call`` binds to."""
    for p in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]:
        if bound_argument(call, fn, p.name.value) is expr:
            return p.name.value
    return None


# --------------------------------------------------------------------------------------------
# Tensor values that are only read
# --------------------------------------------------------------------------------------------


#: ``torch.nn.functional`` functions with an ``inplace`` parameter: its positional index (torch
#: 2.x signatures; ``F.relu(x, True)`` is in place just like ``F.relu(x, inplace=True)``)
F_INPLACE_INDEX = {
    "relu": 1, "relu6": 1, "selu": 1, "silu": 1, "mish": 1, "hardsigmoid": 1, "hardswish": 1,
    "elu": 2, "celu": 2, "leaky_relu": 2, "hardtanh": 3, "threshold": 3, "rrelu": 4,
    "dropout": 3, "dropout1d": 3, "dropout2d": 3, "dropout3d": 3, "alpha_dropout": 3, "feature_alpha_dropout": 3,
}
#: dropout functions: they return their input itself when ``training`` is false or ``p`` is 0;
#: name -> the default of ``training`` (``p`` is positional 1, ``training`` positional 2)
F_DROPOUT_TRAINING_DEFAULT = {
    "dropout": True, "dropout1d": True, "dropout2d": True, "dropout3d": True,
    "alpha_dropout": False, "feature_alpha_dropout": False,
}
#: functions that update some tensor arguments in place (running statistics of batch/instance
#: norm, ``max_norm`` renormalisation of an embedding's weight): only their input is just read
F_MUTATE_OTHER_ARGS = frozenset({"batch_norm", "instance_norm", "embedding", "embedding_bag"})
#: ``torch.nn.functional`` functions that return a new tensor and leave their arguments alone
#: (given no ``inplace`` flag); anything not listed here is not assumed to (it might return its
#: input or a view of it, or modify it)
F_FRESH = frozenset(
    {
        *F_INPLACE_INDEX, *F_MUTATE_OTHER_ARGS,
        "gelu", "sigmoid", "tanh", "softplus", "softsign", "softshrink", "hardshrink", "tanhshrink",
        "logsigmoid", "glu", "prelu", "softmax", "log_softmax", "softmin", "gumbel_softmax", "normalize",
        "linear", "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "conv_tbc", "avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d",
        "max_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
        "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
        "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_max_pool1d_with_indices",
        "adaptive_max_pool2d_with_indices", "adaptive_max_pool3d_with_indices", "lp_pool1d", "lp_pool2d",
        "lp_pool3d", "max_unpool1d", "max_unpool2d", "max_unpool3d", "layer_norm", "group_norm", "rms_norm",
        "local_response_norm", "one_hot", "pad", "interpolate", "upsample", "upsample_bilinear",
        "upsample_nearest", "grid_sample", "affine_grid", "pixel_shuffle", "pixel_unshuffle", "unfold", "fold",
        "scaled_dot_product_attention", "cosine_similarity", "pairwise_distance", "pdist", "mse_loss", "l1_loss",
        "smooth_l1_loss", "huber_loss", "cross_entropy", "nll_loss", "binary_cross_entropy",
        "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss", "gaussian_nll_loss",
        "cosine_embedding_loss", "hinge_embedding_loss", "margin_ranking_loss", "multi_margin_loss",
        "multilabel_margin_loss", "multilabel_soft_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "ctc_loss",
    }
)
#: ``torch.*`` functions that return a new tensor (``torch.einsum`` is not one: ``'ij->ji'``
#: returns a view of its operand)
TORCH_FRESH = frozenset(
    {
        "cat", "stack", "matmul", "mm", "bmm", "sum", "mean", "exp", "log", "softmax", "sigmoid", "tanh",
        "add", "mul", "sub", "div", "where", "amax", "amin", "norm", "relu", "abs", "sqrt", "cdist",
    }
)


def _statically_fresh_dropout(call: cst.Call, last: str) -> bool:
    """A dropout call that certainly returns a new tensor: ``training`` literally true (or true by
    default) and ``p`` a literal other than 0 (or the default 0.5); otherwise it may return its
    input itself (``F.dropout(x, p, False) is x``)."""
    training = h.arg_at(call, "training", 2)
    if training is None:
        if not F_DROPOUT_TRAINING_DEFAULT[last]:
            return False
    elif not h.is_literal(training.value, True):
        return False
    p = h.arg_at(call, "p", 1)
    if p is None:
        return True
    value = h.literal(p.value)
    return type(value) in (int, float) and value != 0


def _torch_out_of_place(ctx: Context, call: cst.Call, arg: cst.Arg | None = None) -> bool:
    """``torch.cat/stack/...`` or ``F.*`` called so that it returns a new tensor and leaves the
    argument ``arg`` (any argument when None) unmodified: no ``out=``, no ``inplace`` flag that
    is not literally False (by keyword or by position, ``F.relu(x, True)``), not an in-place
    variant (``F.relu_``), not a dropout that may return its input, not ``*args``/``**kwargs``.
    Functions not known to return a fresh tensor do not qualify."""
    d = h.dotted(call.func) or ""
    last = d.split(".")[-1]
    if last.endswith("_") or h.kwarg(call, "out") is not None or h.has_star(call):
        return False
    if ctx.matches(call, {f"torch.nn.functional.{last}"}, {f"F.{last}", f"torch.nn.functional.{last}", f"nn.functional.{last}"}):
        if last not in F_FRESH:
            return False
        if last in F_INPLACE_INDEX:
            inplace = h.arg_at(call, "inplace", F_INPLACE_INDEX[last])
            if inplace is not None and not h.is_literal(inplace.value, False):
                return False
        if last in F_DROPOUT_TRAINING_DEFAULT and not _statically_fresh_dropout(call, last):
            return False
        if last in F_MUTATE_OTHER_ARGS:
            first = h.positionals(call)[:1]
            return arg is not None and (any(a is arg for a in first) or (arg.keyword is not None and arg.keyword.value == "input"))
        return True
    if h.kwarg(call, "inplace") is not None:
        return False
    return last in TORCH_FRESH and ctx.matches(call, {f"torch.{last}"}, {f"torch.{last}"})


def read_only_use(ctx: Context, node: cst.CSTNode, depth: int = 0) -> bool:
    """Whether the value of expression ``node`` is only read where it stands: used as a
    metadata source (``x.shape``), the receiver of an out-of-place tensor method, an operand of
    arithmetic, an argument of an out-of-place ``torch``/``F`` function or of print/len, or
    the receiver of a view/conversion whose own result is, recursively, only read. Binding it to
    a name, returning it, storing it, passing it to any other call, or mutating it is not."""
    if depth > 12:
        return False
    p = ctx.parent(node)
    if isinstance(p, cst.Attribute) and p.value is node:
        attr = p.attr.value
        gp = ctx.parent(p)
        called = isinstance(gp, cst.Call) and gp.func is p
        if not called:
            if attr in META_ATTRS:
                return not _assigned_to(ctx, p)
            if attr in ("T", "mT", "real", "imag"):
                return read_only_use(ctx, p, depth + 1)
            return False
        if attr in META_METHODS:
            return True
        if attr in FRESH_METHODS and h.kwarg(gp, "out") is None:
            return True
        if attr in VIEW_METHODS and h.kwarg(gp, "out") is None:
            return read_only_use(ctx, gp, depth + 1)
        return False
    if isinstance(p, cst.BinaryOperation):
        return True
    if isinstance(p, cst.UnaryOperation):
        return True
    if isinstance(p, cst.Comparison) or isinstance(p, cst.ComparisonTarget):
        return True
    if isinstance(p, cst.SubscriptElement) or isinstance(p, cst.Index):
        return False
    if isinstance(p, cst.Subscript) and p.value is node:
        return read_only_use(ctx, p, depth + 1) and not _assigned_to(ctx, p)
    if isinstance(p, cst.Element):  # an element of a list/tuple literal given to torch.cat(...)
        seq = ctx.parent(p)
        holder = ctx.parent(seq) if isinstance(seq, (cst.List, cst.Tuple)) else None
        if isinstance(holder, cst.Arg):
            call = ctx.parent(holder)
            return isinstance(call, cst.Call) and _torch_out_of_place(ctx, call, holder)
        return False
    if isinstance(p, cst.Arg) and p.value is node and not p.star:
        call = ctx.parent(p)
        if not isinstance(call, cst.Call):
            return False
        if isinstance(call.func, cst.Name) and ctx.qualnames(call.func) & READERS:
            return True
        return _torch_out_of_place(ctx, call, p)
    if isinstance(p, (cst.FormattedStringExpression,)):
        return True
    return False


def _assigned_to(ctx: Context, node: cst.CSTNode) -> bool:
    p = ctx.parent(node)
    return isinstance(p, (cst.AssignTarget, cst.AugAssign)) or (isinstance(p, cst.AnnAssign) and p.target is node)


def iter_calls(node: cst.CSTNode) -> Iterator[cst.Call]:
    for n in h.walk(node, into_scopes=False):
        if isinstance(n, cst.Call):
            yield n


# --------------------------------------------------------------------------------------------
# A local tensor that is only read from its binding to the end of the function
# --------------------------------------------------------------------------------------------

#: methods through which a value may be passed on unchanged (views, no-op conversions, copies)
CHAIN_METHODS = VIEW_METHODS | {"clone"}


def _rebinding_chain(ctx: Context, n: cst.Name, name: str) -> bool:
    """``n`` is the root of ``name = n.m1(...).m2(...)`` (view/conversion/copy methods only): the
    statement rebinds the name to something that may alias its old value."""
    node: cst.CSTNode = n
    while True:
        p = ctx.parent(node)
        if isinstance(p, cst.Attribute) and p.value is node:
            gp = ctx.parent(p)
            if isinstance(gp, cst.Call) and gp.func is p and p.attr.value in CHAIN_METHODS and h.kwarg(gp, "out") is None:
                node = gp
                continue
            return False
        if isinstance(p, cst.Assign) and p.value is node:
            return len(p.targets) == 1 and isinstance(p.targets[0].target, cst.Name) and p.targets[0].target.value == name
        return False


def local_only_read(ctx: Context, stmt: cst.SimpleStatementLine, name: str) -> bool:
    """Whether the tensor a top-level statement ``name = ...`` of a function binds is, from there
    to the end of the function, only read: every later mention of ``name`` is a read-only use
    (:func:`read_only_use`) or the receiver of a view/copy chain that rebinds ``name`` itself;
    no compound statement, nested function, ``global``/``nonlocal`` or other binding mentions it.
    Mentions before the statement must be read-only uses or same-name rebinding chains too (no
    other local name aliases the value). A function's locals die with it, so nothing else can
    observe whether the value is a fresh copy or an alias of its source."""
    fn = ctx.enclosing_scope(stmt)
    if not isinstance(fn, cst.FunctionDef) or not isinstance(fn.body, cst.IndentedBlock) or ctx.parent(stmt) is not fn.body:
        return False
    if used_in_nested_scopes(ctx, fn, name) or declared_nonlocal(fn, name):
        return False
    for s in fn.body.body:
        mentions = [n for n in h.walk(s, into_scopes=False) if isinstance(n, cst.Name) and n.value == name and not _is_label(ctx, n)]
        if not mentions:
            continue
        if not isinstance(s, cst.SimpleStatementLine):
            return False
        for n in mentions:
            if is_store(ctx, n):
                p = ctx.parent(n)
                if not (isinstance(p, cst.AssignTarget) and isinstance(ctx.parent(p), cst.Assign) and len(ctx.parent(p).targets) == 1):  # type: ignore[union-attr]
                    return False
                continue
            if read_only_use(ctx, n) or _rebinding_chain(ctx, n, name):
                continue
            if s is stmt:
                continue  # the statement's own right-hand side: the fixer knows what it does with it
            return False
    return True
