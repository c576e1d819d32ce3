"""The torch facts some fixers rely on, checked against the installed torch (skipped without it),
and whole repro files run before and after a fix where the generated example tests cannot run code.

* redundant-copy-chain / flow.read_only_use: which ``torch.nn.functional`` functions take
  ``inplace`` (and at which position), which dropout variants may return their input;
  ``Tensor.to``'s positional ``copy``.
* dataloader-workers: DataLoader refuses ``shuffle=True`` / a sampler for an IterableDataset (so
  those prove a map-style dataset), and workers replay an unsharded IterableDataset.
* matmul-precision: the ``fp32_precision`` API exists and the fixer leaves it alone.
"""

from __future__ import annotations

import inspect
import textwrap

import pytest

from zoomer_ar.fix import flow
from zoomer_ar.fix.registry import load_registry

FIXERS = {cls.name: cls for cls in load_registry().fixers}


def _fix(name: str, source: str) -> str:
    return FIXERS[name]().fix(source)


def _torch():
    return pytest.importorskip("torch")


# --------------------------------------------------------------------------------------------
# redundant-copy-chain: in-place functional calls and aliasing
# --------------------------------------------------------------------------------------------


def test_inplace_positions_match_torch_signatures():
    torch = _torch()
    F = torch.nn.functional
    with_inplace = {}
    for name in dir(F):
        fn = getattr(F, name)
        if name.startswith("_") or not callable(fn):
            continue
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            continue
        for i, p in enumerate(params):
            if p.name == "inplace":
                assert p.kind is p.POSITIONAL_OR_KEYWORD, name
                with_inplace[name] = i
    assert with_inplace == flow.F_INPLACE_INDEX
    for name, default in flow.F_DROPOUT_TRAINING_DEFAULT.items():
        params = inspect.signature(getattr(F, name)).parameters
        assert list(params)[1:3] == ["p", "training"], name
        assert params["training"].default is default, name
    # every function assumed fresh exists
    assert all(hasattr(F, n) for n in flow.F_FRESH), sorted(n for n in flow.F_FRESH if not hasattr(F, n))


def test_dropout_may_return_its_input_and_einsum_a_view():
    torch = _torch()
    F = torch.nn.functional
    x = torch.randn(4, 4)
    assert F.dropout(x, 0.5, False) is x
    assert F.dropout(x, 0.0, True) is x
    assert F.alpha_dropout(x) is x  # training defaults to False
    assert F.dropout(x, 0.5, True) is not x
    assert torch.einsum("ij->ji", x).untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


COPY1 = textwrap.dedent(
    """\
    import torch
    import torch.nn.functional as F


    def act(x):
        x = x.clone()
        F.relu(x, True)
        return x.sum()


    def drop(x, p):
        x = x.clone()
        y = F.dropout(x, p, False)
        y.mul_(2)
        return y.sum() + x.sum()


    def lr(x):
        x = x.clone()
        F.leaky_relu(x, 0.1, True)
        print(x)
    """
)


def test_clone_before_positional_inplace_call_is_kept():
    assert _fix("redundant-copy-chain", COPY1) == COPY1
    assert FIXERS["redundant-copy-chain"]().detect(COPY1) == []


def test_clone_before_positional_inplace_call_protects_the_caller():
    """What the removed clone would have exposed: the caller's tensor modified."""
    torch = _torch()
    ns: dict = {}
    exec(COPY1.replace("    x = x.clone()\n", ""), ns)  # the audit's wrong output
    x = -torch.ones(3)
    ns["act"](x)
    assert x.tolist() == [0.0, 0.0, 0.0]
    ns2: dict = {}
    exec(COPY1, ns2)
    x = -torch.ones(3)
    ns2["act"](x)
    ns2["drop"](x, 0.5)
    assert x.tolist() == [-1.0, -1.0, -1.0]


def test_positional_copy_rewrite_runs_and_matches():
    torch = _torch()
    before = textwrap.dedent(
        """\
        import torch as T

        def f(x, d):
            a = x.clone().contiguous()
            b = x.contiguous().clone()
            c = x.clone().to(d, copy=False)
            e = x.clone().to(d, T.float16, False, False)
            g = x.to(d).clone(memory_format=T.channels_last)
            h = x.to(d, copy=False).clone()
            k = x.clone().to(d, T.float16, False)
            m = x.clone().to(T.float16, False, False)
            n = x.to(T.float16, False, False).clone()
            o = x.clone().to("cpu", None, False)
            return a, b, c, e, g, h, k, m, n, o
        """
    )
    after = _fix("redundant-copy-chain", before)
    assert "False, False, copy=True" not in after
    assert "e = x.to(d, T.float16, False, True)" in after
    assert "m = x.to(T.float16, False, True)" in after
    assert "n = x.to(T.float16, False, True)" in after
    assert "o = x.to(\"cpu\", None, False, copy=True)" in after

    def run(code):
        ns: dict = {}
        exec(code, ns)
        x = torch.randn(2, 3, 4, 5)
        return [(r is x, r.data_ptr() == x.data_ptr(), r.dtype, r.stride()) for r in ns["f"](x, "cpu")]

    assert run(after) == run(before)
    assert not any(same or shared for same, shared, _, _ in run(after))


DTYPE_TRIPS = textwrap.dedent(
    """\
    import torch

    def trip(x):
        return x.to(torch.float64).to(torch.float32).clone()

    def ints(x):
        return x.int().double().float(), x.int().to(torch.float64).to(torch.float16)

    def floats(x):
        return x.half().double().float(), x.float().to(torch.float64).to(torch.bfloat16)
    """
)


def test_int64_through_float64_rounds_twice_so_an_unseen_dtype_keeps_its_round_trip():
    """2**60 + 2**36 + 1 as int64: float64 drops the +1 (its ulp there is 256), leaving a tie
    that float32 rounds to even, 2**60; converted directly it rounds up to 2**60 + 2**37. So
    `x.to(float64).to(float32)` is not `x.to(float32)` when x may be int64: only the clone of the
    fresh float32 result goes; where the dtype is visibly exact (int32, float16, float32) the
    round trip becomes one conversion, with the same values."""
    torch = _torch()
    after = _fix("redundant-copy-chain", DTYPE_TRIPS)
    assert "return x.to(torch.float64).to(torch.float32)\n" in after
    assert "x.int().to(torch.float32, copy=True), x.int().to(torch.float16, copy=True)" in after
    assert "x.half().to(torch.float32, copy=True), x.float().to(torch.bfloat16, copy=True)" in after

    def run(code, x):
        ns: dict = {}
        exec(code, ns)
        return ns["trip"](x), ns["ints"](x), ns["floats"](x)

    big = torch.tensor([2**60 + 2**36 + 1, 2**53 + 3, -(2**62) - 2**38 - 1, 16777217], dtype=torch.int64)
    assert not torch.equal(big.to(torch.float64).to(torch.float32), big.to(torch.float32))  # why it is kept
    for x in (big, torch.randn(1000, dtype=torch.float64) * 1e6, torch.randint(-2**31, 2**31 - 1, (1000,))):
        for b, a in zip(run(DTYPE_TRIPS, x), run(after, x)):
            pairs = zip(b, a) if isinstance(b, tuple) else [(b, a)]
            for before_value, after_value in pairs:
                assert before_value.dtype == after_value.dtype
                assert torch.equal(before_value, after_value)


def test_ambiguous_positional_to_is_reported_not_rewritten():
    source = "def f(x, a, b):\n    return x.clone().to(a, b, False), x.to(a, b, False).clone()\n"
    matches = FIXERS["redundant-copy-chain"]().detect(source)
    assert len(matches) == 2 and not any(m.fixable for m in matches)
    assert _fix("redundant-copy-chain", source) == source


# --------------------------------------------------------------------------------------------
# dataloader-workers: iterable-style datasets
# --------------------------------------------------------------------------------------------

IT = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader, IterableDataset


    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(8))


    def count():
        loader = DataLoader(Stream(), batch_size=None)
        return sum(1 for _ in loader)


    if __name__ == "__main__":
        print(count())
    """
)


def test_iterable_dataset_loader_is_reported_only():
    matches = FIXERS["dataloader-workers"]().detect(IT)
    assert len(matches) == 1 and not matches[0].fixable and matches[0].edits == []
    assert "replay the whole stream" in matches[0].message
    assert _fix("dataloader-workers", IT) == IT


def test_all_fixers_together_leave_the_iterable_loader_alone():
    from zoomer_ar.fix import api

    assert "num_workers" not in api.fix_source(IT)


def test_dataloader_refuses_map_style_options_for_an_iterable_dataset():
    """The assumption dataloader-workers rests on, checked against torch itself (no zoomer code
    here): shuffle=True, a sampler or a batch_sampler prove a map-style dataset, since DataLoader
    refuses them for an IterableDataset. A torch that accepted them would make that proof unsound."""
    _torch()
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(8))

    for kwargs in ({"shuffle": True}, {"sampler": [0, 1]}, {"batch_sampler": [[0]]}):
        with pytest.raises(ValueError):
            DataLoader(Stream(), **kwargs)
    DataLoader(Stream(), shuffle=False)  # shuffle=False proves nothing


# --------------------------------------------------------------------------------------------
# matmul-precision: the newer fp32_precision API
# --------------------------------------------------------------------------------------------


def test_fp32_precision_api_exists_and_counts_as_configured():
    torch = _torch()
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("torch without the fp32_precision API")
    source = (
        "import torch\n\n"
        'torch.backends.cuda.matmul.fp32_precision = "ieee"  # exact FP32 for this solver\n'
        'torch.backends.cudnn.conv.fp32_precision = "ieee"\n'
        "model = Net().cuda()\nloss = model(x).sum()\nloss.backward()\n"
    )
    assert FIXERS["matmul-precision"]().detect(source) == []
    assert _fix("matmul-precision", source) == source


# --------------------------------------------------------------------------------------------
# loop-synchronize: timing with datetime
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("imports", "clock"),
    [
        ("from datetime import datetime", "datetime.now()"),
        ("from datetime import datetime", "datetime.utcnow()"),
        ("import datetime", "datetime.datetime.now()"),
        ("import datetime as dt", "dt.datetime.today()"),
        ("import time", "time.monotonic()"),
        ("import time", "time.process_time()"),
        ("import time", "time.monotonic_ns()"),
        ("import time", "time.clock_gettime(time.CLOCK_MONOTONIC)"),
    ],
)
def test_synchronize_between_clock_reads_is_kept(imports, clock):
    source = f"import torch\n{imports}\n\nfor x in loader:\n    t0 = {clock}\n    step(x)\n    torch.cuda.synchronize()\n    dt = {clock} - t0\n"
    assert FIXERS["loop-synchronize"]().detect(source) == []


def test_unrelated_now_is_not_a_clock():
    source = "import torch\nfrom mylib import calendar\n\nfor x in loader:\n    step(x)\n    torch.cuda.synchronize()\n    day = calendar.now()\n"
    assert _fix("loop-synchronize", source) == source.replace("    torch.cuda.synchronize()\n", "")


# --------------------------------------------------------------------------------------------
# optimizer-foreach: on the CPU foreach=True is a change, not a speed-up
# --------------------------------------------------------------------------------------------

CPU_AUTOCAST_TRAINING = textwrap.dedent(
    """\
    import torch
    from torch import nn, optim

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4))
    optimizer = optim.NAdam(model.parameters(), lr=1e-2)
    for _ in range(20):
        optimizer.zero_grad()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(8, 16)).float().pow(2).sum()
        loss.backward()
        optimizer.step()
    """
)


def test_cpu_autocast_training_keeps_its_optimizer_whose_foreach_step_rounds_differently():
    """torch.autocast's docstring example trains on the CPU: there foreach=True only loops over
    the tensors, and NAdam's foreach step rounds differently from the single-tensor one that the
    CPU default runs, so adding it would change the trained parameters."""
    torch = _torch()
    assert _fix("optimizer-foreach", CPU_AUTOCAST_TRAINING) == CPU_AUTOCAST_TRAINING

    def train(code):
        ns: dict = {}
        exec(code, ns)
        return torch.cat([p.detach().flatten() for p in ns["model"].parameters()])

    forced = CPU_AUTOCAST_TRAINING.replace("lr=1e-2)", "lr=1e-2, foreach=True)")
    assert not torch.equal(train(CPU_AUTOCAST_TRAINING), train(forced))
