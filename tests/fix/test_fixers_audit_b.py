"""Audit fixes (B): zero-grad-set-to-none, loop-item-sync, factory-on-device, matmul-precision.

What the generated example tests cannot express: whole programs run before and after a fix,
suppression interplay, options given as CLI strings and the generated docs.
"""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from fix_testutil import changed_lines_within

from zoomer_ar.fix.docs import render
from zoomer_ar.fix.registry import load_registry

FIXERS = {cls.name: cls for cls in load_registry().fixers}


def _check(name: str, source: str, **options):
    """(matches, fixed) with the standard guarantees checked: parses, idempotent, local."""
    fixer = FIXERS[name](**options)
    matches = fixer.detect(source)
    fixed = fixer.fix(source)
    cst.parse_module(fixed)
    ast.parse(fixed)
    assert fixer.fix(fixed) == fixed, "not idempotent"
    assert changed_lines_within(source, fixed, matches) == []
    return matches, fixed


def _report_only(name: str, source: str, contains: str = "", **options):
    matches, fixed = _check(name, source, **options)
    assert matches, "not reported"
    assert fixed == source
    assert not any(m.fixable for m in matches)
    assert any(contains in m.message for m in matches), [m.message for m in matches]
    return matches


def _run(source: str) -> dict:
    pytest.importorskip("torch")
    namespace: dict = {}
    exec(compile(source, "<program>", "exec"), namespace)  # noqa: S102 - our own test program
    return namespace


# --------------------------------------------------------------------------------------------
# 1. zero-grad-set-to-none: gradients read after the zeroing
# --------------------------------------------------------------------------------------------

READ_AFTER = textwrap.dedent(
    """\
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    model(torch.randn(4, 3)).sum().backward()
    for p in model.parameters():
        p.grad.zero_()
    total = sum(p.grad.sum() for p in model.parameters())
    result = float(total)
    """
)


def test_loop_followed_by_a_gradient_read_is_report_only_and_still_runs():
    _report_only("zero-grad-set-to-none", READ_AFTER, "would be None")
    assert _run(READ_AFTER)["result"] == 0.0  # the (unchanged) program works


def test_read_in_the_same_function_before_backward_is_report_only():
    source = textwrap.dedent(
        """\
        def train(model, loader, opt):
            for x in loader:
                for p in model.parameters():
                    p.grad.zero_()
                gnorm = torch.stack([p.grad.norm() for p in model.parameters()]).norm()
                loss = model(x).sum()
                loss.backward()
                opt.step()
        """
    )
    _report_only("zero-grad-set-to-none", source, "`p.grad` at line 5")


def test_zero_grad_false_followed_by_read_is_report_only():
    source = "def step(opt, model):\n    opt.zero_grad(set_to_none=False)\n    return model.weight.grad.sum()\n"
    _report_only("zero-grad-set-to-none", source, "would be None")


def test_zero_grad_false_at_the_end_of_a_loop_whose_top_reads_before_backward():
    source = (
        "for x in loader:\n"
        "    clip(model.weight.grad)\n"
        "    loss = model(x).sum()\n"
        "    loss.backward()\n"
        "    opt.zero_grad(set_to_none=False)\n"
    )
    _report_only("zero-grad-set-to-none", source, "`model.weight.grad` at line 2")


def test_backward_then_read_is_still_fixed_and_behaves_the_same():
    source = textwrap.dedent(
        """\
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        x = torch.randn(4, 3)
        for _ in range(2):
            for p in model.parameters():
                p.grad is not None and p.grad.zero_()
            model(x).sum().backward()
        for p in model.parameters():
            p.grad.zero_()
        model(x).sum().backward()
        result = [p.grad.clone() for p in model.parameters()]
        """
    )
    matches, fixed = _check("zero-grad-set-to-none", source)
    assert "model.zero_grad(set_to_none=True)\nmodel(x).sum().backward()" in fixed
    assert fixed.count("zero_grad") == 1
    before, after = _run(source)["result"], _run(fixed)["result"]
    assert all(a.equal(b) for a, b in zip(before, after))


@pytest.mark.parametrize("copies", [2, 3])
def test_adjacent_loops_over_the_same_module_give_one_call(copies):
    loop = "    for p in model.parameters():\n        p.grad.zero_()\n"
    source = "def step(model, x):\n" + loop * copies + "    model(x).sum().backward()\n"
    matches, fixed = _check("zero-grad-set-to-none", source)
    assert fixed == "def step(model, x):\n    model.zero_grad(set_to_none=True)\n    model(x).sum().backward()\n"
    assert sum(m.fixable for m in matches) == 1  # the repeats are reported, the first fix absorbs them
    assert not any(m.fixable for m in FIXERS["zero-grad-set-to-none"]().detect(fixed))


def test_adjacent_loops_fixed_program_runs():
    source = textwrap.dedent(
        """\
        import torch
        model = torch.nn.Linear(3, 2)
        model(torch.ones(1, 3)).sum().backward()
        for p in model.parameters():
            p.grad.zero_()
        for p in model.parameters():
            p.grad.zero_()
        model(torch.ones(1, 3)).sum().backward()
        result = [p.grad.clone() for p in model.parameters()]
        """
    )
    _, fixed = _check("zero-grad-set-to-none", source)
    assert fixed.count("model.zero_grad(set_to_none=True)") == 1 and "p.grad.zero_()" not in fixed
    assert all(a.equal(b) for a, b in zip(_run(source)["result"], _run(fixed)["result"]))


def test_loops_over_different_modules_are_not_merged():
    source = "for p in model.parameters():\n    p.grad.zero_()\nfor p in critic_model.parameters():\n    p.grad.zero_()\n"
    _, fixed = _check("zero-grad-set-to-none", source)
    assert fixed == "model.zero_grad(set_to_none=True)\ncritic_model.zero_grad(set_to_none=True)\n"


def test_suppressed_second_loop_keeps_the_first_report_only():
    # the second loop stays a zero-fill: it would crash on the None gradients the first fix leaves
    source = (
        "for p in model.parameters():\n"
        "    p.grad.zero_()\n"
        "for p in model.parameters():  # zoomer: ignore[zero-grad-not-none]\n"
        "    p.grad.zero_()\n"
    )
    _report_only("zero-grad-set-to-none", source, "would be None")


def test_later_zeroing_loop_after_backward_is_fixed_on_its_own():
    source = "for p in model.parameters():\n    p.grad.zero_()\nloss.backward()\nfor p in model.parameters():\n    p.grad.zero_()\n"
    _, fixed = _check("zero-grad-set-to-none", source)
    assert fixed == "model.zero_grad(set_to_none=True)\nloss.backward()\nmodel.zero_grad(set_to_none=True)\n"


def test_method_reading_gradients_called_through_self_is_a_read():
    source = textwrap.dedent(
        """\
        class Trainer:
            def log_grads(self):
                return [p.grad.norm() for p in self.model.parameters()]

            def step(self):
                for p in self.model.parameters():
                    p.grad.zero_()
                self.log_grads()
        """
    )
    _report_only("zero-grad-set-to-none", source, "self.log_grads()")


# --------------------------------------------------------------------------------------------
# 2. loop-item-sync: the log guard must not silence epoch logs or data records
# --------------------------------------------------------------------------------------------


def test_epoch_log_in_a_short_literal_loop_is_not_wrapped():
    source = (
        "for epoch in range(10):\n"
        "    loss = train_one_epoch(model)\n"
        '    logger.info("epoch %d loss %.3f", epoch, loss.item())\n'
    )
    _report_only("loop-item-sync", source, "once per epoch")


def test_record_written_to_a_file_is_not_wrapped():
    source = 'for step in range(100):\n    loss = train_step()\n    print(loss, file=open("losses.txt", "a"))\n'
    _report_only("loop-item-sync", source, "writes a record")


@pytest.mark.parametrize(
    ("header", "contains"),
    [
        ("for i in range(10):", "runs 10 times"),
        ("for i in range(0, 100, 2):", "runs 50 times"),
        ("for i in range(100):", "runs 100 times"),
        ("for i, b in enumerate(range(30)):", "runs 30 times"),
        ("for i, b in enumerate([b1, b2, b3]):", "runs 3 times"),
        ("for i in range(args.epochs):", "once per epoch"),
        ("for i, batch in enumerate(epoch_batches):", "once per epoch"),
    ],
)
def test_short_or_epoch_loops_are_reported(header, contains):
    source = f"{header}\n    loss = step()\n    print(loss.item())\n"
    _report_only("loop-item-sync", source, contains)


@pytest.mark.parametrize(
    "stmt",
    [
        "print(loss.item(), file=fh)",
        "print(loss.item(), **kw)",
        "fh.write(f'{loss.item()}\\n')",
        "csv_writer.writerow([step, loss.item()])",
        "json.dump({'loss': loss.item()}, fh)",
        "losses.append(loss.item())",
    ],
)
def test_data_writes_are_never_wrapped(stmt):
    source = f"for step in range(10000):\n    loss = train_step()\n    {stmt}\n"
    _report_only("loop-item-sync", source, ".item()")


@pytest.mark.parametrize(
    "stmt",
    [
        "print(loss.item())",
        "print(loss.item(), file=sys.stderr)",
        "logger.info('loss %s', loss.item())",
        "writer.add_scalar('loss', loss.item(), step)",
        "wandb.log({'loss': loss.item()})",
    ],
)
def test_logs_in_long_step_loops_are_still_wrapped(stmt):
    source = f"for step in range(10000):\n    loss = train_step()\n    {stmt}\n"
    _, fixed = _check("loop-item-sync", source)
    assert fixed == f"for step in range(10000):\n    loss = train_step()\n    if step % 100 == 0:\n        {stmt}\n"


def test_trip_count_is_compared_with_the_option():
    source = "for i in range(10):\n    loss = step()\n    print(loss.item())\n"
    _, fixed = _check("loop-item-sync", source, log_every=5)
    assert "if i % 5 == 0:" in fixed
    _report_only("loop-item-sync", source, "runs 10 times", log_every=10)


# --------------------------------------------------------------------------------------------
# 3. factory-on-device: random factories are reported by default
# --------------------------------------------------------------------------------------------

RANDOM_SOURCES = [
    "import torch\nnoise = torch.randn(8).to(device)\n",
    "import torch\nu = torch.rand(2, 3).cuda()\n",
    "import torch\nidx = torch.randint(0, 10, (4,)).to('cuda')\n",
]


@pytest.mark.parametrize("source", RANDOM_SOURCES)
def test_random_factories_are_report_only_by_default(source):
    _report_only("factory-on-device", source, "random=true")


@pytest.mark.parametrize("value", [True, "true", "1"])
@pytest.mark.parametrize("source", RANDOM_SOURCES)
def test_random_factories_are_rewritten_when_the_option_is_set(source, value):
    matches, fixed = _check("factory-on-device", source, random=value)
    assert fixed != source and "device=" in fixed and any(m.fixable for m in matches)


def test_default_option_is_off_and_docs_agree():
    cls = FIXERS["factory-on-device"]
    assert cls.OPTIONS["random"][0] is False and cls().options["random"] is False
    md = render()
    section = md.split("## factory-on-device\n", 1)[1].split("\n## ", 1)[0]
    assert "| `random` | `False` |" in section
    fixed_part = section.split("### Flagged and fixed", 1)[1].split("### Reported, not changed", 1)[0]
    reported_part = section.split("### Reported, not changed", 1)[1].split("### Left alone", 1)[0]
    assert "randn" not in fixed_part and "torch.randn(8).to(device)" in reported_part
    # what the docs list as reported is what the default fixer does
    assert cls().fix("import torch\nnoise = torch.randn(8).to(device)\n") == "import torch\nnoise = torch.randn(8).to(device)\n"
    assert "random=true" in cls.explanation


def test_deterministic_factories_are_still_rewritten_by_default():
    _, fixed = _check("factory-on-device", "import torch\nm = torch.zeros(3).to(device)\n")
    assert fixed == "import torch\nm = torch.zeros(3, device=device)\n"


# --------------------------------------------------------------------------------------------
# 4. matmul-precision: explicit FP32 / determinism choices are not overridden
# --------------------------------------------------------------------------------------------

SCRIPT = "import torch\n{setup}\nmodel = Net().cuda()\nloss = model(x).sum()\nloss.backward()\n"


@pytest.mark.parametrize(
    "setup",
    [
        "torch.backends.cudnn.allow_tf32 = False",
        "torch.use_deterministic_algorithms(True)",
        "torch.use_deterministic_algorithms(mode=args.deterministic)",
        "torch.backends.cudnn.deterministic = True",
        "import os\nos.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'",
        "import os\nos.environ.setdefault('NVIDIA_TF32_OVERRIDE', '0')",
        "from torch.backends.cuda import matmul as mm\nmm.allow_tf32 = False",
        "setattr(torch.backends.cudnn, 'allow_tf32', False)",
        "ctx = torch.backends.cudnn.flags(enabled=True, allow_tf32=False)",
        "ctx = torch.backends.cudnn.flags(enabled=True, deterministic=True)",
        # a function of the file sets TF32 flags; it runs after the insertion point
        "def setup_precision():\n    torch.backends.cudnn.allow_tf32 = True\nsetup_precision()",
        "def setup_precision(cfg):\n    torch.backends.cudnn.allow_tf32 = cfg.tf32\nsetup_precision(cfg)",
    ],
)
def test_explicit_fp32_or_determinism_choice_is_report_only(setup):
    _report_only("matmul-precision", SCRIPT.format(setup=setup), "not changed")


@pytest.mark.parametrize(
    "setup",
    [
        "torch.backends.cuda.matmul.allow_tf32 = False",
        'torch.backends.cuda.matmul.fp32_precision = "ieee"',
        'fp32_precision = "ieee"',
        "def setup_precision():\n    torch.set_float32_matmul_precision('highest')\nsetup_precision()",
        "def setup_precision():\n    torch.backends.cuda.matmul.allow_tf32 = False\nsetup_precision()",
    ],
)
def test_matmul_precision_set_by_the_file_is_left_alone(setup):
    source = SCRIPT.format(setup=setup)
    fixer = FIXERS["matmul-precision"]()
    assert fixer.detect(source) == [] and fixer.fix(source) == source


@pytest.mark.parametrize(
    "setup",
    [
        "torch.backends.cudnn.allow_tf32 = True",
        "torch.use_deterministic_algorithms(False)",
        "torch.backends.cudnn.benchmark = True",
        "def setup():\n    torch.backends.cudnn.benchmark = True\nsetup()",
    ],
)
def test_unrelated_or_tf32_enabling_settings_still_get_the_call(setup):
    source = SCRIPT.format(setup=setup)
    _, fixed = _check("matmul-precision", source)
    assert fixed == source.replace("import torch\n", 'import torch\ntorch.set_float32_matmul_precision("high")\n', 1)
