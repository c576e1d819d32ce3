"""How the streaming pass classifies events: flags per category and per name, computed once per
distinct one, that say which events a feature can select (compact.py keeps those)."""

from __future__ import annotations

from ..features import names as N
from ..features.phases import is_backward_op

# category flags
C_GPU, C_ACCEL, C_RUNTIME, C_CPUOP, C_USER, C_PY, C_TRACE, C_GPUANN = 1, 2, 4, 8, 16, 32, 64, 128
# name flags
N_ANY, N_OP, N_COPY_, N_RT, N_ATEN, N_SINGLE, N_OPT, N_LIGHT = 1, 2, 4, 8, 16, 32, 64, 128
# Host ops that no feature reads an argument of: the optimizer counts read names, the factory /
# to_copy test and the conv -> batch norm test read names and times, phases read backward ops'
# times and threads. Rows of these names (in cpu-op and user-annotation categories) are kept
# "light": their argument columns hold the defaults (-1, NaN) instead of the event's values.
_ARG_READ = (N.ITEM_OPS | N.ITEM_FALLBACK_OPS | N.COPY_OPS | N.GEMM_OPS | N.CONV_OPS | N.ZERO_FILL_OPS
             | {"aten::_to_copy", "aten::add_", "aten::add", "aten::copy_"})

LOW_PRECISION = ("c10::BFloat16", "c10::Half", "c10::Float8")  # as features.host.holds_precision_cast
_NAMED_OPS = (
    N.ITEM_OPS | N.ITEM_FALLBACK_OPS | N.COPY_OPS | N.FACTORY_OPS | N.GEMM_OPS | N.CONV_OPS | N.BN_OPS | N.LAYER_OPS
    | N.ZERO_FILL_OPS | {"aten::_to_copy", "aten::add_", "aten::add"}
)
_RT_WORDS = ("Memcpy", "memcpy", "Memset", "memset", "Launch", "launch", "Synchronize", "Malloc", "Free", "runFunction")

KEEP_CATS = C_GPU | C_ACCEL | C_TRACE
KEEP_NAMES = N_ANY | N_OP | N_SINGLE


def cat_flags(cat: str) -> int:
    f = 0
    if cat in N.GPU_CATS:
        f |= C_GPU
    if cat in N.ACCEL_ONLY_CATS:
        f |= C_ACCEL
    if cat in N.RUNTIME_CATS:
        f |= C_RUNTIME
    if cat in N.CPU_OP_CATS:
        f |= C_CPUOP
    if cat == "user_annotation":
        f |= C_USER
    if cat in N.PYTHON_CATS:
        f |= C_PY
    if cat == "Trace":
        f |= C_TRACE
    if cat == "gpu_user_annotation":
        f |= C_GPUANN
    return f


def name_flags(name: str) -> int:
    f = 0
    if (N.is_profiler_step(name) or N.is_dataloader_next(name) or N.is_optimizer_step(name) or N.is_zero_grad(name)
            or name == "[memory]" or N.is_compile_window(name)):
        f |= N_ANY
    if N.is_optimizer_step(name):
        f |= N_OPT
    if name in _NAMED_OPS or is_backward_op(name):
        f |= N_OP
    if name == "aten::copy_":
        f |= N_COPY_
    if N.is_kept_runtime_call(name) or any(w in name for w in _RT_WORDS):
        f |= N_RT
    if name.startswith("aten::"):
        f |= N_ATEN
    if "_single_tensor_" in name:
        f |= N_SINGLE
    if not (f & N_ANY) and name not in _ARG_READ and "[memory]" not in name:
        f |= N_LIGHT  # in a host-op category: see _ARG_READ
    return f
