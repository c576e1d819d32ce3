"""optimizer-foreach offers an edit only where it changes what PyTorch runs.

It used to add `foreach=True` to every optimizer that left `foreach` unset. Since PyTorch 2.0 the
default already is foreach where it can be (`_default_to_fused_or_foreach`: every parameter a plain
tensor on a foreach device, `differentiable` off), so on a GPU job that edit changes nothing; where
the default falls back the report says why. And `foreach=True` on an Adam/AdamW with a Tensor `lr`
(without `capturable=True`) made the optimizer raise when built.
"""

from __future__ import annotations

import torch
from torch.optim.optimizer import _default_to_fused_or_foreach
from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

from zoomer_ar.fix import api

GPU_SCRIPT = """\
import torch

model = Net().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
"""


ONLY = ["optimizer-foreach"]


def _matches(source: str):
    return api.static_findings(source, "train.py", select=ONLY)


def _fix(source: str, **options) -> str:
    return api.fix_source(source, select=ONLY, options={"optimizer-foreach": options} if options else None)


def test_unset_foreach_is_reported_not_rewritten():
    (m,) = _matches(GPU_SCRIPT)
    assert not m.fixable and m.replacement is None
    for reason in ("already use foreach", "another device", "tensor-subclass", "differentiable=True", "before 2.0"):
        assert reason in m.message
    assert _fix(GPU_SCRIPT) == GPU_SCRIPT
    none = GPU_SCRIPT.replace("lr=3e-4)", "lr=3e-4, foreach=None)")
    assert _fix(none) == none and not _matches(none)[0].fixable


def test_the_default_it_relies_on():
    """What the report claims of PyTorch: CUDA (and ROCm, whose device is "cuda") is a foreach device,
    and the default picks foreach unless `differentiable` or a parameter on another device (the CPU
    here) says otherwise; fused is never the default."""
    assert "cuda" in _get_foreach_kernels_supported_devices()
    cpu = [torch.nn.Parameter(torch.zeros(2))]
    assert _default_to_fused_or_foreach(cpu, differentiable=False, use_fused=False) == (False, False)
    assert _default_to_fused_or_foreach(cpu, differentiable=True, use_fused=True) == (False, False)


def test_explicit_off_and_fused_are_still_changed():
    off = GPU_SCRIPT.replace("lr=3e-4)", "lr=3e-4, foreach=False)")
    assert _fix(off) == GPU_SCRIPT.replace("lr=3e-4)", "lr=3e-4, foreach=True)")
    assert _fix(GPU_SCRIPT, fused=True) == GPU_SCRIPT.replace("lr=3e-4)", "lr=3e-4, fused=True)")


TENSOR_LR = """\
import torch

lr = torch.tensor(1e-3)
opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2)).cuda()], lr, foreach=False)
"""


def test_a_tensor_lr_keeps_foreach_off():
    """PyTorch refuses foreach=True with a Tensor lr (capturable=False) when the optimizer is built;
    the edit would have turned a working script into a ValueError."""
    p = [torch.nn.Parameter(torch.zeros(2))]
    torch.optim.Adam(p, torch.tensor(1e-3), foreach=False)  # the original builds
    try:
        torch.optim.Adam(p, torch.tensor(1e-3), foreach=True)
    except ValueError as exc:
        assert "lr as a Tensor" in str(exc)
    else:
        raise AssertionError("PyTorch accepted foreach=True with a Tensor lr: the report is stale")
    (m,) = _matches(TENSOR_LR)
    assert not m.fixable and "Tensor lr" in m.message
    assert _fix(TENSOR_LR) == TENSOR_LR
    inline = TENSOR_LR.replace("], lr,", "], lr=torch.tensor(1e-3),")
    assert _fix(inline) == inline
    capturable = TENSOR_LR.replace("foreach=False", "foreach=False, capturable=True")
    assert "foreach=True, capturable=True" in _fix(capturable)
    plain = TENSOR_LR.replace("lr = torch.tensor(1e-3)", "lr = 1e-3")
    assert "foreach=True" in _fix(plain)
